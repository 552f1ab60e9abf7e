"""The loop machine: the YAML table, pure guards, the transitions evaluator, diagrams (no I/O)."""

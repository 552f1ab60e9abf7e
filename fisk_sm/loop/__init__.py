"""The run: phase actions, entry hooks, the harness, fingerprints and sessions."""

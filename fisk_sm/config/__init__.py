"""Configuration: frozen attrs classes for agent.yaml and one-line errors naming file and field."""

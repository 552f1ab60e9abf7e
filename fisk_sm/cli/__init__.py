"""The `fisk-sm` command line (run, session, info, diagram, fake-api)."""

from fisk_sm.cli.main import main

__all__ = ["main"]

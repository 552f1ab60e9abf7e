"""The `fisk-sm` command line (run, step, session, chat, supervise, ctl, ...).

`main` is the console script's entry point; it imports the chosen command's module alone.
"""

from fisk_sm.cli.main import main

__all__ = ["main"]

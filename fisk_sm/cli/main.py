"""The `fisk-sm` command: run an agent, draw the loop, serve the fake Messages API.

Bad input never shows a traceback (unless `--debug`): it prints one line naming the file or field
(a refused resume lists each change) and exits 2. A run exits 0 when it completed or was
suspended, 1 when it ended otherwise, 74 when the disk failed it (the journal is intact up to its
last record) and 130 when a second signal aborted it. Anything else is a bug in fisk-sm, not in
the input: one line says so and the command exits 70 (`--debug` shows the traceback). A stdout
whose reader has gone (`fisk-sm session ls | head -1`) ends any command quietly, exit 0, and a
closed or broken stderr never stops one (`fisk_sm.cli.streams`).

Starting costs only what the chosen command uses: this module imports the standard library
alone, finds the command in argv first, and imports that command's module and no other one
(`fisk-sm --help` lists the commands from the static table `COMMANDS`, importing none of them).
`fisk-sm ctl` in particular runs on the standard library and its own modules.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fisk_sm.cli.helpformat import HelpFormatter
from fisk_sm.cli.streams import guard_standard_streams, silence_stdout, stdout_gone
from fisk_sm.operator.sanitize import say

#: `typing.TYPE_CHECKING` without importing typing, some 4 ms `fisk-sm ctl` never needs
#: (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence
    from typing import Any

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

EXIT_USAGE = 2
#: An internal error (a bug), as in sysexits.h.
EXIT_SOFTWARE = 70
#: The disk failed (EX_IOERR), as `fisk_sm.cli.run.EXIT_IO`.
EXIT_IO = 74
#: Stdout's reader left before the output ended (`| head`): a quiet success.
EXIT_PIPE = 0


class Command:
    """A command of `fisk-sm`: where its parser and its handler live, its line in `--help`.

    A plain class, not a `typing.NamedTuple`: this module must not import typing."""

    __slots__ = ("handler", "help", "parser")

    def __init__(self, parser: str, handler: str, help: str) -> None:
        #: "module:function" adding the command's parser to the subparsers.
        self.parser = parser
        #: "module:function" running the parsed command, returning the exit code.
        self.handler = handler
        #: The one-line help `fisk-sm --help` shows (the same as the parser's own).
        self.help = help

    def __repr__(self) -> str:
        return f"Command({self.parser!r}, {self.handler!r}, {self.help!r})"


_CMD = "fisk_sm.cli.commands"
#: Every command, in the order `--help` lists them. Only the chosen one's modules are imported.
COMMANDS: dict[str, Command] = {
    "run": Command(
        f"{_CMD}:add_run_parser", "fisk_sm.cli.run:cmd_run", "run an agent to its final answer"
    ),
    "step": Command(
        f"{_CMD}:add_step_parser",
        "fisk_sm.cli.step:cmd_step",
        "step a run interactively, a transition at a time",
    ),
    "session": Command(
        f"{_CMD}:add_session_parser",
        "fisk_sm.cli.session:cmd_session",
        "list, show, remove or fork checkpointed sessions",
    ),
    "info": Command(
        f"{_CMD}:add_info_parser",
        "fisk_sm.cli.info:cmd_info",
        "describe an agent: model, tools (kind, tags, gated), backends",
    ),
    "diagram": Command(
        f"{_CMD}:add_diagram_parser",
        f"{_CMD}:cmd_diagram",
        "draw the loop's state machine, or the path a session took through it",
    ),
    "chat": Command(
        "fisk_sm.cli.chat:add_chat_parser",
        "fisk_sm.cli.chat:cmd_chat",
        "chat with an agent: follow-up prompts in one conversation",
    ),
    "tui": Command(
        "fisk_sm.tui.command:add_tui_parser",
        "fisk_sm.tui.command:cmd_tui",
        "the full-screen UI: run, chat, step or operate in one terminal app",
    ),
    "mcp-serve": Command(
        "fisk_sm.mcpserve.command:add_mcp_serve_parser",
        "fisk_sm.mcpserve.command:cmd_mcp_serve",
        "serve an agent as an MCP tool (ask), its sessions durable chats",
    ),
    "report": Command(
        "fisk_sm.cli.report:add_report_parser",
        "fisk_sm.cli.report:cmd_report",
        "write a self-contained HTML report of a session",
    ),
    "supervise": Command(
        "fisk_sm.cli.supervise:add_supervise_parser",
        "fisk_sm.cli.supervise:cmd_supervise",
        "drive many checkpointed runs, with an HTTP control API and a dashboard",
    ),
    "ctl": Command(
        "fisk_sm.cli.ctl:add_ctl_parser",
        "fisk_sm.cli.ctl:cmd_ctl",
        "control a running supervisor (submit, ls, show, approve, events, ...)",
    ),
    "tool-host": Command(
        "fisk_sm.cli.toolhost:add_tool_host_parser",
        "fisk_sm.cli.toolhost:cmd_tool_host",
        "serve the tools of a YAML file to remote agents over NATS",
    ),
    "fake-api": Command(
        f"{_CMD}:add_fake_api_parser",
        f"{_CMD}:cmd_fake_api",
        "serve a scripted fake Messages API on loopback",
    ),
}

#: Commands that run no state machine and start on the bare standard library (a client): they
#: skip the logging set-up in `main`.
NO_MACHINE = frozenset({"ctl"})

#: What bad input raises, as (module, class): exit 2 with one line. A class is looked up only
#: in a module already imported (a module never imported raised nothing), so that mapping an
#: error imports nothing the command did not.
BAD_INPUT = (
    ("fisk_sm.config.errors", "ConfigError"),
    ("fisk_sm.journal.base", "JournalError"),
    ("fisk_sm.loop.fingerprint", "ResumeRefused"),
    ("fisk_sm.tools.base", "ToolLoadError"),
    ("fisk_sm.testing.script", "ScriptError"),
    ("fisk_sm.machine.table", "TableError"),
    ("fisk_sm.machine.diagram", "DiagramError"),
    ("fisk_sm.cli.run", "UsageError"),
)
#: What the disk raises (besides OSError): exit 74.
IO_ERRORS = (("fisk_sm.journal.filejournal", "JournalIOError"),)


def _load(where: str) -> Callable[..., Any]:
    """The function "module:function" names, importing its module."""
    module, _, name = where.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


def _raised(exc: BaseException, classes: Sequence[tuple[str, str]]) -> bool:
    """Whether `exc` is an instance of one of `classes` ((module, class) pairs)."""
    for module, name in classes:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: the full parser of each command in `load` (all when None), and for
    the others a line in the command list, without importing their modules."""
    parser = argparse.ArgumentParser(
        prog="fisk-sm",
        description="Run an Anthropic tool-using agent loop as an explicit state machine.",
        formatter_class=HelpFormatter,  # sized without importing shutil
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        if load is None or name in load:
            _load(command.parser)(sub)
        else:
            sub.add_parser(name, help=command.help, add_help=False)
    return parser


def chosen(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first argument that is not an option), if it is one."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fisk-sm` console script."""
    guard_standard_streams()  # before anything can write, open a file or take a signal
    argv = sys.argv[1:] if argv is None else list(argv)
    name = chosen(argv)
    args = build_parser({name} if name else ()).parse_args(argv)
    if args.command not in NO_MACHINE:
        import logging

        # The application may set logging (the library never does): `transitions` reports every
        # transition at INFO, which would drown the line UI under a verbose root logger.
        logging.getLogger("transitions").setLevel(logging.WARNING)
    try:
        code = int(_load(COMMANDS[args.command].handler)(args))
        sys.stdout.flush()  # here, where a reader that left is told from a failing disk
        return code
    except KeyboardInterrupt:
        say("fisk-sm: interrupted")
        return 130
    # A boundary: every command's failure ends here as one line and an exit code by its kind
    # (the disk, the input, a bug), never a traceback unless --debug asks for one.
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and stdout_gone():
            silence_stdout()  # `| head`: the reader has had enough; no error, as `ctl` does
            return EXIT_PIPE
        if args.debug:
            raise
        if isinstance(exc, OSError) or _raised(exc, IO_ERRORS):  # the disk, not the input
            say(f"fisk-sm: {exc}")
            return EXIT_IO
        if _raised(exc, BAD_INPUT):
            say(f"fisk-sm: {exc}")
            return EXIT_USAGE
        # A bug: say so, never as if the input were bad.
        say(f"fisk-sm: internal error: {type(exc).__name__}: {exc} (--debug shows the traceback)")
        return EXIT_SOFTWARE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

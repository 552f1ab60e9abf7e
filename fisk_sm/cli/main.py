"""The `fisk-sm` command: run an agent, draw the loop, serve the fake Messages API.

Bad input never shows a traceback (unless `--debug`): it prints one line naming the file or field
(a refused resume lists each change) and exits 2. A run exits 0 when it completed or was
suspended, 1 when it ended otherwise, 74 when the disk failed it (the journal is intact up to its
last record) and 130 when a second signal aborted it. Anything else is a bug in fisk-sm, not in
the input: one line says so and the command exits 70 (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from fisk_sm.cli.chat import add_chat_parser, cmd_chat
from fisk_sm.cli.ctl import add_ctl_parser, cmd_ctl
from fisk_sm.cli.info import cmd_info
from fisk_sm.cli.report import add_report_parser, cmd_report
from fisk_sm.cli.run import EXIT_IO, UsageError, add_run_arguments, cmd_run
from fisk_sm.cli.session import cmd_session, session_paths
from fisk_sm.cli.step import HELP as STEP_HELP
from fisk_sm.cli.step import cmd_step
from fisk_sm.cli.supervise import add_supervise_parser, cmd_supervise
from fisk_sm.cli.toolhost import add_tool_host_parser, cmd_tool_host
from fisk_sm.config.agent import ConfigError
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import JournalIOError
from fisk_sm.loop.fingerprint import ResumeRefused
from fisk_sm.machine.diagram import FORMATS, DiagramError, draw
from fisk_sm.machine.table import TableError, load_table
from fisk_sm.operator.sanitize import say
from fisk_sm.testing import ScriptError, serve
from fisk_sm.tools.base import ToolLoadError

__all__ = ["main"]

EXIT_USAGE = 2
#: An internal error (a bug), as in sysexits.h.
EXIT_SOFTWARE = 70
#: What bad input raises: exit 2 with one line.
BAD_INPUT = (
    ConfigError,
    JournalError,
    ResumeRefused,
    ToolLoadError,
    ScriptError,
    TableError,
    DiagramError,
    UsageError,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with help for every command."""
    parser = argparse.ArgumentParser(
        prog="fisk-sm",
        description="Run an Anthropic tool-using agent loop as an explicit state machine.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run an agent to its final answer",
        description="Run the agent in agent.yaml on PROMPT. The final answer alone goes to"
        " stdout; tool calls, warnings and the summary go to stderr.",
    )
    add_run_arguments(run)
    run.add_argument("--trace", action="store_true", help="show every state entered on stderr")
    run.add_argument(
        "--events", type=Path, metavar="FILE", help="also write every event as JSON Lines to FILE"
    )

    step = sub.add_parser(
        "step",
        help="step a run interactively, a transition at a time",
        description="Build the run as `run` does (a new run, --checkpoint, --resume ID, ...) and"
        " step it: each stop shows the conversation's tail and what the next step will do.",
        epilog="commands:\n" + STEP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(step)

    session = sub.add_parser(
        "session",
        help="list, show, remove or fork checkpointed sessions",
        description="Work with checkpointed sessions: those of the file backend under"
        " --state-dir; else of the backend -c agent.yaml configures (its sessions directory, or"
        " its JetStream stream); else of $XDG_STATE_HOME/fisk-sm/runs.",
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--state-dir", type=Path, help="the sessions directory")
    where.add_argument(
        "-c", "--config", type=Path, help="use the sessions backend agent.yaml configures"
    )
    ssub = session.add_subparsers(dest="session_command", required=True, metavar="ACTION")
    ls = ssub.add_parser("ls", parents=[where], help="list sessions, newest first")
    ls.add_argument("--json", action="store_true", help="as JSON")
    show = ssub.add_parser("show", parents=[where], help="show one session")
    show.add_argument("id")
    show.add_argument("--transcript", action="store_true", help="also the conversation")
    rm = ssub.add_parser("rm", parents=[where], help="delete a session")
    rm.add_argument("id")
    fork = ssub.add_parser(
        "fork",
        parents=[where],
        help="copy the first SEQ records of a session into a new one",
        description="Time travel: a new session NEW whose journal is the first SEQ records of"
        " ID; resume it with `fisk-sm run --resume NEW`.",
    )
    fork.add_argument("id")
    fork.add_argument("--at", type=int, required=True, metavar="SEQ", help="records to keep")
    fork.add_argument("--name", required=True, metavar="NEW", help="the new session id")
    ssub.add_parser(
        "init-stream",
        parents=[where],
        help="create the JetStream stream that sessions.backend jetstream names (-c agent.yaml)",
    )

    info = sub.add_parser(
        "info",
        help="describe an agent: model, tools (kind, tags, gated), backends",
        description="Describe agent.yaml without calling the model: the model section, the"
        " tools offered (name, kind, description, tags, gated or not) and the session and"
        " memory backends.",
    )
    info.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml")

    diagram = sub.add_parser(
        "diagram",
        help="draw the loop's state machine, or the path a session took through it",
        description="Render states/agent_loop.yaml as a diagram (to stdout unless -o). With"
        " --session, draw the path that session took, derived from its journal: visited states"
        " filled, each fired exit with how often it fired, the current or final state marked;"
        " --compare adds a second session (counts A/B, states only one visited coloured).",
    )
    diagram.add_argument("--format", choices=FORMATS, default="mermaid", help="default: mermaid")
    diagram.add_argument("-o", "--output", type=Path, help="write to this file")
    diagram.add_argument("--session", metavar="ID", help="draw this session's path")
    diagram.add_argument("--compare", metavar="ID2", help="with --session: and this one's")
    diagram.add_argument("--state-dir", type=Path, help="the sessions directory")
    diagram.add_argument("-c", "--config", type=Path, help="take the directory from agent.yaml")
    add_chat_parser(sub)
    add_report_parser(sub)
    add_supervise_parser(sub)
    add_ctl_parser(sub)
    add_tool_host_parser(sub)

    fake = sub.add_parser(
        "fake-api",
        help="serve a scripted fake Messages API on loopback",
        description="Serve scripted replies (a YAML or JSON list, or a mapping of replies:"
        " and conversations:) as the Anthropic Messages API on 127.0.0.1, for offline demos"
        " and tests. Point llm.base_url at it.",
    )
    fake.add_argument(
        "--script",
        required=True,
        help="the reply script (YAML or JSON: a list, or replies: and conversations:)",
    )
    fake.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    fake.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    return parser


def cmd_diagram(args: argparse.Namespace) -> int:
    """`fisk-sm diagram [--session ID [--compare ID2]]`."""
    if args.compare and not args.session:
        raise UsageError("--compare needs --session")
    ids = [i for i in (args.session, args.compare) if i]
    paths = session_paths(args.state_dir, args.config, ids) if ids else []
    data = draw(load_table(), args.format, paths)
    if args.output:
        args.output.write_bytes(data)
    elif args.format == "png":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
    else:
        sys.stdout.write(data.decode("utf-8"))
    return 0


def cmd_fake_api(args: argparse.Namespace) -> int:
    """`fisk-sm fake-api`."""
    return serve(args.script, host=args.host, port=args.port)


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "session": cmd_session,
    "step": cmd_step,
    "info": cmd_info,
    "diagram": cmd_diagram,
    "report": cmd_report,
    "fake-api": cmd_fake_api,
    "supervise": cmd_supervise,
    "ctl": cmd_ctl,
    "tool-host": cmd_tool_host,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fisk-sm` console script."""
    # The application may set logging (the library never does): `transitions` reports every
    # transition at INFO, which would drown the line UI under a verbose root logger.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        say("fisk-sm: interrupted")
        return 130
    except (JournalIOError, OSError) as exc:  # the disk, not the input: a code of its own
        if args.debug:
            raise
        say(f"fisk-sm: {exc}")
        return EXIT_IO
    except BAD_INPUT as exc:
        if args.debug:
            raise
        say(f"fisk-sm: {exc}")
        return EXIT_USAGE
    except Exception as exc:  # a bug: say so, never as if the input were bad
        if args.debug:
            raise
        say(f"fisk-sm: internal error: {type(exc).__name__}: {exc} (--debug shows the traceback)")
        return EXIT_SOFTWARE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

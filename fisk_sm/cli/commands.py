"""The parsers of the commands whose modules do not build their own (run, step, session, info,
diagram, fake-api), and the small `diagram` and `fake-api` commands.

Each function imports what its command needs when it is called, never at import time: the
`fisk-sm` entry point builds the parser of the chosen command alone (see `fisk_sm.cli.main`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "add_diagram_parser",
    "add_fake_api_parser",
    "add_info_parser",
    "add_run_parser",
    "add_session_parser",
    "add_step_parser",
    "cmd_diagram",
    "cmd_fake_api",
]


def add_run_parser(sub: Any) -> None:
    """`fisk-sm run`."""
    from fisk_sm.cli.run import add_run_arguments

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


def add_step_parser(sub: Any) -> None:
    """`fisk-sm step`."""
    from fisk_sm.cli.run import add_run_arguments
    from fisk_sm.cli.step import HELP

    step = sub.add_parser(
        "step",
        help="step a run interactively, a transition at a time",
        description="Build the run as `run` does (a new run, --checkpoint, --resume ID, ...) and"
        " step it: each stop shows the conversation's tail and what the next step will do.",
        epilog="commands:\n" + HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(step)


def add_session_parser(sub: Any) -> None:
    """`fisk-sm session ls|show|rm|fork|init-stream`."""
    session = sub.add_parser(
        "session",
        help="list, show, remove or fork checkpointed sessions",
        description="Work with checkpointed sessions: those of the file backend under"
        " --state-dir; else of the backend -c agent.yaml configures (its sessions directory, or"
        " its JetStream stream); else of ./agent.yaml's backend when the current directory has"
        " one; else of $XDG_STATE_HOME/fisk-sm/runs. `ls` names the store on stderr.",
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


def add_info_parser(sub: Any) -> None:
    """`fisk-sm info`."""
    info = sub.add_parser(
        "info",
        help="describe an agent: model, tools (kind, tags, gated), backends",
        description="Describe agent.yaml without calling the model: the model section, the"
        " tools offered (name, kind, description, tags, gated or not) and the session and"
        " memory backends.",
    )
    info.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml")


def add_diagram_parser(sub: Any) -> None:
    """`fisk-sm diagram`."""
    from fisk_sm.machine.diagram import FORMATS

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
    diagram.add_argument(
        "--table",
        type=Path,
        metavar="YAML",
        help="draw this table instead of the loop's (an extended copy of states/agent_loop.yaml;"
        " checked as a run would load it)",
    )


def add_fake_api_parser(sub: Any) -> None:
    """`fisk-sm fake-api`."""
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


def cmd_diagram(args: argparse.Namespace) -> int:
    """`fisk-sm diagram [--session ID [--compare ID2]]`."""
    from fisk_sm.cli.run import UsageError
    from fisk_sm.cli.session import session_paths
    from fisk_sm.machine.diagram import draw
    from fisk_sm.machine.table import load_table

    if args.compare and not args.session:
        raise UsageError("--compare needs --session")
    if args.table and args.session:
        # a session's path on another table is replayed with that table's guard functions,
        # which only Python has: fisk_sm.machine.path.session_path(records, table, guards)
        raise UsageError("--table draws a table alone; not with --session")
    ids = [i for i in (args.session, args.compare) if i]
    paths = session_paths(args.state_dir, args.config, ids) if ids else []
    data = draw(load_table(args.table), args.format, paths)
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
    from fisk_sm.testing import serve

    return serve(args.script, host=args.host, port=args.port)

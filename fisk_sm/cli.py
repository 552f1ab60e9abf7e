"""The `fisk-sm` command: run an agent, draw the loop, serve the fake Messages API.

Bad input never shows a traceback (unless `--debug`): it prints one line naming the file or field
and exits 2. A run exits 0 when it completed or was suspended, and 1 when it ended otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from fisk_sm.config import ConfigError, load_config
from fisk_sm.diagram import FORMATS, DiagramError, render
from fisk_sm.events import Events, Fanout
from fisk_sm.lineui import LineUI
from fisk_sm.logevents import JsonLinesEvents
from fisk_sm.run import Run
from fisk_sm.table import TableError, load_table
from fisk_sm.testing import ScriptError, serve
from fisk_sm.tools import ToolLoadError

__all__ = ["main"]

EXIT_USAGE = 2
DEFAULT_PROMPT = "assist the user"


class UsageError(Exception):
    """Bad flags or arguments; exit 2 with one line."""


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
    run.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml to run")
    run.add_argument("--trace", action="store_true", help="show every state entered on stderr")
    run.add_argument(
        "--events", type=Path, metavar="FILE", help="also write every event as JSON Lines to FILE"
    )
    run.add_argument("prompt", nargs="*", help=f"the prompt (default: {DEFAULT_PROMPT!r})")

    diagram = sub.add_parser(
        "diagram",
        help="draw the loop's state machine",
        description="Render states/agent_loop.yaml as a diagram (to stdout unless -o).",
    )
    diagram.add_argument("--format", choices=FORMATS, default="mermaid", help="default: mermaid")
    diagram.add_argument("-o", "--output", type=Path, help="write to this file")

    fake = sub.add_parser(
        "fake-api",
        help="serve a scripted fake Messages API on loopback",
        description="Serve scripted replies (YAML or JSON list) as the Anthropic Messages API on"
        " 127.0.0.1, for offline demos and tests. Point llm.base_url at it.",
    )
    fake.add_argument("--script", required=True, help="the reply script (YAML or JSON)")
    fake.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    fake.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    """`fisk-sm run`."""
    config = load_config(args.config)
    prompt = " ".join(args.prompt).strip() or DEFAULT_PROMPT
    sinks: list[Events] = [LineUI(trace=args.trace)]
    stream = None
    if args.events:
        stream = args.events.open("a", encoding="utf-8")
        sinks.append(JsonLinesEvents(stream))
    try:
        run = Run.create(config, prompt, events=Fanout(tuple(sinks)))
        state = asyncio.run(run.run())
    finally:
        if stream is not None:
            stream.close()
    return 0 if state in ("completed", "suspended") else 1


def cmd_diagram(args: argparse.Namespace) -> int:
    """`fisk-sm diagram`."""
    text = render(load_table(), args.format)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_fake_api(args: argparse.Namespace) -> int:
    """`fisk-sm fake-api`."""
    return serve(args.script, host=args.host, port=args.port)


COMMANDS = {"run": cmd_run, "diagram": cmd_diagram, "fake-api": cmd_fake_api}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fisk-sm` console script."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("fisk-sm: interrupted", file=sys.stderr)
        return 130
    except (
        ConfigError,
        ToolLoadError,
        ScriptError,
        TableError,
        DiagramError,
        UsageError,
        OSError,
    ) as exc:
        if args.debug:
            raise
        print(f"fisk-sm: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

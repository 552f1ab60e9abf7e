"""`fisk-sm tool-host`: serve the Python and exec tools of a YAML file over NATS request/reply.

The file is read like agent.yaml (its `tools:` list, `identity`, `harness.work_dir`); an `llm:`
section is not needed, since a tool host never calls a model. The protocol is that of
`fisk_sm.tools.remote`: an agent lists the host in `remote_tools: [{alias, subject}]`.

SIGTERM or SIGINT stops it cleanly: it stops taking calls, lets the calls in flight finish (up to
--grace seconds, then cancels them: their callers get an error reply, or none and then their
`call_timeout`), drains the connection and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs
import yaml

from fisk_sm.cli.run import SIGNALS, UsageError
from fisk_sm.config.agent import AgentConfig, ConfigError, parse_config
from fisk_sm.config.errors import one_line
from fisk_sm.config.names import SUBJECT_RE
from fisk_sm.loop.harness import DEFAULT_NATS_URL, configured_tools
from fisk_sm.operator.sanitize import say

__all__ = ["add_tool_host_parser", "cmd_tool_host", "load_tools_file"]

#: Exit status when the NATS server cannot be reached or the connection is lost.
EXIT_UNAVAILABLE = 69

DESCRIPTION = """\
Serve the Python and exec tools declared in FILE (the `tools:` list of agent.yaml; `identity`
and `harness.work_dir` are honoured, `llm:` is not needed) over NATS request/reply, so that
agents on other hosts can call them as remote tools:

  remote_tools: [{alias: ops, subject: SUBJECT}]
  nats: {url: URL}

Requests: SUBJECT.list answers the tool definitions, SUBJECT.call.<tool> runs one call.
Prints one line to stderr when it is ready ("fisk-sm tool-host: serving ..."). Several hosts may
serve one subject with --queue (each call goes to one of them).

SIGTERM/SIGINT: stop taking calls, let the calls in flight finish (up to --grace seconds; a
cancelled call's caller gets an error, or nothing and then its call_timeout), drain, exit 0.
Exit 2 for a bad file or argument, 69 if the NATS server cannot be reached or the connection
is lost (it does not reconnect: run it under a service manager that restarts it).
"""


def add_tool_host_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `fisk-sm tool-host`."""
    parser = sub.add_parser(
        "tool-host",
        help="serve the tools of a YAML file to remote agents over NATS",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-c", "--config", required=True, type=Path, metavar="FILE", help="the tools file"
    )
    parser.add_argument(
        "--nats",
        metavar="URL",
        default=os.environ.get("NATS_URL") or DEFAULT_NATS_URL,
        help=f"the NATS server (default: $NATS_URL, else {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--subject", metavar="S", help="the subject prefix (default: tools.<identity>)"
    )
    parser.add_argument("--queue", default="", metavar="GROUP", help="a NATS queue group")
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long calls in flight may finish at shutdown (default 10)",
    )


def load_tools_file(path: Path) -> AgentConfig:
    """The tools file at `path`, checked as agent.yaml is (without requiring `llm:`)."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(source, "(file)", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "(file)", f"not valid UTF-8 ({exc.reason})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, "(yaml)", f"invalid YAML: {one_line(exc)}") from None
    if isinstance(data, Mapping) and "llm" not in data:
        data = {**data, "llm": {"model": "tool-host"}}  # never called: a placeholder
    config = parse_config(data, source=source, env={})
    if not config.tools:
        raise ConfigError(source, "tools", "no tools to serve")
    return attrs.evolve(config, path=path.absolute())


def cmd_tool_host(args: argparse.Namespace) -> int:
    """`fisk-sm tool-host -c tools.yaml --nats URL [--subject S]`."""
    config = load_tools_file(args.config)
    subject = args.subject or f"tools.{config.identity}"
    if not SUBJECT_RE.fullmatch(subject):
        raise UsageError(f"--subject {subject!r}: not a NATS subject without wildcards")
    if args.grace < 0:
        raise UsageError(f"--grace {args.grace:g}: must not be negative")
    return asyncio.run(_serve(args, config, subject))


async def _serve(args: argparse.Namespace, config: AgentConfig, subject: str) -> int:
    from fisk_sm.tools.remote import connect_nats, serve_tools  # nats is needed only here

    tools = configured_tools(config)  # imports the tool modules: a bad one is a ConfigError
    stop = asyncio.Event()
    lost: list[str] = []

    async def closed() -> None:
        if not stop.is_set():
            lost.append("the connection to the NATS server was closed")
            stop.set()

    try:  # no reconnects: a lost server ends the host (exit 69) for its supervisor to restart
        nc = await connect_nats(args.nats, closed_cb=closed)
    except ConnectionError as exc:
        say(f"fisk-sm tool-host: {exc}")
        return EXIT_UNAVAILABLE
    loop = asyncio.get_running_loop()
    for signum in SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    try:
        host = await serve_tools(nc, subject, tools, agent=config.identity, queue=args.queue)
        names = ", ".join(t.name for t in tools)
        say(
            f"fisk-sm tool-host: serving {len(tools)} tools ({names}) as {config.identity!r}"
            f" on {subject} at {args.nats}"
        )
        await stop.wait()
        if not lost:
            say(f"fisk-sm tool-host: stopping ({host.calls} calls in flight)")
        cancelled = await host.stop(grace=args.grace)
        if not nc.is_closed:
            await nc.drain()  # the replies of the calls that finished go out first
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)
        if not nc.is_closed:
            await nc.close()
    if lost:
        say(f"fisk-sm tool-host: {lost[0]}")
        return EXIT_UNAVAILABLE
    say(f"fisk-sm tool-host: stopped ({cancelled} calls cancelled)")
    if cancelled:
        # A cancelled sync tool's worker thread would hold the interpreter's exit.
        sys.stderr.flush()
        os._exit(0)
    return 0

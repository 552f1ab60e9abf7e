"""`fisk-sm supervise`: many checkpointed runs and their control API, in one process.

The first SIGINT or SIGTERM shuts down: every run is suspended now (a model call in flight is
cancelled and nothing of it journaled; a tool in flight finishes), the runs are marked for the
next start, and the process exits 0. A second signal aborts at once (exit 130): every record
already journaled stays, and the next start resumes the runs from their journals.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from fisk_sm.cli.run import SIGNALS, UsageError, store_for
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.api import build_app
from fisk_sm.supervisor.server import (
    DEFAULT_LISTEN,
    ListenError,
    bind,
    check_token_rule,
    parse_listen,
    serve_app,
    url_of,
    write_url,
)

__all__ = ["add_supervise_parser", "cmd_supervise"]

EXIT_ABORTED = 130
TOKEN_ENV = "FISK_SM_TOKEN"

DESCRIPTION = """\
Drive many checkpointed runs of agent.yaml on one event loop, controlled over HTTP.

Runs are submitted through the control API (or `fisk-sm ctl submit`); every run is a session in
the state directory (--state-dir, else the config's sessions directory, else the XDG default),
so `fisk-sm session ls` lists them too. At most --concurrency model calls and tools are in
flight at once; runs parked for an approval, queued or between steps hold no slot. All runs
share one SDK client.

The control API (JSON, OpenAPI at /openapi.json, live dashboard at /) listens on --listen,
127.0.0.1:8765 by default (port 0: any free port). The URL is printed to stderr as
"fisk-sm supervise: listening on URL" and written to STATE_DIR/supervisor.url. A non-loopback
address requires a token (--token-file, or $FISK_SM_TOKEN); with a token, every request needs
"Authorization: Bearer TOKEN" (or ?token= for the dashboard and the event stream) and gets 401
without it.

Gated tools park their run at the approval desk (status "parked") until an operator answers
once, always or deny through the API; a parked run survives a restart.

SIGINT/SIGTERM: every run suspends now (a model call in flight is cancelled, a tool finishes),
and the process exits 0. On the next start, the runs the shutdown suspended (or whose process
died) are resumed; runs an operator suspended or aborted, and parked runs, are only listed. A
second signal aborts at once (exit 130).
"""


def add_supervise_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `fisk-sm supervise`."""
    parser = sub.add_parser(
        "supervise",
        help="drive many checkpointed runs, with an HTTP control API and a dashboard",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml")
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"the control API's address (default {DEFAULT_LISTEN}; port 0: any free port)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=16,
        metavar="N",
        help="model calls and tools in flight at once (default 16)",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="the sessions directory (default: the config's, else XDG)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"the API token, read from FILE (default: ${TOKEN_ENV}, if set)",
    )


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            path: Path = args.token_file
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"--token-file: {args.token_file}: {exc.strerror or exc}") from None
        if not token:
            raise UsageError(f"--token-file: {args.token_file} is empty")
        return token
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    return from_env or None


def cmd_supervise(args: argparse.Namespace) -> int:
    """Run the supervisor until a signal."""
    if args.concurrency < 1:
        raise UsageError(f"--concurrency: must be at least 1, not {args.concurrency}")
    token = _token(args)
    try:
        host, port = parse_listen(args.listen)
        check_token_rule(host, token)
    except ListenError as exc:
        raise UsageError(str(exc)) from None
    config = load_config(args.config)
    store = store_for(args.state_dir, config)
    try:
        sock = bind(host, port)
    except ListenError as exc:
        raise UsageError(str(exc)) from None
    try:
        return asyncio.run(_main(args, config, store, sock, token))
    finally:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


async def _main(
    args: argparse.Namespace,
    config: AgentConfig,
    store: FileStore,
    sock: socket.socket,
    token: str | None,
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            say("fisk-sm supervise: suspending every run (signal again to abort)")
            stop.set()
        else:
            say("fisk-sm supervise: aborted; every completed step is in the journals")
            sys.stderr.flush()
            os._exit(EXIT_ABORTED)

    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    await asyncio.to_thread(store.ensure_directory)
    supervisor = Supervisor(config, store, concurrency=args.concurrency)
    resumed = await supervisor.start()
    server, serving = await serve_app(build_app(supervisor, token), sock)
    url = url_of(sock)
    await asyncio.to_thread(write_url, store.directory / "supervisor.url", url)
    say(f"fisk-sm supervise: listening on {url}")
    if resumed:
        say(f"fisk-sm supervise: resumed {len(resumed)} run(s)")
    await stop.wait()
    marked = await supervisor.shutdown()
    server.should_exit = True
    await serving
    say(f"fisk-sm supervise: stopped; {len(marked)} run(s) will resume on the next start")
    return 0

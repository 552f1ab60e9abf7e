"""`fisk-sm supervise`: many checkpointed runs and their control API, in one process.

The first SIGINT or SIGTERM shuts down: every run is suspended now (a model call in flight is
cancelled and nothing of it journaled; a tool in flight finishes), the runs are marked for the
next start, and the process exits 0. A second signal aborts at once (exit 130): every record
already journaled stays, and the next start resumes the runs from their journals.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fisk_sm.cli.run import SIGNALS, UsageError, store_for, telemetry_export
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.api import ControlApp, build_app
from fisk_sm.supervisor.api.server import (
    DEFAULT_LISTEN,
    ListenError,
    bind,
    check_token_rule,
    parse_allow_host,
    parse_listen,
    serve_app,
    served_hosts,
    url_of,
    write_url,
)
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.host.control import LocalControl
from fisk_sm.supervisor.host.eventloop import CHOICES, ENV, LoopUnavailable, loop_name, run, settle
from fisk_sm.supervisor.host.registry import hold_directory

if TYPE_CHECKING:
    import uvicorn

    from fisk_sm.supervisor.host.cluster_setup import ClusterSettings
    from fisk_sm.supervisor.host.workers.frames import Summary
    from fisk_sm.supervisor.view.book import Leftover

__all__ = ["add_supervise_parser", "cmd_supervise"]

EXIT_ABORTED = 130
OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
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
without it. The API answers only under the names it listens on (the --listen address and port;
localhost, 127.0.0.1 and [::1] too on loopback) and those --allow-host adds (a DNS name, a proxy):
any other Host header gets 421, against DNS rebinding. It refuses a POST from another origin
(403) and one that is not application/json (415). A run's config (POST /api/runs "config") must
be a file directly in the directory of agent.yaml or of a --config-dir (not in a directory
below them), of at most 1 MiB and without YAML aliases; it is checked again on a restart.

Gated tools park their run at the approval desk (status "parked") until an operator answers
once, always or deny through the API; a parked run survives a restart.

SIGINT/SIGTERM: every run suspends now (a model call in flight is cancelled, a tool finishes),
and the process exits 0. On the next start, the runs the shutdown suspended (or whose process
died) are resumed; runs an operator suspended or aborted, and parked runs, are only listed. A
second signal aborts at once (exit 130).

With --nats URL, this supervisor is one of several sharing a NATS server (JetStream): runs are
submitted to a work queue that every supervisor pulls from, journaled in the JetStream session
stream (sessions.options stream and prefix of agent.yaml, FISK_SM_SESSIONS and fisk-sm.sessions
by default; it must exist: `fisk-sm session init-stream`), and owned through
leases (--lease-ttl, renewed every --heartbeat) in a KV bucket. When a supervisor dies or stalls
past its lease, another takes its runs over and resumes them from their journals; a stalled one
that wakes up cannot append to them any more (it reports "lost run ID" and drops them). The
API of any supervisor lists every run and answers every approval.
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
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="also answer requests for HOST (a DNS name, a proxy's address; default port: the"
        " listening one); repeatable",
    )
    parser.add_argument(
        "--config-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="also allow submitted runs to use the agent.yaml files directly in DIR; repeatable",
    )
    parser.add_argument(
        "--event-buffer",
        type=int,
        default=4096,
        metavar="N",
        help="the last N events held for event readers that reconnect (default 4096)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="drive the runs in N worker processes behind this one; 0: in this process"
        f" (default: the cores this process may use, {_cores()} here; 0 with --nats or one core)",
    )
    parser.add_argument(
        "--loop",
        choices=CHOICES,
        default=None,
        help=f"the event loop: uvloop if installed (auto, the default; or ${ENV}), or asyncio's",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="export OpenTelemetry traces of every run over OTLP/HTTP (where:"
        " OTEL_EXPORTER_OTLP_ENDPOINT; needs fisk-sm[otel])",
    )
    shared = parser.add_argument_group("several supervisors on one NATS server")
    shared.add_argument("--nats", metavar="URL", help="share runs through JetStream at URL")
    shared.add_argument(
        "--owner", metavar="NAME", help="this supervisor's name in leases (default HOSTNAME-PID)"
    )
    shared.add_argument(
        "--lease-ttl",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a run's lease lasts unrenewed before another supervisor takes it (10)",
    )
    shared.add_argument(
        "--heartbeat",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between lease renewals; shorter than --lease-ttl (2)",
    )


def served_token(args: argparse.Namespace) -> str | None:
    """The API token: `--token-file`, else `$FISK_SM_TOKEN`, else None (`UsageError` for an
    unreadable or empty file)."""
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


def _cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def cmd_supervise(args: argparse.Namespace) -> int:
    """Run the supervisor until a signal."""
    if args.concurrency < 1:
        raise UsageError(f"--concurrency: must be at least 1, not {args.concurrency}")
    if args.event_buffer < 0:
        raise UsageError(f"--event-buffer: must be at least 0, not {args.event_buffer}")
    token = served_token(args)
    try:
        host, port = parse_listen(args.listen)
        check_token_rule(host, token)
    except ListenError as exc:
        raise UsageError(str(exc)) from None
    try:
        args.loop = loop_name(args.loop)
    except LoopUnavailable as exc:
        raise UsageError(str(exc)) from None
    config = load_config(args.config)
    settings = _cluster_settings(args, config)
    store = store_for(args.state_dir, config)
    dirs = _config_dirs(args, config)
    try:
        sock = bind(host, port)
        bound = sock.getsockname()[1]
        extra = {form for text in args.allow_host for form in parse_allow_host(text, bound)}
    except ListenError as exc:
        raise UsageError(str(exc)) from None
    serve = functools.partial(
        build_app, token=token, hosts=served_hosts(sock, host, extra), config_dirs=dirs
    )

    if args.workers is None:
        args.workers = 0 if args.nats is not None or _cores() < 2 else _cores()
    if args.workers < 0:
        raise UsageError(f"--workers: must be at least 0, not {args.workers}")
    if args.workers:  # N worker processes behind this one
        from fisk_sm.cli.supervise_workers import supervise_workers

        return supervise_workers(args, config, store, sock, serve, dirs)

    def app(supervisor: Supervisor) -> ControlApp:
        return serve(LocalControl(supervisor, event_buffer=args.event_buffer))

    export = telemetry_export(config, flag=args.otel)  # one adapter for every run
    options = None if export is None else RunOptions(events=export.events)
    try:
        if settings is not None:
            return run(_main_cluster(args, config, settings, sock, app, options, dirs), args.loop)
        return run(_main(args, config, store, sock, app, options, dirs), args.loop)
    finally:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        if export is not None:
            export.shutdown()  # the runs are over: export the spans still queued


def _config_dirs(args: argparse.Namespace, config: AgentConfig) -> ConfigDirs:
    for directory in args.config_dir:
        if not directory.is_dir():
            raise UsageError(f"--config-dir: {directory} is not a directory")
    return ConfigDirs.of(config.path, args.config_dir)


def _cluster_settings(args: argparse.Namespace, config: AgentConfig) -> ClusterSettings | None:
    if args.nats is None:
        return None
    if not re.match(r"(nats|tls|ws|wss)://.", args.nats):
        raise UsageError(f"--nats: must be a NATS URL (nats://host:port), got {args.nats!r}")
    owner = args.owner or f"{socket.gethostname()}-{os.getpid()}"
    if not OWNER_RE.fullmatch(owner):
        raise UsageError(f"--owner: must match {OWNER_RE.pattern}, got {owner!r}")
    for flag in ("lease_ttl", "heartbeat"):
        if not getattr(args, flag) > 0:
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive")
    try:
        from fisk_sm.supervisor.host.cluster_setup import ClusterSettings
    except ImportError:
        raise UsageError("--nats needs nats-py: pip install 'fisk-sm[nats]'") from None
    try:
        return ClusterSettings(
            url=args.nats,
            owner=owner,
            lease_ttl=args.lease_ttl,
            heartbeat=args.heartbeat,
            concurrency=args.concurrency,
            sessions_stream=config.harness.sessions.options.stream,
            sessions_prefix=config.harness.sessions.options.prefix,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _on_signals(stop: asyncio.Event) -> None:
    """The first SIGINT/SIGTERM sets `stop`; the second exits at once (130)."""
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            stop.set()  # first: whatever becomes of the line below, the runs are suspended
            say("fisk-sm supervise: suspending every run (signal again to abort)")
        else:
            say("fisk-sm supervise: aborted; every completed step is in the journals")
            sys.stderr.flush()
            os._exit(EXIT_ABORTED)

    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal)


async def _main_cluster(
    args: argparse.Namespace,
    config: AgentConfig,
    settings: ClusterSettings,
    sock: socket.socket,
    app: Callable[[Any], ControlApp],
    options: RunOptions | None = None,
    dirs: ConfigDirs | None = None,
) -> int:
    from fisk_sm.journal.base import JournalError
    from fisk_sm.supervisor.host.cluster_setup import cluster

    stop = asyncio.Event()
    _on_signals(stop)
    try:
        async with cluster(config, settings, options, dirs) as supervisor:
            server, serving = await serve_app(app(supervisor), sock)
            url = url_of(sock)
            if args.state_dir is not None:
                await asyncio.to_thread(write_url, args.state_dir / "supervisor.url", url)
            settle()
            say(f"fisk-sm supervise: runs driven on the {args.loop} event loop")
            say(f"fisk-sm supervise: {settings.owner} listening on {url}")
            await stop.wait()
            await supervisor.shutdown()
            server.should_exit = True
            await serving
            left = supervisor.leftover()
    except JournalError as exc:  # the session stream is missing or set up wrongly
        raise UsageError(f"--nats: {exc}") from None
    say(
        f"fisk-sm supervise: stopped; {left.resuming} run(s) released to the other"
        f" supervisors, {left.parked} parked for an approval, {left.suspended} suspended by an"
        " operator"
    )
    return 0


async def _main(
    args: argparse.Namespace,
    config: AgentConfig,
    store: FileStore,
    sock: socket.socket,
    app: Callable[[Any], ControlApp],
    options: RunOptions | None = None,
    dirs: ConfigDirs | None = None,
) -> int:
    stop = asyncio.Event()
    _on_signals(stop)
    await asyncio.to_thread(store.ensure_directory)
    await asyncio.to_thread(hold_directory, store.directory)  # one supervisor per directory
    supervisor = Supervisor(
        config, store, concurrency=args.concurrency, options=options, config_dirs=dirs
    )
    resumed = await supervisor.start()
    driven = f"on the {args.loop} event loop"
    server, serving = await _serve(app(supervisor), sock, store, driven, len(resumed))
    await stop.wait()
    await supervisor.shutdown()
    server.should_exit = True
    await serving
    _stopped(supervisor.leftover())  # the next start resumes, leaves parked, leaves suspended
    return 0


async def _serve(
    app: ControlApp, sock: socket.socket, store: FileStore, driven: str, resumed: int
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """Serve `app`, write STATE_DIR/supervisor.url, settle; say how runs are `driven` and where."""
    server, serving = await serve_app(app, sock)
    url = url_of(sock)
    await asyncio.to_thread(write_url, store.directory / "supervisor.url", url)
    settle()
    say(f"fisk-sm supervise: runs driven {driven}")
    say(f"fisk-sm supervise: listening on {url}")
    if resumed:
        say(f"fisk-sm supervise: resumed {resumed} run(s)")
    return server, serving


def _stopped(left: Leftover | Summary) -> None:
    """Say what a supervisor that stopped leaves for the next start."""
    say(
        f"fisk-sm supervise: stopped; {left.resuming} run(s) will resume on the next start,"
        f" {left.parked} parked for an approval, {left.suspended} suspended by an operator"
    )

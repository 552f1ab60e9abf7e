"""`fisk-sm supervise --workers N`: the control API in this process (the front), the runs in N
worker processes (`fisk_sm.supervisor.host.workers`).

The front takes the state directory's lock (one supervisor per directory, as without workers),
loads the registry, starts the workers and deals them the runs a restart finds, then serves the
API. The first SIGINT/SIGTERM shuts every worker down (each suspends its runs now and marks them
for the next start) and prints the summary of all; a second one exits at once (130), and the
workers die with the front (their journals hold every completed step). With no worker left
(each died too often), the front exits 1: the next start resumes the runs from their journals.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from collections.abc import Callable

from fisk_sm.cli.run import SIGNALS, UsageError, telemetry_export
from fisk_sm.cli.supervise import _on_signals, _serve, _stopped
from fisk_sm.config.agent import AgentConfig
from fisk_sm.journal.filestore import FileStore
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.api import ControlApp
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.host.eventloop import run
from fisk_sm.supervisor.host.registry import hold_directory
from fisk_sm.supervisor.host.workers.frames import RemoteError, WorkerLost
from fisk_sm.supervisor.host.workers.front import Front, Settings
from fisk_sm.supervisor.interface import HostControl

__all__ = ["EXIT_NO_WORKERS", "supervise_workers"]

#: The exit of a front whose workers are all gone.
EXIT_NO_WORKERS = 1


def supervise_workers(
    args: argparse.Namespace,
    config: AgentConfig,
    store: FileStore,
    sock: socket.socket,
    serve: Callable[[HostControl], ControlApp],
    dirs: ConfigDirs,
) -> int:
    """Run the front and `args.workers` workers until a signal (see the module's doc)."""
    if args.nats is not None:
        raise UsageError("--workers: not with --nats yet")
    if args.workers < 1:
        raise UsageError(f"--workers: must be at least 1 here, not {args.workers}")
    if config.path is None:  # pragma: no cover - a config loaded from a file has its path
        raise UsageError("--workers: the config must be a file")
    checked = telemetry_export(config, flag=args.otel)  # UsageError without the extra
    if checked is not None:
        checked.shutdown()  # each worker exports its runs' traces
    settings = Settings(
        config=config,
        store=store,
        workers=args.workers,
        concurrency=args.concurrency,
        config_dirs=tuple(args.config_dir),
        otel=checked is not None,
        loop=args.loop,
    )
    try:
        return run(_main(settings, sock, serve, args.event_buffer), settings.loop)
    finally:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


async def _main(
    settings: Settings,
    sock: socket.socket,
    serve: Callable[[HostControl], ControlApp],
    event_buffer: int,
) -> int:
    stop = asyncio.Event()
    _on_signals(stop)
    store = settings.store
    await asyncio.to_thread(store.ensure_directory)
    await asyncio.to_thread(hold_directory, store.directory)  # one supervisor per directory
    front = Front(settings, event_buffer=event_buffer)
    try:
        resumed = await front.start()
    except (WorkerLost, RemoteError, OSError) as exc:
        say(f"fisk-sm supervise: a worker did not start: {exc}")
        await front.shutdown()
        return EXIT_NO_WORKERS
    driven = f"by {settings.workers} workers on the {settings.loop} event loop"
    server, serving = await _serve(serve(front), sock, store, driven, len(resumed))
    stopping = asyncio.ensure_future(stop.wait())
    failing = asyncio.ensure_future(front.failed.wait())
    await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    failing.cancel()
    if front.failed.is_set() and not stop.is_set():
        say("fisk-sm supervise: no worker is left; the next start resumes the runs")
        server.should_exit = True
        await front.shutdown()
        await serving
        return EXIT_NO_WORKERS
    left = await front.shutdown()
    server.should_exit = True
    await serving
    _stopped(left)
    return 0

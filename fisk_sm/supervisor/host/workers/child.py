"""A worker process of `fisk-sm supervise --workers N`:
`python -m fisk_sm.supervisor.host.workers.child FD FRONT_PID LOOP` (LOOP: uvloop or asyncio).

FD is this end of the front's socketpair. The worker dies with its front (`PR_SET_PDEATHSIG`
SIGKILL; it exits at once if the front is gone already) and ignores SIGINT and SIGTERM: the
front alone takes the signals and shuts its workers down (`Shutdown`). It drives the runs the
front places on it with one `Supervisor` on its own loop (its own journal writer, its own SDK
client): every registry write goes to the front (`RegistryClient`), the one writer of
runs.jsonl; every event the front watches goes up through an `UplinkHub`. A channel that ends
without a `Shutdown` (the front died, or closed it) ends the worker at once (exit 70): it must
not hold its sessions' locks without a front.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgspec

from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.host.control import LocalControl
from fisk_sm.supervisor.host.eventloop import run, settle
from fisk_sm.supervisor.host.host import Supervisor
from fisk_sm.supervisor.host.registry import RegistryEntry
from fisk_sm.supervisor.host.workers import frames as f
from fisk_sm.supervisor.host.workers.channel import Channel
from fisk_sm.supervisor.host.workers.uplink import UplinkHub
from fisk_sm.supervisor.interface import Action, Answer

__all__ = ["RegistryClient", "Worker", "main"]

_PR_SET_PDEATHSIG = 1
#: The exit of a worker whose front is gone.
EXIT_ORPHANED = 70


def die_with(front: int) -> None:
    """Be killed when the thread that spawned this process ends (its front); exit now if the
    front is gone already."""
    libc = ctypes.CDLL(None, use_errno=True)  # prctl is libc's, linked in
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != front:
        os._exit(EXIT_ORPHANED)


class RegistryClient:
    """A worker's registry: runs.jsonl is the front's, so each write is a call to it."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def load(self) -> dict[str, RegistryEntry]:
        """Nothing: the front loads the registry and deals the runs (`Adopt`)."""
        return {}

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry:
        """Record a new run at the front; its entry (durable when this returns)."""
        found = await self.channel.call(f.Register(run_id, name, config))
        return f.entry_of(msgspec.convert(found, f.Entry))

    async def mark(self, disposition: str, *run_ids: str) -> None:
        """Record `disposition` for each run at the front (durable when this returns)."""
        if run_ids:
            await self.channel.call(f.Mark(disposition, run_ids))


class Worker:
    """The runs of one worker process, driven for the front at the other end of `channel`."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.hub = UplinkHub(channel.notify)
        self.host: Supervisor | None = None
        self.control: LocalControl | None = None
        self.spec: f.WorkerSpec | None = None
        self.finished = asyncio.Event()  # the front's Shutdown is answered
        self._watched: set[asyncio.Task[None]] = set()
        self._close: Callable[[], None] = lambda: None

    async def start(self, spec: f.WorkerSpec) -> None:
        """Build the supervisor of `spec`."""
        config = await asyncio.to_thread(load_config, Path(spec.config))
        options: RunOptions | None = None
        if spec.otel:  # the front checked that the OpenTelemetry extra is installed
            from fisk_sm.events.otel import otlp_export

            export = otlp_export(
                capture_content=True if config.telemetry.capture_content else None,
                agent_name=config.identity,
                provider=config.llm.provider,
            )
            options = RunOptions(events=export.events)
            self._close = export.shutdown
        dirs = ConfigDirs.of(config.path, [Path(d) for d in spec.config_dirs])
        self.hub.watch = spec.watch
        self.host = Supervisor(
            config,
            FileStore(Path(spec.state_dir)),
            concurrency=max(1, spec.concurrency),
            options=options,
            registry=RegistryClient(self.channel),
            config_dirs=dirs,
            hub=self.hub,
        )
        self.control = LocalControl(self.host)
        self.spec = spec

    def on_note(self, body: f.Body) -> None:
        """A note of the front's: what events it watches."""
        if isinstance(body, f.Watch):
            self.hub.watch = body

    def _follow(self, run_id: str) -> None:
        """Tell the front when the task driving `run_id` ends (once per task)."""
        assert self.host is not None
        tracked = self.host.runs.get(run_id)
        task = tracked.task if tracked is not None else None
        if task is None or task in self._watched:
            return
        self._watched.add(task)

        def stopped(done: asyncio.Task[None]) -> None:
            self._watched.discard(done)
            if not self.channel.is_closed:
                self.channel.notify(f.Stopped(run_id))

        task.add_done_callback(stopped)

    async def handle(self, body: f.Body) -> Any:
        """Answer one call of the front."""
        if isinstance(body, f.Hello):
            await self.start(body.spec)
            settle()  # what start-up made, out of the collector's way
            return os.getpid()
        host, control = self.host, self.control
        if host is None or control is None:
            raise RuntimeError(f"{type(body).__name__} before Hello")
        if isinstance(body, f.Submit):
            start = host.submit_chat if body.chat else host.submit
            tracked = await start(body.prompt, body.name, body.config, run_id=body.run_id)
            self._follow(body.run_id)
            return tracked.row()
        if isinstance(body, f.Adopt):
            resumed = await host.adopt([f.entry_of(e) for e in body.entries])
            for run_id in resumed:
                self._follow(run_id)
            return resumed
        if isinstance(body, f.Act):
            row = await control.act(body.run_id, cast(Action, body.action))
            self._follow(body.run_id)
            return row
        if isinstance(body, f.AnswerCall):
            answer = cast(Answer, body.answer)
            row = await control.answer(body.run_id, body.tool_use_id, answer)
            self._follow(body.run_id)
            return row
        return await self._read(body, host, control)

    async def _read(self, body: f.Body, host: Supervisor, control: LocalControl) -> Any:
        if isinstance(body, f.Say):
            return await control.say(body.run_id, body.text)
        if isinstance(body, f.RowOf):
            return await control.row(body.run_id)
        if isinstance(body, f.Show):
            return await control.show(body.run_id)
        if isinstance(body, f.PathOf):
            return await control.session_path(body.run_id)
        if isinstance(body, f.List):
            return await control.listing()
        if isinstance(body, f.ListApprovals):
            return await control.approvals()
        if isinstance(body, f.Shutdown):
            marked = await host.shutdown()
            left = host.leftover()
            self.finished.set()
            return f.Summary(tuple(marked), left.resuming, left.parked, left.suspended)
        raise RuntimeError(f"a worker takes no {type(body).__name__}")

    async def serve(self) -> int:
        """Serve the front until it shuts this worker down (0), or goes (exit 70 at once)."""
        self.channel.serve(self.handle, self.on_note)
        finished = asyncio.ensure_future(self.finished.wait())
        either: set[asyncio.Future[Any]] = {finished, self.channel.closed}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not finished.done():
            sys.stderr.flush()
            os._exit(EXIT_ORPHANED)  # its sessions' locks go with it, now
        await asyncio.sleep(0)  # the Summary's reply is written by the task that answered
        await self.channel.drain()
        self._close()
        return 0


async def _serve(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)  # no tool's process keeps the front's channel open
    worker = Worker(await Channel.open(sock, "front"))
    return await worker.serve()


def main(argv: list[str] | None = None) -> int:
    """Run a worker (see the module's doc)."""
    fd, front, loop = (argv or sys.argv)[1:4]
    die_with(int(front))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    return run(_serve(int(fd)), loop)


if __name__ == "__main__":
    sys.exit(main())

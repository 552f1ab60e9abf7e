"""`WorkerPool`: the front's worker processes, started, watched, and started again.

A worker is spawned on the loop's thread (the main one), never in a thread of its own: its
`PR_SET_PDEATHSIG` fires when the thread that spawned it ends, and that must be the front's
end. It gets its end of a socketpair (`pass_fds`) and the front's pid; stderr is the front's.
Its death is the first of its channel's end and its pidfd turning readable: a worker whose
channel ended while it still lives (a bug closed it) is killed, and counted dead only once the
kernel says it exited, so that no run is ever driven by two processes. A dead index is started
again at most `RESPAWNS` times a minute.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from fisk_sm.supervisor.host.workers.channel import Channel, Handler, NoteHandler
from fisk_sm.supervisor.host.workers.frames import Hello, WorkerSpec

__all__ = ["RESPAWNS", "WorkerPool", "WorkerProcess"]

#: How many times a minute one worker index is started again after a death.
RESPAWNS = 3
CHILD = "fisk_sm.supervisor.host.workers.child"


class WorkerProcess:
    """One worker: its process, its channel, its runs' load, and its end."""

    def __init__(self, index: int, process: subprocess.Popen[bytes], channel: Channel) -> None:
        self.index, self.process, self.channel = index, process, channel
        self.pid = process.pid
        self.live: set[str] = set()  # the runs a task drives there, as far as the front knows
        self.placed = 0  # runs placed on it, ever
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()  # its exit status
        self.replaced: asyncio.Future[None] = loop.create_future()  # its runs are elsewhere
        self._pidfd = os.pidfd_open(process.pid)
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        if not self.exited.done():
            self.exited.set_result(self.process.wait())  # it exited: no wait

    @property
    def alive(self) -> bool:
        """Whether the process has not exited."""
        return not self.exited.done()

    def kill(self) -> None:
        """SIGKILL the process (through its pidfd: never another process of the same pid)."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def ended(self) -> int:
        """Wait for the worker's death (the first of its channel's end and its exit; a live
        process whose channel ended is killed first); its exit status."""
        either: set[asyncio.Future[Any]] = {self.channel.closed, self.exited}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if self.alive:
            self.kill()
        status = await self.exited
        await self.channel.aclose()  # pending calls raise WorkerLost
        return status


class WorkerPool:
    """Spawns the workers of `spec(index)` on the event loop `loop`, with `handler`/`on_note`
    serving their calls and notes, and restarts a dead index (bounded)."""

    def __init__(
        self,
        spec: Callable[[int], WorkerSpec],
        handler: Callable[[WorkerProcess], Handler],
        on_note: Callable[[WorkerProcess], NoteHandler],
        loop: str = "asyncio",
    ) -> None:
        self.spec, self.handler, self.on_note = spec, handler, on_note
        self.loop = loop  # the event loop of every worker (`eventloop.loop_name`)
        self._starts: dict[int, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=RESPAWNS + 1)
        )

    async def spawn(self, index: int) -> WorkerProcess:
        """Start worker `index` and say hello; `WorkerLost` if it dies before answering."""
        self._starts[index].append(time.monotonic())
        mine, theirs = socket.socketpair()
        try:
            # on the loop's thread: PR_SET_PDEATHSIG fires when the spawning thread ends
            process = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", CHILD, str(theirs.fileno()), str(os.getpid()), self.loop],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        channel = await Channel.open(mine, f"worker {index}")
        worker = WorkerProcess(index, process, channel)
        channel.serve(self.handler(worker), self.on_note(worker))
        try:
            await channel.call(Hello(self.spec(index)))
        except BaseException:
            worker.kill()
            await worker.ended()
            raise
        return worker

    def may_respawn(self, index: int) -> bool:
        """Whether `index` may start again: fewer than `RESPAWNS` restarts in the last minute."""
        starts = self._starts[index]
        return len(starts) <= RESPAWNS or time.monotonic() - starts[0] > 60.0

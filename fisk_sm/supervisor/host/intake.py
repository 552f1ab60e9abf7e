"""`QueueIntake`: how a cluster member's host takes runs in (`Host(..., intake=QueueIntake(...))`).

Its loops, started and stopped with the host: pulling submissions off the work queue as long as
the host has room (`concurrency` runs driven at once, parked ones not counted), renewing the
leases of the runs it drives (a renewal that fails stops the run now), and taking over the runs
whose lease expired or was released. Its `submit` puts a new run on the work queue: a member
with room (maybe this one) starts it. Taking and keeping runs is the host's `LeaseOwnership`
(`fisk_sm.supervisor.host.leased`, which has the theory of operation).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fisk_sm.config.errors import one_line
from fisk_sm.loop.run import new_run_id
from fisk_sm.model.clients import warm_up
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.cluster.workqueue import Submission, WorkQueue
from fisk_sm.supervisor.errors import Conflict
from fisk_sm.supervisor.host.leased import LeaseOwnership
from fisk_sm.supervisor.view.cluster_rows import ClusterTracked
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.host.host import Host

__all__ = ["QueueIntake"]


class QueueIntake:
    """Runs taken in from `queue` and from expired leases, for `ownership`, every `heartbeat`."""

    def __init__(self, queue: WorkQueue, ownership: LeaseOwnership, heartbeat: float) -> None:
        self.queue = queue
        self.ownership = ownership
        self.heartbeat = heartbeat
        self._host: Host | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()

    @property
    def host(self) -> Host:
        assert self._host is not None, "the intake has not started"
        return self._host

    async def start(self, host: Host) -> None:
        """Start the mirrors and the loops: pulling submissions, heartbeats, takeovers."""
        self._host = host
        if host.options.model is None:  # the SDK's import and client, before the first run
            await warm_up(host.config.llm)
        await self.queue.ensure()
        await self.ownership.start()
        for loop in (self._pull, self._beat, self._watch_expiries):
            self._tasks.append(asyncio.ensure_future(self._guarded(loop)))

    async def stop(self) -> None:
        """Stop the loops (the host is closing) and the mirrors."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        await self.ownership.stop()

    async def submit(
        self, host: Host, prompt: str, name: str | None, config: str | None, *, chat: bool,
        run_id: str | None,
    ) -> Tracked:  # fmt: skip
        """Put a new run on the work queue; a member with room (maybe this one) starts it
        (once: a redelivery of a run id taken already is dropped by its lease). A chat is
        refused: it waits for its operator's follow-ups at one member, which a work queue
        and takeovers cannot promise yet."""
        if chat:
            raise Conflict("chat runs need a single supervisor: start them without --nats")
        if host.closing:
            raise Conflict("the supervisor is shutting down")
        agent = await host._config(config or "")  # a config that does not load: refused here
        run_id = run_id or new_run_id()
        path = str(agent.path) if agent.path is not None and config else ""
        owner = self.ownership.owner
        submission = Submission(run_id, prompt, name or run_id, path, time.time(), owner)
        await self.queue.publish(submission)
        entry = RegistryEntry(run_id, submission.name, path, submission.created)
        return self.ownership.remote.queued(entry)

    # -- the loops --------------------------------------------------------------------------

    async def _guarded(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while not self.host.closing:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            # A boundary: these loops (pulling submissions, renewing leases, taking runs over)
            # must outlive a lost connection and a bug alike: say why, and try again.
            except Exception as exc:
                say(f"fisk-sm supervise: {loop.__name__.strip('_')}: {one_line(exc)}")
                await asyncio.sleep(self.heartbeat)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    def _active(self) -> int:
        """The runs driven here that count against `concurrency` (parked ones do not)."""
        runs = self.host.runs.values()
        busy = sum(1 for t in runs if t.live and t.status != "parked")
        return busy + len(self.ownership.taking)

    async def _pull(self) -> None:
        host, ownership = self.host, self.ownership
        while not host.closing:
            room = host.concurrency - self._active()
            if room <= 0:
                ownership.room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ownership.room.wait(), self.heartbeat)
                continue
            for message in await self.queue.fetch(room):
                if host.closing:
                    await message.nak()
                    continue
                try:
                    submission = Submission.parse(message.data)
                except ValueError as exc:
                    say(f"fisk-sm supervise: dropped a malformed submission: {one_line(exc)}")
                    await message.term()
                    continue
                ownership.taking.add(submission.run_id)
                self._spawn(ownership.take_submission(host, submission, message))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await asyncio.gather(*(self._keep(t) for t in self.ownership.mine()))

    async def _keep(self, tracked: ClusterTracked) -> None:
        if not await self.ownership.renew(tracked):  # another member has it: stop it now
            self.host._stop(tracked)

    async def _watch_expiries(self) -> None:
        host, ownership = self.host, self.ownership
        while not host.closing:
            await asyncio.sleep(self.heartbeat)
            for run_id in ownership.view.takeable():
                if self._active() >= host.concurrency or host.closing:
                    break
                mine = host.runs.get(run_id)
                if run_id in ownership.taking or (mine is not None and mine.live):
                    continue
                ownership.taking.add(run_id)
                self._spawn(ownership.take_over(host, run_id))

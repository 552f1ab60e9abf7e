"""`ClusterSupervisor`: one of several supervisors sharing one NATS server (JetStream).

Theory of operation. Every piece of shared state lives in JetStream, none in a supervisor:

- submissions: a work-queue stream (`fisk_sm.supervisor.cluster.workqueue`). Any supervisor's API
  accepts a run and publishes it; each supervisor pulls as many as it has room for
  (`concurrency` runs driven at once, parked ones not counted).
- ownership: a KV bucket of leases (`fisk_sm.supervisor.cluster.lease`). A supervisor takes a
  run's lease before it creates or resumes its session, and a heartbeat renews every lease it
  holds by compare-and-swap. A renewal that fails means another supervisor took the run over:
  the run is suspended now here, and its next journal append is refused.
- journals: the JetStream session store (`fisk_sm.journal.jetstream`), whose appends are fenced
  on the run's last record. Whoever takes a run over first appends a `suspended` terminal
  record ("taken over by B: the lease of A expired"), which moves the fence: A's next append
  fails with `SessionLockedError`, A drops the run and reports it (a stderr line, a `RunLost`
  event), and B resumes the session from the journal. So a journal never has A's records after
  B's takeover record, and a tool repeats at most once per run that was in flight.
- approvals: a KV bucket (`fisk_sm.supervisor.host.shared_desk`); any supervisor answers any.
- the listing: every session in the store, with its owner from the lease bucket.

Taking, keeping and losing runs is `fisk_sm.supervisor.host.leased` (`LeaseHolder`, the base
class); this module adds the loops (pulling, heartbeats, watching for expiries), the listing of
every supervisor's runs and the operator's actions.

A takeover happens when a lease has expired (its owner died or stalled past the TTL) or was
released by a shutdown; runs an operator suspended or aborted, and parked ones, wait for an
operator (an answer takes a parked run's lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.errors import one_line
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import new_run_id
from fisk_sm.model.clients import warm_up
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.cluster.lease import (
    ABORTED,
    ACTIVE,
    FAILED,
    OPERATOR_SUSPENDED,
    PARKED,
    RELEASED,
    Leases,
)
from fisk_sm.supervisor.cluster.workqueue import Submission, WorkQueue
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.host.leased import LeaseHolder
from fisk_sm.supervisor.host.shared_desk import SharedDesk
from fisk_sm.supervisor.view.cluster_rows import RemoteRuns
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.tracked import ENDED, Tracked

__all__ = ["ClusterSupervisor"]


class ClusterSupervisor(LeaseHolder):
    """A supervisor named `owner` of runs shared through `queue`, `leases` and `store`."""

    def __init__(
        self,
        config: AgentConfig,
        store: JetStreamStore,
        *,
        queue: WorkQueue,
        leases: Leases,
        desk: SharedDesk,
        heartbeat: float,
        concurrency: int = 16,
        options: RunOptions | None = None,
    ) -> None:
        super().__init__(
            config, store, leases=leases, desk=desk, concurrency=concurrency, options=options
        )
        self.queue = queue
        self.heartbeat = heartbeat
        self.remote = RemoteRuns(store, self.view, config)
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()

    # -- the runs of every supervisor -------------------------------------------------------

    async def refresh(self) -> None:
        await self.remote.refresh(set(self.runs))

    def get(self, run_id: str) -> Tracked:
        try:
            return super().get(run_id)
        except NotFound:
            found = self.remote.runs.get(run_id)
            if found is None:
                raise
            return found

    def listing(self) -> list[Tracked]:
        every = {**self.remote.runs, **self.runs}
        return sorted(every.values(), key=lambda t: (-t.entry.created, t.entry.run_id))

    def approvals(self) -> list[dict[str, Any]]:
        return self.shared.pending_shared()

    def _active(self) -> int:
        """The runs driven here that count against `concurrency` (parked ones do not)."""
        busy = sum(1 for t in self.runs.values() if t.live and t.status != "parked")
        return busy + len(self._taking)

    # -- start, the loops, shutdown ---------------------------------------------------------

    async def start(self) -> list[str]:
        """Start the mirrors and the loops: pulling submissions, heartbeats, takeovers."""
        if self.options.model is None:  # the SDK's import and client, before the first run
            await warm_up(self.config.llm)
        await self.queue.ensure()
        await self.view.start()
        await self.shared.start()
        for loop in (self._pull, self._beat, self._watch_expiries):
            self._tasks.append(asyncio.ensure_future(self._guarded(loop)))
        return []

    async def _guarded(self, loop: Any) -> None:
        while not self.closing:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            # A boundary: these loops (pulling submissions, renewing leases, taking runs over)
            # must outlive a lost connection and a bug alike: say why, and try again.
            except Exception as exc:
                say(f"fisk-sm supervise: {loop.__name__.strip('_')}: {one_line(exc)}")
                await asyncio.sleep(self.heartbeat)

    async def shutdown(self, on_stopped: Any = None) -> list[str]:
        self.closing = True
        marked = await super().shutdown(on_stopped)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        await self.view.stop()
        await self.shared.stop()
        return marked

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _pull(self) -> None:
        while not self.closing:
            room = self.concurrency - self._active()
            if room <= 0:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), self.heartbeat)
                continue
            for message in await self.queue.fetch(room):
                if self.closing:
                    await message.nak()
                    continue
                try:
                    submission = Submission.parse(message.data)
                except ValueError as exc:
                    say(f"fisk-sm supervise: dropped a malformed submission: {one_line(exc)}")
                    await message.term()
                    continue
                self._taking.add(submission.run_id)
                self._spawn(self._take_submission(submission, message))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            held = [t for t in self._mine() if t.lease is not None and not t.lost]
            await asyncio.gather(*(self._renew(t) for t in held))

    async def _watch_expiries(self) -> None:
        while not self.closing:
            await asyncio.sleep(self.heartbeat)
            for run_id in self.view.takeable():
                if self._active() >= self.concurrency or self.closing:
                    break
                mine = self.runs.get(run_id)
                if run_id in self._taking or (mine is not None and mine.live):
                    continue
                self._taking.add(run_id)
                self._spawn(self._take_over(run_id))

    # -- operator actions -------------------------------------------------------------------

    async def _submit(
        self, prompt: str, name: str | None, config: str | None, *, chat: bool, run_id: str | None
    ) -> Tracked:
        """Put a new run on the work queue; a supervisor with room (maybe this one) starts it
        (once: a redelivery of a run id taken already is dropped by its lease). A chat is
        refused: it waits for its operator's follow-ups at one supervisor, which a work queue
        and takeovers cannot promise yet."""
        if chat:
            raise Conflict("chat runs need a single supervisor: start them without --nats")
        if self.closing:
            raise Conflict("the supervisor is shutting down")
        agent = await self._config(config or "")  # a config that does not load: refused here
        run_id = run_id or new_run_id()
        path = str(agent.path) if agent.path is not None and config else ""
        submission = Submission(run_id, prompt, name or run_id, path, time.time(), self.owner)
        await self.queue.publish(submission)
        entry = RegistryEntry(run_id, submission.name, path, submission.created)
        return self.remote.queued(entry)

    async def resume(self, run_id: str) -> Tracked:
        """Resume a run nobody drives (suspended, parked, failed) here, taking its lease."""
        await self.refresh()
        tracked = self.get(run_id)
        if tracked.live:
            raise Conflict(f"run {run_id} is already running")
        if tracked.status not in ("suspended", "parked", "failed") or self.closing:
            raise Conflict(f"run {run_id} cannot be resumed (status {tracked.status})")
        await self._claim(run_id, frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED, FAILED}))
        return self.get(run_id)

    async def abort(self, run_id: str) -> Tracked:
        """Abort a run: here if it is driven here, else by holding its lease `aborted`."""
        await self.refresh()
        tracked = self.get(run_id)
        if tracked in self.runs.values() and tracked.live:
            return await super().abort(run_id)
        if tracked.status in ("aborted", *ENDED):
            raise Conflict(f"run {run_id} has ended (status {tracked.status})")
        every = frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED, FAILED, ACTIVE})
        lease = await self.leases.acquire(run_id, breaking=every)
        if lease is None:
            owner = self.view.owner(run_id) or "another supervisor"
            raise Conflict(f"run {run_id} is driven by {owner}: abort it there")
        await self.leases.hold(lease, ABORTED)
        return tracked

    async def suspend(self, run_id: str) -> Tracked:
        await self.refresh()
        if run_id not in self.runs and self.view.owner(run_id):
            raise Conflict(f"run {run_id} is driven by {self.view.owner(run_id)}: suspend it there")
        return await super().suspend(run_id)

    async def answer(self, run_id: str, tool_use_id: str, approval: Approval) -> Tracked:
        """Answer an approval of any supervisor's run, once (decided in the bucket: a later
        answer gets `AlreadyAnswered`); a parked run nobody drives is resumed here (its lease
        taken), and finds the answer in the bucket when it asks again."""
        await self.refresh()
        if run_id not in self.runs and run_id not in self.remote.runs:  # listed too long ago?
            await self.remote.refresh(set(self.runs), fresh=True)
        tracked = self.get(run_id)
        if not await self.shared.answer_shared(run_id, tool_use_id, approval):
            # no question in the bucket: its run ended (its journal has the answer) or never
            # asked it
            await self.shared.refuse_answered(run_id, tool_use_id, self.records_of)
            raise NotFound(f"run {run_id} has no pending approval {tool_use_id!r}")
        if not tracked.live and not self.view.owner(run_id):
            with contextlib.suppress(Conflict):
                await self._claim(run_id, frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED}))
        return self.get(run_id)

"""Owning runs through leases: taking them (new, or over from a supervisor that died), keeping
them (the heartbeat's renewals), and giving them up or losing them (`fisk_sm.supervisor.host.member`
has the theory of operation).

A run is taken from a submission (`_take_submission`: its lease created, its session started) or
from an expired or released lease (`_take_over`, `_claim`: the lease won by compare-and-swap,
the old owner fenced out of the journal by a takeover record if it may still be alive, and the
session resumed). A renewal that fails loses the run (`_lose`): it is suspended now, and its next
append is refused. When a run's task ends, its lease is ended (the run ended) or held with the
reason nobody drives it (`_give_up`); a lost run is dropped and reported (`_stopped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from nats.errors import Error as NatsError

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.errors import one_line
from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import SessionExistsError, SessionLockedError, SessionNotFoundError
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import start_session
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.cluster.lease import (
    ABORTED,
    ACTIVE,
    ENDED,
    FAILED,
    OPERATOR_SUSPENDED,
    PARKED,
    RELEASED,
    Lease,
    LeaseLost,
    Leases,
    LeaseView,
)
from fisk_sm.supervisor.cluster.workqueue import Submission
from fisk_sm.supervisor.errors import Conflict
from fisk_sm.supervisor.host.host import Supervisor
from fisk_sm.supervisor.host.shared_desk import SharedDesk
from fisk_sm.supervisor.view.cluster_rows import ClusterTracked, NoRegistry, epoch
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.hub import RunSink
from fisk_sm.supervisor.view.tracked import ENDED as ENDED_STATES
from fisk_sm.supervisor.view.tracked import Tracked

__all__ = ["FENCE_TRIES", "LeaseHolder"]

#: How often a takeover of a run whose journal moved meanwhile is tried again.
FENCE_TRIES = 5

#: The server is unreachable or refused a request (nats' timeouts are OSErrors).
_UNREACHABLE = (NatsError, OSError)
#: What taking a submission or a run over may meet besides: its journal refused or moved, its
#: lease lost, its agent.yaml no longer loading (ConfigError, NotAllowed: ValueErrors).
_NOT_TAKEN = (*_UNREACHABLE, JournalError, LeaseLost, ValueError)


class LeaseHolder(Supervisor):
    """A supervisor whose runs are held through `leases` in the JetStream `store`."""

    def __init__(
        self,
        config: AgentConfig,
        store: JetStreamStore,
        *,
        leases: Leases,
        desk: SharedDesk,
        concurrency: int = 16,
        options: RunOptions | None = None,
    ) -> None:
        super().__init__(
            config, store, concurrency=concurrency, options=options, registry=NoRegistry()
        )
        self.jstore = store
        self.owner = leases.owner
        self.leases = leases
        self.view = LeaseView(leases.kv)
        self.desk = self.shared = desk
        desk._on_change = self.book.changed
        self._taking: set[str] = set()  # runs being taken (they count against concurrency)
        self._room = asyncio.Event()  # set when a run stops here

    def _track(self, entry: RegistryEntry, config: AgentConfig) -> ClusterTracked:
        sink = RunSink(entry.run_id, self.hub, self.book.changed)
        tracked = ClusterTracked(entry, config, sink, self.view)
        self.runs[entry.run_id] = tracked
        return tracked

    def _mine(self) -> list[ClusterTracked]:
        return [t for t in self.runs.values() if isinstance(t, ClusterTracked)]

    # -- owning runs ------------------------------------------------------------------------

    async def _renew(self, tracked: ClusterTracked) -> None:
        async with tracked.lease_lock:
            lease = tracked.lease
            if lease is None or tracked.lost:
                return
            try:
                tracked.lease = await self.leases.renew(lease)
            except LeaseLost as exc:
                self._lose(tracked, str(exc))
            except _UNREACHABLE as exc:  # ours until it expires
                if time.time() >= lease.value.expires:
                    self._lose(tracked, f"the lease expired unrenewed ({one_line(exc)})")

    def _lose(self, tracked: ClusterTracked, why: str) -> None:
        """The run is not ours any more: stop it now. Its next append (if it makes one) is
        refused by the fence; `_stopped` drops it and reports."""
        tracked.lost = why
        self._stop(tracked)

    def _failed(self, tracked: Tracked, exc: Exception) -> None:
        if isinstance(exc, SessionLockedError) and isinstance(tracked, ClusterTracked):
            tracked.lost = f"an append was refused: {one_line(exc)}"
            return
        super()._failed(tracked, exc)

    async def _stopped(self, tracked: Tracked, run: Run) -> None:
        assert isinstance(tracked, ClusterTracked)
        run_id = tracked.entry.run_id
        if not tracked.lost:
            await self._give_up(tracked, run)
        if tracked.lost:  # another supervisor owns it now: it is only listed from here on
            say(f"fisk-sm supervise: lost run {run_id}: {tracked.lost}")
            data = {"type": "RunLost", "run_id": run_id, "owner": self.owner}
            self.hub.publish("RunLost", run_id, {**data, "reason": tracked.lost})
            if self.runs.get(run_id) is tracked:
                del self.runs[run_id]
        self._room.set()

    async def _give_up(self, tracked: ClusterTracked, run: Run) -> None:
        """The task ended: end the lease of an ended run, else say why nobody drives it."""
        if tracked.entry.disposition == "aborted":
            hold = ABORTED
        elif tracked.entry.disposition == "operator_suspended":
            hold = OPERATOR_SUSPENDED
        elif run.finished and run.state in ENDED_STATES:
            hold = ENDED
        elif tracked.error is not None:
            hold = FAILED
        else:
            hold = PARKED if tracked.state == States.AWAITING_APPROVAL else RELEASED
        async with tracked.lease_lock:
            lease, tracked.lease = tracked.lease, None
            if lease is None:
                return
            try:
                await self.leases.hold(lease, hold)
                if hold == ENDED:
                    self.shared.drop(tracked.entry.run_id)
            except LeaseLost as exc:
                tracked.lost = str(exc)
            except _UNREACHABLE as exc:  # the lease expires by itself
                say(f"fisk-sm supervise: run {tracked.entry.run_id}: {one_line(exc)}")

    async def _take_submission(self, submission: Submission, message: Any) -> None:
        run_id = submission.run_id
        try:
            lease = await self.leases.acquire(
                run_id, name=submission.name, config=submission.config
            )
            if lease is None:  # a redelivery of a run another supervisor drives
                await message.ack()
                return
            entry = RegistryEntry(run_id, submission.name, submission.config, submission.created)
            try:
                agent = await self._config(submission.config)
            except (ValueError, OSError) as exc:  # its agent.yaml went bad since it was submitted
                say(f"fisk-sm supervise: run {run_id}: {one_line(exc)}")
                await self.leases.hold(lease, FAILED)
                await message.term()
                return
            tracked = self._track(entry, agent)
            tracked.lease = lease
            try:
                run = await start_session(
                    agent,
                    submission.prompt,
                    self.store,
                    self._options(run_id, tracked.sink),
                    run_id=run_id,
                )
            except SessionExistsError:  # a redelivery: its first taker died after creating it
                del self.runs[run_id]
                await message.ack()
                await self._continue(lease, entry)
                return
            # A boundary: the submission's run fails alone, its lease held `failed` and its
            # message acked, whatever stopped it starting (its tools, its journal, a bug), or
            # the lease would be renewed with no run behind it and the message redelivered.
            except Exception as exc:
                tracked.error = one_line(exc)
                await self._stopped_early(tracked)
                await message.ack()
                return
            self._launch(tracked, run)
            self.book.publish("RunSubmitted", tracked)
            await message.ack()
        except _NOT_TAKEN as exc:  # not taken (a server gone...): the submission comes again
            say(f"fisk-sm supervise: submission {run_id}: {one_line(exc)}")
        finally:
            self._taking.discard(run_id)

    async def _stopped_early(self, tracked: ClusterTracked) -> None:
        say(f"fisk-sm supervise: run {tracked.entry.run_id}: {tracked.error}")
        async with tracked.lease_lock:
            lease, tracked.lease = tracked.lease, None
        if lease is not None:
            with contextlib.suppress(*_UNREACHABLE, LeaseLost):
                await self.leases.hold(lease, FAILED)
        self.book.changed(tracked.entry.run_id)

    async def _take_over(self, run_id: str) -> None:
        try:
            lease = await self.leases.acquire(run_id)
            if lease is None:
                return
            value = lease.previous
            name, config = (value.name, value.config) if value is not None else ("", "")
            await self._continue(lease, RegistryEntry(run_id, name or run_id, config, 0.0))
        except _NOT_TAKEN as exc:  # the next expiry scan tries again
            say(f"fisk-sm supervise: takeover of {run_id}: {one_line(exc)}")
        finally:
            self._taking.discard(run_id)

    async def _continue(self, lease: Lease, entry: RegistryEntry) -> None:
        """Resume the session of a run whose lease we just took (from a dead owner, a
        shutdown, an operator), fencing its old owner out first if it may still be alive."""
        run_id = lease.run_id
        try:
            snapshot = await self.jstore.snapshot_async(run_id)
        except SessionNotFoundError:  # its owner died before creating it: the queue has it
            await self.leases.end(lease)
            return
        if snapshot.status not in ("open", States.SUSPENDED):
            await self.leases.hold(lease, ENDED)  # kept: the listings name the run by it
            return
        before = lease.previous
        if before is not None and before.hold == ACTIVE:
            why = f"taken over by {self.owner}: the lease of {before.owner} expired"
            await self._fence(run_id, why)
            say(f"fisk-sm supervise: took over run {run_id} from {before.owner}")
        created = entry.created or epoch(snapshot.created)
        tracked = self.runs.get(run_id)
        if not isinstance(tracked, ClusterTracked) or tracked.live:
            agent = await self._config(entry.config)
            tracked = self._track(RegistryEntry(run_id, entry.name, entry.config, created), agent)
        tracked.lease, tracked.lost, tracked.error = lease, "", None
        await self._resume(tracked)
        if not tracked.live:  # refused (a changed config...): nobody retries it blindly
            await self._stopped_early(tracked)

    async def _fence(self, run_id: str, why: str) -> None:
        for attempt in range(FENCE_TRIES):
            try:
                await self.jstore.take_over_async(run_id, why)
                return
            except SessionLockedError:  # the old owner appended meanwhile: read again
                if attempt == FENCE_TRIES - 1:
                    raise

    async def _claim(self, run_id: str, breaking: frozenset[str]) -> None:
        lease = await self.leases.acquire(run_id, breaking=breaking)
        if lease is None:
            owner = self.view.owner(run_id) or "another supervisor"
            raise Conflict(f"run {run_id} is driven by {owner}")
        value = lease.previous
        name, config = (value.name, value.config) if value is not None else ("", "")
        await self._continue(lease, RegistryEntry(run_id, name or run_id, config, 0.0))

"""`LeaseOwnership`: how a cluster member owns runs (its `Host`'s `ownership`) through leases.

Theory of operation. Every piece of shared state lives in JetStream, none in a member:

- submissions: a work-queue stream (`fisk_sm.supervisor.cluster.workqueue`). Any member's API
  accepts a run and publishes it; each member pulls as many as it has room for (`concurrency`
  runs driven at once, parked ones not counted): its host's `QueueIntake`
  (`fisk_sm.supervisor.host.intake`), which also renews the leases and watches for expiries.
- ownership: a KV bucket of leases (`fisk_sm.supervisor.cluster.lease`). A member takes a run's
  lease before it creates or resumes its session, and a heartbeat renews every lease it holds
  by compare-and-swap. A renewal that fails means another member took the run over: the run is
  suspended now here, and its next journal append is refused.
- journals: the JetStream session store (`fisk_sm.journal.jetstream`), whose appends are fenced
  on the run's last record. Whoever takes a run over first appends a `suspended` terminal
  record ("taken over by B: the lease of A expired"), which moves the fence: A's next append
  fails with `SessionLockedError`, A drops the run and reports it (a stderr line, a `RunLost`
  event), and B resumes the session from the journal. So a journal never has A's records after
  B's takeover record, and a tool repeats at most once per run that was in flight.
- approvals: a KV bucket (`fisk_sm.supervisor.cluster.approvals`, the desk's `shared`); any
  member answers any.
- the listing: every session in the store, with its owner from the lease bucket (the book's
  `remote`, `fisk_sm.supervisor.view.cluster_rows`).

A run is taken from a submission (`take_submission`: its lease created, its session started) or
from an expired or released lease (`take_over`, `claim`: the lease won by compare-and-swap, the
old owner fenced out of the journal by a takeover record if it may still be alive, and the
session resumed). A takeover happens when a lease has expired (its owner died or stalled past
the TTL) or was released by a shutdown; runs an operator suspended or aborted, and parked ones,
wait for an operator (an answer takes a parked run's lease). A renewal that fails loses the run
(`renew` says so; the intake stops it), and its next append is refused. When a run's task ends,
its lease is ended (the run ended) or held with the reason nobody drives it (`give_up`); a lost
run is dropped and reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from nats.errors import Error as NatsError

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.errors import one_line
from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import SessionExistsError, SessionLockedError, SessionNotFoundError
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import start_session
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.cluster.approvals import ApprovalsMirror
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
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.host.desk import NAMES
from fisk_sm.supervisor.view.book import RunBook
from fisk_sm.supervisor.view.cluster_rows import ClusterTracked, NoRegistry, RemoteRuns, epoch
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.tracked import ENDED as ENDED_STATES
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.host.host import Host

__all__ = ["FENCE_TRIES", "LeaseOwnership"]

#: How often a takeover of a run whose journal moved meanwhile is tried again.
FENCE_TRIES = 5

#: The server is unreachable or refused a request (nats' timeouts are OSErrors).
_UNREACHABLE = (NatsError, OSError)
#: What taking a submission or a run over may meet besides: its journal refused or moved, its
#: lease lost, its agent.yaml no longer loading (ConfigError, NotAllowed: ValueErrors).
_NOT_TAKEN = (*_UNREACHABLE, JournalError, LeaseLost, ValueError)
#: The holds an operator's resume breaks (an answer's: not a failed run's).
_RESUMES = frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED, FAILED})
_ANSWER_RESUMES = frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED})


class LeaseOwnership:
    """Runs owned through `leases` (this member is `leases.owner`), their journals in `store`,
    their approvals in `shared`; `book` is the member's host's (it shows the other members' runs
    through its `remote`)."""

    registry = NoRegistry()
    resumable = frozenset({"suspended", "parked", "failed"})

    def __init__(
        self,
        leases: Leases,
        store: JetStreamStore,
        shared: ApprovalsMirror,
        book: RunBook,
        remote: RemoteRuns,
    ) -> None:
        self.leases = leases
        self.owner = leases.owner
        self.store = store
        self.shared = shared
        self.book = book
        self.remote = remote
        self.view: LeaseView = remote.view
        self.taking: set[str] = set()  # runs being taken (they count against concurrency)
        self.room = asyncio.Event()  # set when a run stops here

    async def start(self) -> None:
        """Start mirroring the lease and approvals buckets."""
        await self.view.start()
        await self.shared.start()

    async def stop(self) -> None:
        await self.view.stop()
        await self.shared.stop()

    def mine(self) -> list[ClusterTracked]:
        """The runs this member holds a lease of."""
        held = (t for t in self.book.runs.values() if isinstance(t, ClusterTracked))
        return [t for t in held if t.lease is not None and not t.lost]

    # -- what the host asks -----------------------------------------------------------------

    async def take(self, entry: RegistryEntry) -> bool:
        return True  # a member adopts nothing: its runs come by the queue and the leases

    def refused(self, tracked: Tracked, exc: Exception) -> bool:
        if isinstance(exc, SessionLockedError) and isinstance(tracked, ClusterTracked):
            tracked.lost = f"an append was refused: {one_line(exc)}"
            return True
        return False

    def elsewhere(self, run_id: str) -> str:
        return "" if run_id in self.book.runs else self.view.owner(run_id)

    async def give_up(self, tracked: Tracked, run: Run) -> None:
        assert isinstance(tracked, ClusterTracked)
        run_id = tracked.entry.run_id
        if not tracked.lost:
            await self._hold(tracked, run)
        if tracked.lost:  # another member owns it now: it is only listed from here on
            say(f"fisk-sm supervise: lost run {run_id}: {tracked.lost}")
            data = {"type": "RunLost", "run_id": run_id, "owner": self.owner}
            self.book.hub.publish("RunLost", run_id, {**data, "reason": tracked.lost})
            if self.book.runs.get(run_id) is tracked:
                del self.book.runs[run_id]
        self.room.set()

    async def claim(self, host: Host, run_id: str) -> bool:
        await self._claim(host, run_id, _RESUMES)
        return True

    async def abort(self, run_id: str) -> bool:
        every = frozenset({RELEASED, PARKED, OPERATOR_SUSPENDED, FAILED, ACTIVE})
        lease = await self.leases.acquire(run_id, breaking=every)
        if lease is None:
            owner = self.view.owner(run_id) or "another supervisor"
            raise Conflict(f"run {run_id} is driven by {owner}: abort it there")
        await self.leases.hold(lease, ABORTED)
        return True

    async def answer(
        self, host: Host, run_id: str, tool_use_id: str, approval: Approval
    ) -> Tracked:
        """Answer an approval of any member's run, once (decided in the bucket: a later answer
        gets `AlreadyAnswered`); a parked run nobody drives is resumed here (its lease taken),
        and finds the answer in the bucket when it asks again."""
        await host.refresh()
        if run_id not in host.runs and run_id not in self.remote.runs:  # listed too long ago?
            await self.remote.refresh(set(host.runs), fresh=True)
        tracked = host.get(run_id)
        if not await self.shared.answer_shared(run_id, tool_use_id, NAMES[approval]):
            # no question in the bucket: its run ended (its journal has the answer) or never
            # asked it
            await host.desk.refuse_answered(run_id, tool_use_id, host.records_of)
            raise NotFound(f"run {run_id} has no pending approval {tool_use_id!r}")
        if not tracked.live and not self.view.owner(run_id):
            with contextlib.suppress(Conflict):
                await self._claim(host, run_id, _ANSWER_RESUMES)
        return host.get(run_id)

    # -- keeping and losing runs ------------------------------------------------------------

    async def renew(self, tracked: ClusterTracked) -> bool:
        """Renew the run's lease; False if the run is lost (the caller stops it now: its next
        append, if it makes one, is refused by the fence, and `give_up` reports it)."""
        async with tracked.lease_lock:
            lease = tracked.lease
            if lease is None or tracked.lost:
                return True
            try:
                tracked.lease = await self.leases.renew(lease)
            except LeaseLost as exc:
                tracked.lost = str(exc)
            except _UNREACHABLE as exc:  # ours until it expires
                if time.time() >= lease.value.expires:
                    tracked.lost = f"the lease expired unrenewed ({one_line(exc)})"
            return not tracked.lost

    async def _hold(self, tracked: ClusterTracked, run: Run) -> None:
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

    # -- taking runs ------------------------------------------------------------------------

    def _track(self, host: Host, entry: RegistryEntry, config: AgentConfig) -> ClusterTracked:
        tracked = host._track(entry, config)
        assert isinstance(tracked, ClusterTracked)
        return tracked

    async def take_submission(self, host: Host, submission: Submission, message: Any) -> None:
        """Start a submitted run here (its lease taken first), or drop a redelivery."""
        run_id = submission.run_id
        try:
            lease = await self.leases.acquire(
                run_id, name=submission.name, config=submission.config
            )
            if lease is None:  # a redelivery of a run another member drives
                await message.ack()
                return
            entry = RegistryEntry(run_id, submission.name, submission.config, submission.created)
            try:
                agent = await host._config(submission.config)
            except (ValueError, OSError) as exc:  # its agent.yaml went bad since it was submitted
                say(f"fisk-sm supervise: run {run_id}: {one_line(exc)}")
                await self.leases.hold(lease, FAILED)
                await message.term()
                return
            tracked = self._track(host, entry, agent)
            tracked.lease = lease
            try:
                run = await start_session(
                    agent,
                    submission.prompt,
                    self.store,
                    host._options(run_id, tracked.sink),
                    run_id=run_id,
                )
            except SessionExistsError:  # a redelivery: its first taker died after creating it
                del host.runs[run_id]
                await message.ack()
                await self._continue(host, lease, entry)
                return
            # A boundary: the submission's run fails alone, its lease held `failed` and its
            # message acked, whatever stopped it starting (its tools, its journal, a bug), or
            # the lease would be renewed with no run behind it and the message redelivered.
            except Exception as exc:
                tracked.error = one_line(exc)
                await self._stopped_early(tracked)
                await message.ack()
                return
            host._launch(tracked, run)
            self.book.publish("RunSubmitted", tracked)
            await message.ack()
        except _NOT_TAKEN as exc:  # not taken (a server gone...): the submission comes again
            say(f"fisk-sm supervise: submission {run_id}: {one_line(exc)}")
        finally:
            self.taking.discard(run_id)

    async def _stopped_early(self, tracked: ClusterTracked) -> None:
        say(f"fisk-sm supervise: run {tracked.entry.run_id}: {tracked.error}")
        async with tracked.lease_lock:
            lease, tracked.lease = tracked.lease, None
        if lease is not None:
            with contextlib.suppress(*_UNREACHABLE, LeaseLost):
                await self.leases.hold(lease, FAILED)
        self.book.changed(tracked.entry.run_id)

    async def take_over(self, host: Host, run_id: str) -> None:
        """Take over a run whose lease expired or was released (if still takeable)."""
        try:
            lease = await self.leases.acquire(run_id)
            if lease is None:
                return
            await self._continue(host, lease, self._entry(lease))
        except _NOT_TAKEN as exc:  # the next expiry scan tries again
            say(f"fisk-sm supervise: takeover of {run_id}: {one_line(exc)}")
        finally:
            self.taking.discard(run_id)

    @staticmethod
    def _entry(lease: Lease) -> RegistryEntry:
        value = lease.previous
        name, config = (value.name, value.config) if value is not None else ("", "")
        return RegistryEntry(lease.run_id, name or lease.run_id, config, 0.0)

    async def _continue(self, host: Host, lease: Lease, entry: RegistryEntry) -> None:
        """Resume the session of a run whose lease we just took (from a dead owner, a
        shutdown, an operator), fencing its old owner out first if it may still be alive."""
        run_id = lease.run_id
        try:
            snapshot = await self.store.snapshot_async(run_id)
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
        tracked = host.runs.get(run_id)
        if not isinstance(tracked, ClusterTracked) or tracked.live:
            agent = await host._config(entry.config)
            entry = RegistryEntry(run_id, entry.name, entry.config, created)
            tracked = self._track(host, entry, agent)
        tracked.lease, tracked.lost, tracked.error = lease, "", None
        await host._resume(tracked)
        if not tracked.live:  # refused (a changed config...): nobody retries it blindly
            await self._stopped_early(tracked)

    async def _fence(self, run_id: str, why: str) -> None:
        for attempt in range(FENCE_TRIES):
            try:
                await self.store.take_over_async(run_id, why)
                return
            except SessionLockedError:  # the old owner appended meanwhile: read again
                if attempt == FENCE_TRIES - 1:
                    raise

    async def _claim(self, host: Host, run_id: str, breaking: frozenset[str]) -> None:
        lease = await self.leases.acquire(run_id, breaking=breaking)
        if lease is None:
            owner = self.view.owner(run_id) or "another supervisor"
            raise Conflict(f"run {run_id} is driven by {owner}")
        await self._continue(host, lease, self._entry(lease))

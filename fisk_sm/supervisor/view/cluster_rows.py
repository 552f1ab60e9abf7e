"""What a supervisor of a cluster shows of runs: its own, and every other supervisor's.

`ClusterTracked` is a `Tracked` that knows the lease bucket: a run driven here shows as usual,
a run of another supervisor shows its journal's fold (from the JetStream store) with the status
its lease gives it (`running` while its owner's lease is live), and every run names its
`owner` and its `name` from the lease bucket (which keeps an ended run's lease, held `ended`,
for that). `RemoteRuns` keeps those of other supervisors, re-read at most every `MAX_AGE`
seconds and only when a session has grown (a run's fold is cached until its journal changes),
plus the runs submitted here that no supervisor has started yet (`queued`); the member's
`RunBook` is given them (`RunBook(..., remote=RemoteRuns(...))`), and shows every member's
pending approvals from the cluster's `ApprovalsMirror`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.supervisor.cluster.lease import ABORTED, ENDED, OPERATOR_SUSPENDED, Lease, LeaseView
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.hub import EventHub, RunSink
from fisk_sm.supervisor.view.tracked import ENDED as ENDED_STATES
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.cluster.approvals import ApprovalsMirror

__all__ = ["MAX_AGE", "ClusterTracked", "NoRegistry", "RemoteRuns", "epoch"]

#: How old the listing of other supervisors' runs may be, in seconds.
MAX_AGE = 0.5


class NoRegistry:
    """A cluster's registry: the queue, the leases and the journals hold what a restart needs."""

    def load(self) -> dict[str, RegistryEntry]:
        return {}

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry:
        return RegistryEntry(run_id, name, config, time.time())

    async def mark(self, disposition: str, *run_ids: str) -> None:
        return None


class ClusterTracked(Tracked):
    """A run as one supervisor of a cluster shows it (driven here or elsewhere)."""

    def __init__(
        self,
        entry: RegistryEntry,
        config: AgentConfig,
        sink: RunSink,
        view: LeaseView,
        *,
        queued: bool = False,
    ) -> None:
        super().__init__(entry, config, sink)
        self.view = view
        self.placeholder = queued  # submitted, not started by any supervisor yet
        self.lease: Lease | None = None
        self.lease_lock = asyncio.Lock()
        self.lost = ""  # why the run is not ours any more ("" while it is)
        self.records = 0  # how many records the shown snapshot folds (a remote run's)

    @property
    def here(self) -> bool:
        """Whether this supervisor drives (or drove) the run."""
        return self.run is not None or self.task is not None

    def _status(self, live: bool, state: str) -> str:
        if self.placeholder:
            return "queued"
        shown = super()._status(live, state)
        if self.here:
            return shown
        lease = self.view.leases.get(self.entry.run_id)
        if lease is not None and lease.hold == ABORTED:
            return "aborted"
        if lease is not None and lease.hold == OPERATOR_SUSPENDED and shown == "parked":
            return "suspended"  # as `Tracked.status` says of its own runs
        if shown in ENDED_STATES or lease is None or lease.expired():
            return shown
        return "parked" if state == States.AWAITING_APPROVAL else "running"

    @property
    def name(self) -> str:
        """The run's name as its lease says (the lease outlives the run: `lease.ENDED`), else
        as it was submitted here: right on every supervisor, not only the one that took it."""
        value = self.view.leases.get(self.entry.run_id)
        return value.name if value is not None and value.name else self.entry.name

    @property
    def owner(self) -> str:
        """The supervisor whose live lease drives the run, or that drove it to its end; ""
        while none does."""
        value = self.view.leases.get(self.entry.run_id)
        if value is not None and value.hold == ENDED:
            return value.owner
        return self.view.owner(self.entry.run_id)


class RemoteRuns:
    """The runs of other supervisors, from the store's listing and the lease bucket."""

    def __init__(
        self, store: JetStreamStore, view: LeaseView, config: AgentConfig, mirror: ApprovalsMirror
    ) -> None:
        self.store = store
        self.view = view
        self.config = config
        self.mirror = mirror
        self.runs: dict[str, ClusterTracked] = {}
        self._hub = EventHub()  # remote runs publish nothing: a sink needs somewhere to go
        self._read = 0.0
        self._lock = asyncio.Lock()

    def _tracked(self, entry: RegistryEntry, *, queued: bool = False) -> ClusterTracked:
        sink = RunSink(entry.run_id, self._hub, lambda run_id: None)
        return ClusterTracked(entry, self.config, sink, self.view, queued=queued)

    def local(self, entry: RegistryEntry, config: AgentConfig, sink: RunSink) -> ClusterTracked:
        """The row of a run this member drives."""
        return ClusterTracked(entry, config, sink, self.view)

    def approvals(self) -> list[dict[str, Any]]:
        """Every member's pending approvals, as the API's `Approval` JSON."""
        return self.mirror.pending_shared()

    def queued(self, entry: RegistryEntry) -> ClusterTracked:
        """A run submitted here that no supervisor has started yet."""
        tracked = self.runs[entry.run_id] = self._tracked(entry, queued=True)
        return tracked

    async def refresh(self, local: set[str], *, fresh: bool = False) -> None:
        """Re-read the listing if it is older than `MAX_AGE`, or at once if `fresh` (runs in
        `local` are skipped)."""
        async with self._lock:
            if not fresh and time.monotonic() - self._read < MAX_AGE:
                return
            infos = await self.store.list_async()
            self._read = time.monotonic()
            listed = {info.run_id for info in infos}
            for run_id, tracked in list(self.runs.items()):
                if run_id in local or (run_id not in listed and not tracked.placeholder):
                    del self.runs[run_id]
            stale = [i for i in infos if i.run_id not in local and self._stale(i.run_id, i.records)]
            for info in stale:
                try:
                    snapshot = await self.store.snapshot_async(info.run_id)
                except JournalError:
                    continue
                lease = self.view.leases.get(info.run_id)
                config = lease.config if lease is not None else ""
                # the name: the lease's, when the row is shown (`ClusterTracked.name`)
                entry = RegistryEntry(info.run_id, info.run_id, config, epoch(snapshot.created))
                tracked = self._tracked(entry)
                tracked.snapshot, tracked.records = snapshot, info.records
                self.runs[info.run_id] = tracked

    def _stale(self, run_id: str, records: int) -> bool:
        found = self.runs.get(run_id)
        return found is None or found.placeholder or found.records != records


def epoch(created: str) -> float:
    """Epoch seconds of a meta record's `created` (now, if it cannot be read)."""
    try:
        return time.mktime(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except ValueError:
        return time.time()

"""The supervisor's read side: looking runs up, listing them, their pending approvals, the
events that announce a row's change, and what a shutdown leaves behind.

Every row is `Tracked.row` (`fisk_sm.supervisor.view.tracked`): the live run while a task drives
it, else its journal's fold, with the registry's (a cluster: the lease's) name and disposition.
`RunBook` is the read model the host keeps (`Host.book`); the host drives the runs. A cluster
member's book is given the rows of the other members' runs (`remote`: `view.cluster_rows`).

A park is announced once: `RunParked` when a run comes to wait for an approval it was not
already announced waiting for; the other changes of a parked row (the desk taking the question,
a shutdown stopping the task that waits) change nothing a listing shows, and send nothing.
A row is taken for the stream only if someone may read it (`EventHub.watches`), its JSON built
only when read; a listing builds its rows when it is read.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.states import States
from fisk_sm.journal.filestore import FileStore, check_run_id
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.journal.records import Record
from fisk_sm.journal.snapshot import Snapshot
from fisk_sm.supervisor.errors import NotFound
from fisk_sm.supervisor.interface import RunRow, approval_json
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.hub import EventHub, RunSink
from fisk_sm.supervisor.view.rows import approval_of
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.view.cluster_rows import RemoteRuns

__all__ = ["Leftover", "RunBook", "resumes"]

#: The journal statuses a restart (or a takeover) resumes from.
RESUMABLE_JOURNALS = frozenset({"open", States.SUSPENDED})


def resumes(tracked: Tracked) -> bool:
    """Whether the next start resumes a run no task drives: its registry's last word allows it
    and its journal neither ended nor waits for an answer (a parked run waits for its
    operator)."""
    folded = tracked.folded
    return (
        tracked.entry.resumable
        and folded is not None
        and folded.status in RESUMABLE_JOURNALS
        and folded.state != States.AWAITING_APPROVAL
    )


@attrs.frozen
class Leftover:
    """What a stopped supervisor leaves for the next start, counted apart: runs it resumes,
    runs parked for an approval, runs an operator suspended (only listed until resumed)."""

    resuming: int
    parked: int
    suspended: int


class RunBook:
    """A host's runs (`runs`, announced on `hub`, their journals in `store`), whoever drives
    them: looked up, listed, and their changes published; with `remote`, other members' too."""

    def __init__(
        self,
        hub: EventHub,
        store: FileStore | JetStreamStore,
        remote: RemoteRuns | None = None,
    ) -> None:
        self.hub = hub
        self.store = store
        self.remote = remote
        self.runs: dict[str, Tracked] = {}

    def tracked(self, entry: RegistryEntry, config: AgentConfig, sink: RunSink) -> Tracked:
        """The row of a run the host drives (a cluster's names its lease)."""
        if self.remote is None:
            return Tracked(entry, config, sink)
        return self.remote.local(entry, config, sink)

    async def refresh(self) -> None:
        """Bring the rows of other members' runs up to date (a lone host has none)."""
        if self.remote is not None:
            await self.remote.refresh(set(self.runs))

    # -- the stream -------------------------------------------------------------------------

    def publish(self, kind: str, tracked: Tracked) -> None:
        """Send a supervisor event (`RunSubmitted`, `RunParked`, `RunUpdated`) with the run:
        its row taken now, its JSON built when read (nothing at all while unwatched)."""
        run_id = tracked.entry.run_id
        self._send(kind, run_id, tracked.row() if self.hub.watches(run_id) else None)

    def _send(self, kind: str, run_id: str, row: RunRow | None) -> None:
        if row is None:  # unwatched
            self.hub.skip()
        else:
            self.hub.publish(kind, run_id, partial(row.event_json, kind))

    def changed(self, run_id: str) -> None:
        """The row of `run_id` may have changed (a state entered, the desk, an action):
        announce it if it did, and someone may read it."""
        tracked, hub = self.runs.get(run_id), self.hub
        if tracked is None or not hub.numbering:
            return  # nothing held, nobody ever subscribed: nothing is announced
        # a state entered takes the row once: the event's, and its status (else asked alone)
        row = tracked.row() if hub.watches(run_id) else None
        if (row.status if row is not None else tracked.status) != "parked":
            tracked.announced = None
            self._send("RunUpdated", run_id, row)
            return
        approval = row.approval if row is not None else tracked.approval
        park = approval.tool_use_id if approval is not None else ""
        if tracked.announced == park:
            return  # this park was announced: nothing a listing shows has changed
        tracked.announced = park
        self._send("RunParked", run_id, row)

    # -- looking runs up --------------------------------------------------------------------

    async def snapshot_of(self, run_id: str) -> Snapshot:
        """The folded journal of `run_id`, read off the loop."""
        if isinstance(self.store, FileStore):
            return await asyncio.to_thread(self.store.snapshot, run_id)
        return await self.store.snapshot_async(run_id)

    async def records_of(self, run_id: str) -> list[Record]:
        """The journal of `run_id`, read off the loop."""
        if isinstance(self.store, FileStore):
            return await asyncio.to_thread(self.store.load, run_id)
        return await self.store.load_async(run_id)

    def get(self, run_id: str) -> Tracked:
        """The run `run_id`; `InvalidIdError` for a malformed id, `NotFound` for an unknown."""
        check_run_id(run_id)
        tracked = self.runs.get(run_id)
        if tracked is None and self.remote is not None:
            tracked = self.remote.runs.get(run_id)
        if tracked is None:
            raise NotFound(f"no run {run_id!r}")
        return tracked

    def listing(self) -> list[Tracked]:
        """Every run, newest first."""
        every = self.runs if self.remote is None else {**self.remote.runs, **self.runs}
        return sorted(every.values(), key=lambda t: (-t.entry.created, t.entry.run_id))

    def approvals(self) -> list[dict[str, Any]]:
        """Every pending approval: of live runs at the desk, and of parked sessions (a
        cluster's: every member's, as its approvals bucket has them)."""
        if self.remote is not None:
            return self.remote.approvals()
        found = []
        for tracked in self.listing():
            approval = approval_of(tracked.approval)
            if approval is not None and tracked.status == "parked":
                found.append(approval_json(approval))
        return found

    def leftover(self) -> Leftover:
        """What the runs no task drives wait for (after a shutdown: what the next start finds)."""
        idle = [t for t in self.runs.values() if not t.live]
        parked = sum(t.status == "parked" for t in idle)
        resuming = sum(resumes(t) for t in idle)
        suspended = sum(t.status == "suspended" and not resumes(t) for t in idle)
        return Leftover(resuming=resuming, parked=parked, suspended=suspended)

"""`Ownership`: what a host asks of whoever decides which process drives a run.

`FileOwnership` is a lone host's (or a worker's): the registry (runs.jsonl) says what a restart
resumes, and the session's own lock (`<id>.lock`, an flock the kernel drops when its holder
dies) keeps a second process from driving a run; an answer is taken at this host's desk. A NATS
member owns runs by lease instead (`fisk_sm.supervisor.host.leased.LeaseOwnership`), and its
approvals are answered in the cluster's bucket (`shared`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fisk_sm.loop.run import Run
from fisk_sm.operator.prompter import Approval
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.host.registry import RegistryEntry, RunRegistry
from fisk_sm.supervisor.view.entry import RESUMED
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.cluster.approvals import ApprovalsMirror
    from fisk_sm.supervisor.host.host import Host

__all__ = ["FileOwnership", "Intake", "Ownership"]


class Intake(Protocol):
    """How a host takes runs in besides its own submits (a cluster member's: `QueueIntake`,
    from the work queue and expired leases), started and stopped with the host."""

    async def start(self, host: Host) -> None: ...

    async def stop(self) -> None: ...

    async def submit(
        self, host: Host, prompt: str, name: str | None, config: str | None, *, chat: bool,
        run_id: str | None,
    ) -> Tracked:  # fmt: skip
        """A new run, put where a member with room starts it."""
        ...


class Ownership(Protocol):
    """Who drives which run."""

    @property
    def registry(self) -> RunRegistry:
        """Where submissions and dispositions are recorded."""
        ...

    @property
    def shared(self) -> ApprovalsMirror | None:
        """The approvals every member of a cluster answers (None: this host's desk only)."""
        ...

    @property
    def resumable(self) -> frozenset[str]:
        """The statuses of the runs an operator's resume takes."""
        ...

    async def take(self, entry: RegistryEntry) -> bool:
        """Whether this host may start or resume the run now."""
        ...

    async def give_up(self, tracked: Tracked, run: Run) -> None:
        """The task driving `run` ended here."""
        ...

    def refused(self, tracked: Tracked, exc: Exception) -> bool:
        """Whether `exc` (a step raised it) means the run was lost, not that it failed."""
        ...

    def elsewhere(self, run_id: str) -> str:
        """The member that drives a run this host does not ("" if none)."""
        ...

    async def claim(self, host: Host, run_id: str) -> bool:
        """An operator's resume: True if the run was taken and resumed (its lease), False if
        the host resumes it itself."""
        ...

    async def abort(self, run_id: str) -> bool:
        """Abort a run no task drives here: True if done (its lease held `aborted`), False if
        the host marks it itself."""
        ...

    async def answer(
        self, host: Host, run_id: str, tool_use_id: str, approval: Approval
    ) -> Tracked:
        """Answer a pending approval of `host`'s run, once (a later answer: `AlreadyAnswered`)."""
        ...


class FileOwnership:
    """Runs owned through `registry` and the sessions' locks: whatever this host holds."""

    shared = None
    resumable = frozenset({"suspended", "parked"})

    def __init__(self, registry: RunRegistry) -> None:
        self.registry = registry

    async def take(self, entry: RegistryEntry) -> bool:
        return True

    async def give_up(self, tracked: Tracked, run: Run) -> None:
        return None

    def refused(self, tracked: Tracked, exc: Exception) -> bool:
        return False

    def elsewhere(self, run_id: str) -> str:
        return ""

    async def claim(self, host: Host, run_id: str) -> bool:
        return False

    async def abort(self, run_id: str) -> bool:
        return False

    async def answer(
        self, host: Host, run_id: str, tool_use_id: str, approval: Approval
    ) -> Tracked:
        """At this host's desk; a parked session that no task drives is resumed, and its
        renewed question finds the answer."""
        tracked, desk = host.get(run_id), host.desk
        pending = tracked.approval
        asked = pending is not None and pending.tool_use_id == tool_use_id
        if desk.waiting(run_id, tool_use_id) or (asked and tracked.live):
            desk.claim(run_id, tool_use_id, approval)  # before any await: the first one wins
            desk.answer(run_id, tool_use_id, approval)  # else the run finds it when it asks
            return tracked
        if not asked:  # answered (here, or as its journal says), or never asked
            await desk.refuse_answered(run_id, tool_use_id, host.records_of)
            raise NotFound(f"run {run_id} has no pending approval {tool_use_id!r}")
        if tracked.status != "parked" or host.closing:
            raise Conflict(f"run {run_id} cannot take an answer (status {tracked.status})")
        desk.claim(run_id, tool_use_id, approval)
        try:
            await desk.refuse_answered(run_id, tool_use_id, host.records_of, own=True)
            await self.registry.mark(RESUMED, run_id)
            host._mark(tracked, RESUMED)
            if not tracked.live:  # an operator's resume may have started it meanwhile
                await host._resume(tracked)
        finally:
            if not tracked.live:  # the answer never reached the run: it is pending again
                desk.release(run_id, tool_use_id)
        return tracked

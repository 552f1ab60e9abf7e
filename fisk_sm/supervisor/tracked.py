"""`Tracked`: one run of the supervisor, as the API shows it, whether a task drives it or not."""

from __future__ import annotations

import asyncio
from typing import Any

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage
from fisk_sm.journal.snapshot import PendingApproval, Snapshot
from fisk_sm.loop.run import Run
from fisk_sm.model.blocks import Message
from fisk_sm.supervisor.hub import RunSink
from fisk_sm.supervisor.registry import ABORTED, RegistryEntry
from fisk_sm.supervisor.views import approval_json, run_json

__all__ = ["ENDED", "Tracked"]

ENDED = frozenset(
    {States.COMPLETED, States.FAILED, States.BUDGET_EXHAUSTED, States.ITERATIONS_EXHAUSTED}
)


class Tracked:
    """One run of the supervisor: its registry entry, and its live run while a task drives it."""

    def __init__(self, entry: RegistryEntry, config: AgentConfig, sink: RunSink) -> None:
        self.entry = entry
        self.config = config
        self.sink = sink
        self.run: Run | None = None
        self.task: asyncio.Task[None] | None = None
        self.snapshot: Snapshot | None = None  # the folded journal, while no task drives it
        self.queued = True  # waiting for a slot (a new run counts as queued until its first)
        self.stopping = asyncio.Event()  # a suspend-now: stop waiting for a slot
        self.error: str | None = None

    @property
    def live(self) -> bool:
        """Whether a task drives the run now."""
        return self.task is not None and not self.task.done()

    @property
    def state(self) -> str:
        if self.live and self.run is not None:
            return self.run.state
        if self.snapshot is not None:
            return self.snapshot.state
        return self.run.state if self.run is not None else States.SUSPEND_CHECK

    @property
    def approval(self) -> PendingApproval | None:
        if self.live and self.run is not None:
            return self.run.data.approval
        return self.snapshot.approval if self.snapshot is not None else None

    @property
    def status(self) -> str:
        """The API's status of the run (see `fisk_sm.supervisor.views.STATUSES`)."""
        state = self.state
        if self.entry.disposition == ABORTED:
            return "aborted"
        if state == States.AWAITING_APPROVAL:
            return "parked"
        if state == States.AWAITING_INPUT and self.live:
            return "waiting"  # a chat waiting for its user's next prompt
        if self.live and not (self.run is not None and self.run.ended):
            return "queued" if self.queued else "running"  # until its end is journaled
        if self.error is not None:
            return "failed"
        return state if state in ENDED else "suspended"

    def to_json(self) -> dict[str, Any]:
        """The API's `Run` object."""
        source = self.run.data if self.live and self.run is not None else self.snapshot
        run = self.run
        if source is None and run is not None:
            source = run.data
        finished = run is not None and run.finished
        outcome = run.outcome if finished and run is not None else None
        if outcome is None and self.snapshot is not None:
            outcome = self.snapshot.outcome
        answer = run.answer() if run is not None else ""
        return run_json(
            run_id=self.entry.run_id,
            name=self.entry.name,
            state=self.state,
            status=self.status,
            iteration=source.iteration if source is not None else 0,
            usage=source.usage if source is not None else Usage(),
            created=self.entry.created,
            approval=approval_json(self.approval),
            outcome=self.error or outcome,
            answer=answer,
        )

    def messages(self) -> tuple[Message, ...]:
        """The conversation so far."""
        if self.run is not None and (self.live or self.snapshot is None):
            return tuple(self.run.data.messages)
        return self.snapshot.messages if self.snapshot is not None else ()

"""`Tracked`: one run of the supervisor, as the API shows it, whether a task drives it or not.

The read model of a run is here, in one place (`Tracked.row`, what every listing, the run's
page, the action replies and the `RunSubmitted`/`RunUpdated`/`RunParked` events send): while a
task drives the run, its live data; else its journal's fold (`snapshot`, folded once into
`folded` when it is set), with the name and disposition of the registry (or, in a cluster, the
lease: `ClusterTracked` overrides `name` and `owner`). So a row is the same on any supervisor,
after a restart and after a takeover: nothing in it is known only to the process that ran it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fisk_sm.client.records import Tokens
from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage
from fisk_sm.journal.snapshot import PendingApproval, Snapshot
from fisk_sm.loop.run import Run
from fisk_sm.model.blocks import Message
from fisk_sm.supervisor.interface import RunRow
from fisk_sm.supervisor.view.entry import ABORTED, OPERATOR_SUSPENDED, RegistryEntry
from fisk_sm.supervisor.view.hub import RunSink
from fisk_sm.supervisor.view.rows import Folded, approval_of, tokens_of

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
        self._snapshot: Snapshot | None = None
        self.folded: Folded | None = None  # what the row shows of `snapshot`
        self.queued = True  # waiting for a slot (a new run counts as queued until its first)
        self.stopping = asyncio.Event()  # a suspend-now: stop waiting for a slot
        self.error: str | None = None
        self.announced: str | None = None  # the approval whose park `RunParked` announced
        self._tokens: tuple[Usage, Tokens] | None = None  # the last row's: a usage, its tokens

    @property
    def snapshot(self) -> Snapshot | None:
        """The folded journal, shown while no task drives the run."""
        return self._snapshot

    @snapshot.setter
    def snapshot(self, snapshot: Snapshot | None) -> None:
        # the row's facts are folded here, once per snapshot, not on every listing
        self._snapshot = snapshot
        self.folded = Folded.of(snapshot) if snapshot is not None else None

    @property
    def name(self) -> str:
        """The run's name (the registry's; a cluster's lease has it too)."""
        return self.entry.name

    @property
    def owner(self) -> str | None:
        """The supervisor that drives the run ("" while none does); None: not in a cluster."""
        return None

    @property
    def live(self) -> bool:
        """Whether a task drives the run now."""
        task = self.task
        return task is not None and not task.done()

    async def driven(self) -> bool:
        """Whether a task drives the run, after waiting for one whose run has ended (its end is
        journaled and shown, and the task is finishing: an operator may resume it next)."""
        task, run = self.task, self.run
        if task is not None and not task.done() and run is not None and run.ended:
            await asyncio.wait({task})
        return self.live

    @property
    def state(self) -> str:
        """The loop state: the live run's, else the journal's."""
        return self._state(self.live)

    def _state(self, live: bool) -> str:
        run = self.run
        if live and run is not None:
            return run.state
        if self.folded is not None:
            return self.folded.state
        return run.state if run is not None else States.SUSPEND_CHECK

    @property
    def approval(self) -> PendingApproval | None:
        """The approval the run waits for (live, or as its journal says)."""
        return self._approval(self.live)

    def _approval(self, live: bool) -> PendingApproval | None:
        if live and self.run is not None:
            return self.run.data.approval
        return self.folded.approval if self.folded is not None else None

    @property
    def status(self) -> str:
        """The API's status of the run (see `fisk_sm.supervisor.interface.STATUSES`)."""
        live = self.live
        return self._status(live, self._state(live))

    def _status(self, live: bool, state: str) -> str:
        """`status`, of the run `live` or not, in `state` (each asked once by the caller)."""
        if self.entry.disposition == ABORTED:
            return "aborted"
        if state == States.AWAITING_APPROVAL:
            # an operator's suspend of a parked run: its journal still waits for the answer,
            # but nobody may give it until an operator resumes the run
            idle = not live and self.entry.disposition == OPERATOR_SUSPENDED
            return "suspended" if idle else "parked"
        if live:
            if state == States.AWAITING_INPUT:
                return "waiting"  # a chat waiting for its user's next prompt
            run = self.run
            if not (run is not None and run.ended):
                return "queued" if self.queued else "running"  # until its end is journaled
        if self.error is not None:
            return "failed"
        return state if state in ENDED else "suspended"

    def row(self) -> RunRow:
        """The run's row as it is now (what `to_json` shows; the stream keeps it unencoded)."""
        run, folded, live = self.run, self.folded, self.live
        if run is not None and (live or folded is None):
            data = run.data
            iteration, usage = data.iteration, data.usage
            outcome = run.outcome if run.finished else None
            answer = run.answer()
        elif folded is not None:
            iteration, usage, outcome, answer = (
                folded.iteration,
                folded.usage,
                folded.outcome,
                folded.answer,
            )
        else:
            iteration, usage, outcome, answer = 0, Usage(), None, ""
        state = self._state(live)
        approval = self._approval(live)
        return RunRow(
            run_id=self.entry.run_id,
            name=self.name,
            state=state,
            status=self._status(live, state),
            iteration=iteration,
            tokens=self._tokens_of(usage),
            created=self.entry.created,
            approval=None if approval is None else approval_of(approval),
            outcome=self.error or outcome,
            answer=answer,
            owner=self.owner,
            at=time.time(),
        )

    def _tokens_of(self, usage: Usage) -> Tokens:
        # a row per state entered: the usage changes once per model call (both are frozen)
        seen = self._tokens
        if seen is None or seen[0] is not usage:
            seen = self._tokens = (usage, tokens_of(usage))
        return seen[1]

    def to_json(self) -> dict[str, Any]:
        """The API's `Run` object (with `owner` in a cluster), built now."""
        return self.row().to_json()

    def messages(self) -> tuple[Message, ...]:
        """The conversation so far."""
        if self.run is not None and (self.live or self.snapshot is None):
            return tuple(self.run.data.messages)
        return self.snapshot.messages if self.snapshot is not None else ()

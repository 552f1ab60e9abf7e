"""The path a session took through the machine, derived from its journal alone.

`session_path(records)` replays a journal through the loop table: a private `transitions`
Machine built from the same table (`fisk_sm.machine.evaluator.build_machine`) is fired once per
transition, and its guards read what the journal shows instead of a live run. Nothing is
journaled for the path: it costs the journal no byte and no fsync.

How the records map to the machine (the table declares it: each state's `journals:` and
`resume:`, each guard's `replay:`; `fisk_sm.machine.reading` derives the replay from them):

- `meta` enters the initial state (`suspend_check`);
- the `journal` state's action consumes one `assistant` record, the `gate` state's the
  `approval_requested` of the first pending call (when the operator was asked),
  `awaiting_approval`'s its `approval_answered` (absent when a suspend cut the wait), and the
  `execute` state's one tool of the turn: its `tool_started` (absent for a rejected or denied
  call) and its `tool_result`;
- a `terminal` record is consumed as the run enters the terminal state it names; when records
  follow it, the session was resumed: a `resume` step leads from the terminal state to the
  state `fold` resumes in;
- a `user` record (a chat's follow-up) is read at `awaiting_input` (at `suspend_check` in a
  journal that is not a chat's).

A chat (its meta is `interactive`) enters `awaiting_input` where a one-shot run would end: from
`decide` by the replayed `chat_turn_ended`, and from `suspend_check` (`chat_turn_stopped`) or
`call` (`chat_call_failed`) when the next record shows the chat at its prompt: a `user` record,
or the `suspended` record of a chat suspended there (its message is `AT_INPUT`). A failed call
journals nothing, but it counts: the next `assistant` record's `iteration` is then two above
the replay's at that boundary, one above when the turn stopped there (its iterations used up,
or an interrupt); with no later turn to tell, the replay takes the boundary's exit. It leaves
`awaiting_input` to `suspend_check` by a follow-up, to `suspended` by that record, or to
`completed` (`input_ended`) by a `completed` record.

Guards over the turn (`turn_unusable`, `turn_is_final`, `tools_pending`) are the real ones,
evaluated on the replayed turn. Guards over facts a run never journals (a suspend request, a
failed call, the budgets) hold exactly when the next record is the terminal record they lead
to. A suspend-now that cut the call in flight journals nothing of the call: its `suspended`
record, whose message is `CALL_CANCELLED`, is read as the `call_cancelled` exit of `call`, any
other `suspended` record as a boundary's `suspend_requested`. With no record left the replay
stops where `fold` would resume (`suspend_check`, `decide`, `gate`, `awaiting_approval`, or
`execute` for a tool without a result), so an open session's current state is its resume
state. A crash leaves no record, so what a killed process did after its last durable record is
not on the path (a tool started twice shows as a `resume` of `execute`). A run taken over by a
new owner (its `suspended` record says `taken over`, and may come anywhere, even mid-batch)
enters `suspended` by `taken_over`, then `resume`s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.fold import approval_of, fold
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    is_takeover,
)
from fisk_sm.journal.snapshot import RunData, tool_uses
from fisk_sm.machine.evaluator import Predicate
from fisk_sm.machine.guards import GUARDS
from fisk_sm.machine.reading import Reading, ReplayRun, reading
from fisk_sm.machine.table import Table, load_table
from fisk_sm.model.blocks import message_of

__all__ = ["RESUME", "TAKEOVER", "PathError", "PathStep", "SessionPath", "session_path"]

#: The trigger of the step from a terminal state to where a resumed session continued.
RESUME = "resume"
#: The trigger of the step into `suspended` where another owner took the run over (anywhere:
#: the old owner's lease had expired), before its `resume`.
TAKEOVER = "taken_over"


class PathError(JournalError):
    """The records do not form a path through the machine; the message names the record."""


@attrs.frozen
class PathStep:
    """One entry into a state: from `source` by `trigger` through the exit guarded by `guard`.

    The first step of a path enters the initial state and has no source or trigger; a
    `resume` step leads from a terminal state to where the resumed session continued.
    `iteration` is the run's count of model calls started at the entry (as `StateEntered`
    has it); `seq` is the last journal record read when the step was taken.
    """

    destination: str
    source: str | None = None
    trigger: str | None = None
    guard: str | None = None
    iteration: int = 0
    seq: int = 0

    @property
    def edge(self) -> tuple[str, str, str] | None:
        """(source, trigger, destination), or None for the entry into the initial state."""
        if self.source is None or self.trigger is None:
            return None
        return (self.source, self.trigger, self.destination)


@attrs.frozen
class SessionPath:
    """The states a session entered, in order, and where it is now."""

    run_id: str
    steps: tuple[PathStep, ...]

    @property
    def states(self) -> tuple[str, ...]:
        """The states entered, in order (what a `Recorder` of every run of it saw)."""
        return tuple(s.destination for s in self.steps)

    @property
    def current(self) -> str:
        """The state the session is in: a terminal state, or where a resume continues."""
        return self.steps[-1].destination

    @property
    def edges(self) -> tuple[tuple[str, str, str], ...]:
        """Every transition taken, as (source, trigger, destination), in order."""
        return tuple(e for e in (s.edge for s in self.steps) if e is not None)

    def transition_counts(self) -> Counter[tuple[str, str, str]]:
        """How many times each transition fired, `resume` steps included."""
        return Counter(self.edges)

    def state_counts(self) -> Counter[str]:
        """How many times each state was entered."""
        return Counter(self.states)


def _describe(record: Record | None) -> str:
    if record is None:
        return "the end of the journal"
    kind = type(record).__name__
    if isinstance(record, Terminal):
        kind = f"{record.reason} {kind}"
    return f"{kind} record (seq {record.seq})"


class _Walk:
    """The replay of one journal: a cursor over its records and the steps taken so far."""

    def __init__(self, records: Sequence[Record], table: Table, reading: Reading) -> None:
        meta = records[0] if records else None
        if not isinstance(meta, Meta):
            raise PathError("the journal does not start with a meta record")
        self.records = records
        self.table, self.reading = table, reading
        self.machine = reading.machine
        self.run = ReplayRun(table.initial, RunData.begin(meta.run_id, meta.prompt))
        self.run.data.chat = meta.interactive
        self.at = 1
        self.steps = [PathStep(table.initial, seq=meta.seq)]

    @property
    def ahead(self) -> Record | None:
        return self.records[self.at] if self.at < len(self.records) else None

    def take(self) -> Record:
        record = self.records[self.at]
        self.at += 1
        return record

    def enter(self, dest: str, source: str, trigger: str, guard: str | None) -> None:
        seq = self.records[self.at - 1].seq
        iteration = self.run.data.iteration
        self.steps.append(PathStep(dest, source, trigger, guard, iteration, seq))

    def fail(self, expected: str, state: str | None = None) -> PathError:
        """The error for a record that cannot come next (`state`: the replay's, by default)."""
        return PathError(
            f"{self.run.data.run_id}: expected {expected} in state {(state or self.run.state)!r},"
            f" found {_describe(self.ahead)}"
        )

    def walk(self) -> SessionPath:
        """Replay every record; stop at the end, in a terminal or a resting state."""
        machine = self.machine
        # Every pass through the table between two records is shorter than the table: a
        # journal that folds but makes the replay circle without taking a record is refused.
        limit, idle, last = 2 * len(machine.table.states) + 2, 0, self.at
        while True:
            idle = idle + 1 if self.at == last else 0
            last = self.at
            if idle > limit:
                raise self.fail("a record that moves the run on")
            state = self.run.state
            if machine.is_terminal(state):
                if self.ahead is None:
                    break
                self.resume(state)
                continue
            if self.ahead is None and state in self.reading.resting and not self.answered(state):
                break
            if self.taken_over(state):
                continue
            if not self.act(state):
                break
            self.fire(state)
        return SessionPath(self.run.data.run_id, tuple(self.steps))

    def answered(self, state: str) -> bool:
        """A state a fold leaves a run in unless a guard holds on the turn (`resume: {unless:
        g}`): a chat whose journal ends on its answer rests at its prompt, not in `decide`."""
        unless = self.reading.rest_unless.get(state)
        return unless is not None and unless(self.run)

    def taken_over(self, state: str) -> bool:
        """Consume a takeover record ahead (after the intent of a tool that was running when
        the old owner lost the run, if any) as an entry into `suspended` from `state`."""
        skip = 0
        if "tool_started" in self.reading.reads[state, False] and isinstance(
            self.ahead, ToolStarted
        ):
            skip = 1
        at = self.at + skip
        if at >= len(self.records) or not is_takeover(self.records[at]):
            return False
        self.at = at + 1
        self.run.state = States.SUSPENDED
        self.enter(States.SUSPENDED, state, TAKEOVER, None)
        return True

    def act(self, state: str) -> bool:
        """Consume what the action of `state` journals; False if its records are not all
        there yet (a tool that was still running)."""
        ahead = self.ahead
        reads = self.reading.reads[state, self.run.data.chat]  # what the table says it journals
        if "user" in reads and isinstance(ahead, User):
            self.take()
            self.run.data.pending, self.run.data.stop_reason = [], None
            self.run.data.follow_ups += 1
        elif "assistant" in reads:
            if not isinstance(ahead, Assistant):
                raise self.fail("an assistant record")
            self.take()
            data = self.run.data
            data.stop_reason = ahead.stop_reason
            data.pending = tool_uses(message_of(ahead.message))
        elif "approval_requested" in reads:
            self.screen()
        elif "approval_answered" in reads:
            answer = self.ahead
            if isinstance(answer, ApprovalAnswered):
                self.take()
                self.run.data.approval = None
        elif "tool_result" in reads:
            return self.execute()
        return True

    def screen(self) -> None:
        """Consume the request the gate journaled for the first pending call, if it asked."""
        pending = self.run.data.pending
        if not pending:
            raise self.fail("a pending tool call")
        ahead = self.ahead
        if isinstance(ahead, ApprovalRequested) and ahead.tool_use_id == pending[0].id:
            self.take()
            self.run.data.approval = approval_of(ahead)

    def execute(self) -> bool:
        """Consume the first pending tool's records; False while its result is missing."""
        pending = self.run.data.pending
        if not pending:
            raise self.fail("a pending tool call")
        use_id = pending[0].id
        ahead = self.ahead
        if isinstance(ahead, ToolStarted) and ahead.tool_use_id == use_id:
            self.take()
            again = self.ahead
            if again is None:
                return False
            if isinstance(again, ToolStarted) and again.tool_use_id == use_id:
                # started twice: the process died while the tool ran and a resume retried it
                self.enter(self.run.state, self.run.state, RESUME, None)
                return self.execute()
        ahead = self.ahead
        if not (isinstance(ahead, ToolResult) and ahead.tool_use_id == use_id):
            raise self.fail(f"the result of tool call {use_id}")
        self.take()
        pending.pop(0)
        return True

    def fire(self, source: str) -> None:
        """Fire the trigger of `source` through the replay machine and note the step; entering
        a terminal state consumes its terminal record."""
        run = self.run
        run.ahead = self.ahead
        run.records, run.at = self.records, self.at
        step = self.machine.step(run)
        if source in self.reading.counting and step.guard not in self.reading.cut:
            run.data.iteration += 1  # a cancelled call does not count (`call_model` says why)
        dest = step.destination
        if self.machine.is_terminal(dest):
            ahead = self.ahead
            if not (isinstance(ahead, Terminal) and ahead.reason == dest):
                raise self.fail(f"a {dest} terminal record", source)
            self.take()
        self.enter(dest, source, step.trigger, step.guard)

    def resume(self, state: str) -> None:
        """Records follow terminal `state`: the session was resumed where `fold` says."""
        if state == States.COMPLETED:
            raise self.fail("nothing after completed")
        snapshot = fold(self.records[: self.at], self.table)
        self.run.state = snapshot.state
        data = snapshot.data()
        self.run.data = data
        seq = self.records[self.at - 1].seq
        self.steps.append(PathStep(snapshot.state, state, RESUME, None, data.iteration, seq))


def session_path(
    records: Sequence[Record],
    table: Table | None = None,
    guards: Mapping[str, Predicate] | None = None,
) -> SessionPath:
    """The path the session journaled in `records` (meta first) took through `table` (the
    loop table by default), whose guards replayed on the turn are the real `guards` (the
    loop's, and those of an extended table: as its runs' machine has them). Raises
    `PathError` if the records cannot be such a path."""
    table = table or load_table()
    real = frozenset({**GUARDS, **(guards or {})}.items())
    return _Walk(records, table, reading(table, real)).walk()

"""`fold`: the pure function from journal records to the snapshot a run resumes from.

Resume is a fold followed by continuing from the folded state, so the state a journal folds to
says where the run picks up:

- no assistant turn yet, or the last turn fully answered: `suspend_check` (the next boundary);
- the last turn journaled but none of its tools started: `decide`, so that the turn is classified
  and the budget checked again before any tool runs (a crash between the journal write and the
  terminal record cannot skip the budget);
- some tools of the last turn answered, started or put to the operator: the first unanswered
  call says where. Started without a result: `execute`, the call *interrupted* (its crash policy
  decides whether it runs again). Asked (`approval_requested`) and not answered:
  `awaiting_approval`, the request pending again, never denied. Answered: `execute` (a "no"
  hands back its denial). Otherwise `gate`, which screens it afresh.
- An "always" answer is remembered for the rest of the run (`allowed`).

A `completed` terminal record makes the state `completed`; any other terminal record leaves the
structural state, so a suspended, budget-stopped or failed run can be resumed. Only the last
terminal record counts.

A chat session (its meta is `interactive`) waits for the user's next prompt when its last turn
is an answer (no tool_use, not pause_turn), or when it was suspended at the prompt (its
`suspended` record says `AT_INPUT`): it resumes in `awaiting_input`, with no model call. Each
`user` record (a follow-up, holding only the new text) commits the open turn and is merged into
a trailing user message; the fold counts them (`follow_ups`), and each adds `max_iterations` to
the iteration cap.

The iteration is the number of assistant turns. A failed call, the only one never journaled,
ends its run, so every call that led anywhere has its turn. Counting turns rather than reading
their `iteration` field keeps journals written before the field held the call count (when it
was one lower) folding to the same snapshot.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

from fisk_sm.config.states import States
from fisk_sm.config.table import Table, load_table
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
)
from fisk_sm.journal.snapshot import PendingApproval, RunData, Snapshot, tool_uses
from fisk_sm.model.blocks import Message, ToolResultBlock, block_of, message_of

__all__ = [
    "AT_INPUT",
    "FoldError",
    "Folding",
    "approval_of",
    "final_answer",
    "fold",
    "merge_user",
    "turn_over",
]

#: The message of the `suspended` terminal record of a chat suspended at its prompt.
AT_INPUT = "suspended at the prompt, waiting for the user's next message"


class FoldError(JournalError):
    """The records do not form a valid journal."""


def merge_user(messages: list[Message], message: Message) -> None:
    """Append a user message, merging it into a trailing user message."""
    if messages and messages[-1].role == "user":
        messages[-1] = Message("user", messages[-1].blocks() + message.blocks())
    else:
        messages.append(message)


def _message(record: Assistant | User) -> Message:
    """The typed message a record holds (the record keeps its JSON object: bytes unchanged)."""
    try:
        return message_of(record.message)
    except ValueError as exc:
        raise FoldError(f"{exc} at seq {record.seq}") from None


def _result(record: ToolResult) -> ToolResultBlock:
    block = block_of(record.result)
    if not isinstance(block, ToolResultBlock):
        raise FoldError(f"a tool result that is not a tool_result block at seq {record.seq}")
    return block


def fold(records: Sequence[Record], table: Table | None = None) -> Snapshot:
    """Fold `records` (meta first) into the snapshot a run resumes from; a terminal record
    must name a terminal state of `table`, the table the run was made from (the loop's own
    by default)."""
    if not records or not isinstance(records[0], Meta):
        raise FoldError("the journal does not start with a meta record")
    folding = Folding(records[0], table)
    for record in records[1:]:
        folding.feed(record)
    return folding.snapshot()


class Folding:
    """A fold under way: `feed` it the records after the meta, one by one, then take its
    `snapshot`. With `track`, it also keeps where each message comes from (`sources`: the
    seqs of its records), which is what a journal's checkpoint holds
    (`fisk_sm.journal.checkpoint`); a checkpoint's fold picks up from such a state."""

    def __init__(self, meta: Meta, table: Table | None = None, *, track: bool = False) -> None:
        if meta.version != FORMAT_VERSION:
            raise FoldError(
                f"journal format version {meta.version} (this fisk-sm reads {FORMAT_VERSION})"
            )
        self.meta, self.table = meta, table
        self.data = data = RunData.begin(meta.run_id, meta.prompt)
        data.chat = meta.interactive
        #: The open turn's assistant record (None before any, and after a user record).
        self.turn: Assistant | None = None
        #: The seq of the record of `data.turn` (0: none yet).
        self.turn_seq = 0
        self.started: set[str] = set()
        self.asked: dict[str, ApprovalRequested] = {}
        self.answers: dict[str, ApprovalAnswered] = {}
        self.terminal: Terminal | None = None
        self.last_seq = meta.seq
        #: With `track`, where each message of `data.messages` was read from: the seqs of its
        #: records (the meta's for the prompt; one assistant or user record; a turn's tool
        #: results; or, merged, a user message's and a follow-up's), message after message in
        #: `sources`, message `i`'s from `starts[i]` (flat arrays: no object per message, which
        #: a fold of thousands would pay for in garbage collection). None without `track`.
        self.sources: array.array[int] | None = array.array("q", [meta.seq]) if track else None
        self.starts: array.array[int] = array.array("q", [0])
        self._result_seqs: list[int] = []

    def _commit(self) -> None:
        data = self.data
        if self.turn is not None and data.results:
            data.messages.append(Message("user", tuple(data.results)))
            if self.sources is not None:
                self.starts.append(len(self.sources))
                self.sources.extend(self._result_seqs)
        data.results = []
        self._result_seqs = []
        self.started.clear()
        self.asked.clear()
        self.answers.clear()

    def feed(self, record: Record) -> None:
        """Fold one more record in."""
        data = self.data
        if record.seq <= self.last_seq:
            raise FoldError(f"seq {record.seq} after seq {self.last_seq}")
        self.last_seq = record.seq
        if isinstance(record, Meta):
            raise FoldError(f"a second meta record at seq {record.seq}")
        if isinstance(record, Assistant):
            self._commit()
            self.turn, self.turn_seq = record, record.seq
            message = _message(record)
            data.messages.append(message)
            if self.sources is not None:
                self.starts.append(len(self.sources))
                self.sources.append(record.seq)
            data.turn, data.stop_reason = message, record.stop_reason
            data.llm_calls += 1
            data.iteration = data.llm_calls
            data.usage, data.last_usage = data.usage + record.usage, record.usage
        elif isinstance(record, ApprovalRequested | ApprovalAnswered):
            if self.turn is None:
                raise FoldError(f"an approval record before any assistant turn at seq {record.seq}")
            if isinstance(record, ApprovalRequested):
                self.asked[record.tool_use_id] = record
            else:
                if record.tool_use_id not in self.asked:
                    raise FoldError(f"an answer to an approval never asked at seq {record.seq}")
                self.answers[record.tool_use_id] = record
                if record.answer == "always":
                    data.allowed.append(self.asked[record.tool_use_id].name)
        elif isinstance(record, ToolStarted | ToolResult):
            if self.turn is None:
                raise FoldError(f"a tool record before any assistant turn at seq {record.seq}")
            if isinstance(record, ToolStarted):
                self.started.add(record.tool_use_id)
            else:
                data.results.append(_result(record))
                self._result_seqs.append(record.seq)
                data.tool_calls += 1
                data.tool_kinds[record.kind] = data.tool_kinds.get(record.kind, 0) + 1
        elif isinstance(record, User):
            self._commit()
            self.turn = None
            merged = bool(data.messages) and data.messages[-1].role == "user"
            merge_user(data.messages, _message(record))
            if self.sources is not None:
                if not merged:  # (merged: a part more of the last message)
                    self.starts.append(len(self.sources))
                self.sources.append(record.seq)
            data.follow_ups += 1
        elif isinstance(record, Terminal):
            _check_terminal(record, self.table)
            self.terminal = record

    def at_boundary(self) -> bool:
        """Whether the fold holds nothing of an open turn but the turn itself: so right after
        an assistant or a user record, where a checkpoint may be taken."""
        data = self.data
        return not (data.results or self.started or self.asked or self.answers)

    def snapshot(self) -> Snapshot:
        """The snapshot of the records fed so far (the fold is spent: feed it no more)."""
        data, turn, terminal, meta = self.data, self.turn, self.terminal, self.meta
        state = _resume_state(data, turn, self.started, self.asked, self.answers)
        if turn is not None and state == States.SUSPEND_CHECK:
            self._commit()
        # only the last record counts as where the run stopped (seqs rise, so this is it)
        last = terminal if terminal is not None and terminal.seq == self.last_seq else None
        if data.chat and _at_input(state, data, turn, last):
            state, data.pending, data.at_input = States.AWAITING_INPUT, [], True
        if terminal is not None and terminal.reason == States.COMPLETED:
            state = States.COMPLETED
        return Snapshot.of(
            state,
            data,
            status=terminal.reason if terminal else "open",
            outcome=terminal.message if terminal else None,
            seq=self.last_seq,
            created=meta.created,
            fingerprint=meta.fingerprint,
        )


def _check_terminal(record: Terminal, table: Table | None) -> None:
    """A run only ever ends in a terminal state of its table, and only a suspend stops a chat
    at its prompt: anything else was not written by a run, and no replay of it could be
    trusted. (The table is read here, at the first terminal record, not at import.)"""
    if record.reason not in (table or load_table()).terminal_states:
        raise FoldError(f"a terminal record with reason {record.reason!r} at seq {record.seq}")
    if record.message == AT_INPUT and record.reason != States.SUSPENDED:
        raise FoldError(f"a {record.reason} record at the prompt at seq {record.seq}")


def _resume_state(
    data: RunData,
    turn: Assistant | None,
    started: set[str],
    asked: dict[str, ApprovalRequested],
    answers: dict[str, ApprovalAnswered],
) -> str:
    """Where a folded run continues; fills the pending batch of an open turn."""
    if turn is None:
        return States.SUSPEND_CHECK
    answered = {r.tool_use_id for r in data.results}
    uses = tool_uses(data.turn)
    unanswered = [u for u in uses if u.id not in answered]
    if uses and not unanswered:
        return States.SUSPEND_CHECK
    if not answered and not started and not asked:
        data.pending = uses
        return States.DECIDE
    data.pending = unanswered
    data.interrupted = [u.id for u in unanswered if u.id in started]
    if not unanswered:
        raise FoldError("tool or approval records for a turn that called no tool")
    first = unanswered[0].id
    if first in started:
        return States.EXECUTE
    answer = answers.get(first)
    if answer is not None:
        if answer.answer == "no":
            data.denials[first] = answer.reason or ""
        return States.EXECUTE
    request = asked.get(first)
    if request is not None:
        data.approval = approval_of(request)
        return States.AWAITING_APPROVAL
    return States.GATE


def _at_input(state: str, data: RunData, turn: Assistant | None, terminal: Terminal | None) -> bool:
    """Whether a chat's journal ends waiting for the user's next prompt: its last turn is an
    answer, or it was suspended at the prompt."""
    if terminal is not None and terminal.message == AT_INPUT:
        return True
    if state != States.DECIDE or turn is None:
        return False
    return turn_over(data)  # the turn's pending calls are all of its calls (`decide`)


def final_answer(data: RunData) -> bool:
    """The turn is the model's answer: no tool call pending and not paused (the guard
    `turn_is_final` is this, over a run's data)."""
    return not data.pending and data.stop_reason != "pause_turn"


def turn_over(data: RunData) -> bool:
    """The turn ends a chat's turn: a final answer, or one truncated at the output cap (a
    refusal is final too); the guard `chat_turn_ended` is this, in a chat."""
    return final_answer(data) or data.stop_reason == "max_tokens"


def approval_of(request: ApprovalRequested) -> PendingApproval:
    """The pending approval a run holds (`RunData.approval`) for `request`."""
    return PendingApproval(
        request.run_id, request.tool_use_id, request.name, dict(request.input), request.tag
    )

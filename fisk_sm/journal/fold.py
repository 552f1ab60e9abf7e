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
    meta = records[0]
    if meta.version != FORMAT_VERSION:
        raise FoldError(
            f"journal format version {meta.version} (this fisk-sm reads {FORMAT_VERSION})"
        )
    data = RunData.begin(meta.run_id, meta.prompt)
    data.chat = meta.interactive
    turn: Assistant | None = None
    started: set[str] = set()
    asked: dict[str, ApprovalRequested] = {}
    answers: dict[str, ApprovalAnswered] = {}
    terminal: Terminal | None = None
    last_seq = meta.seq

    def commit() -> None:
        if turn is not None and data.results:
            data.messages.append(Message("user", tuple(data.results)))
        data.results = []
        started.clear()
        asked.clear()
        answers.clear()

    for record in records[1:]:
        if record.seq <= last_seq:
            raise FoldError(f"seq {record.seq} after seq {last_seq}")
        last_seq = record.seq
        if isinstance(record, Meta):
            raise FoldError(f"a second meta record at seq {record.seq}")
        if isinstance(record, Assistant):
            commit()
            turn = record
            message = _message(record)
            data.messages.append(message)
            data.turn, data.stop_reason = message, record.stop_reason
            data.llm_calls += 1
            data.iteration = data.llm_calls
            data.usage, data.last_usage = data.usage + record.usage, record.usage
        elif isinstance(record, ApprovalRequested | ApprovalAnswered):
            if turn is None:
                raise FoldError(f"an approval record before any assistant turn at seq {record.seq}")
            if isinstance(record, ApprovalRequested):
                asked[record.tool_use_id] = record
            else:
                if record.tool_use_id not in asked:
                    raise FoldError(f"an answer to an approval never asked at seq {record.seq}")
                answers[record.tool_use_id] = record
                if record.answer == "always":
                    data.allowed.append(asked[record.tool_use_id].name)
        elif isinstance(record, ToolStarted | ToolResult):
            if turn is None:
                raise FoldError(f"a tool record before any assistant turn at seq {record.seq}")
            if isinstance(record, ToolStarted):
                started.add(record.tool_use_id)
            else:
                data.results.append(_result(record))
                data.tool_calls += 1
                data.tool_kinds[record.kind] = data.tool_kinds.get(record.kind, 0) + 1
        elif isinstance(record, User):
            commit()
            turn = None
            merge_user(data.messages, _message(record))
            data.follow_ups += 1
        elif isinstance(record, Terminal):
            _check_terminal(record, table)
            terminal = record
    state = _resume_state(data, turn, started, asked, answers)
    if turn is not None and state == States.SUSPEND_CHECK:
        commit()
    last = terminal if terminal is not None and terminal is records[-1] else None
    if data.chat and _at_input(state, data, turn, last):
        state, data.pending, data.at_input = States.AWAITING_INPUT, [], True
    if terminal is not None and terminal.reason == States.COMPLETED:
        state = States.COMPLETED
    return Snapshot.of(
        state,
        data,
        status=terminal.reason if terminal else "open",
        outcome=terminal.message if terminal else None,
        seq=last_seq,
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

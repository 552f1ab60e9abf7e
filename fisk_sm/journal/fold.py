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
from typing import Any

from fisk_sm.config.states import States
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
from fisk_sm.journal.snapshot import Message, RunData, Snapshot, tool_uses

__all__ = ["AT_INPUT", "FoldError", "approval_of", "fold", "merge_user"]

#: The message of the `suspended` terminal record of a chat suspended at its prompt.
AT_INPUT = "suspended at the prompt, waiting for the user's next message"


class FoldError(JournalError):
    """The records do not form a valid journal."""


def merge_user(messages: list[Message], message: Message) -> None:
    """Append a user message, merging it into a trailing user message."""
    if messages and messages[-1]["role"] == "user":
        last = messages[-1]
        messages[-1] = {"role": "user", "content": _blocks(last) + _blocks(message)}
    else:
        messages.append(message)


def _blocks(message: Message) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def fold(records: Sequence[Record]) -> Snapshot:
    """Fold `records` (meta first) into the snapshot a run resumes from."""
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
            data.messages.append({"role": "user", "content": data.results})
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
            data.messages.append(record.message)
            data.turn, data.stop_reason = record.message, record.stop_reason
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
                data.results.append(record.result)
                data.tool_calls += 1
                data.tool_kinds[record.kind] = data.tool_kinds.get(record.kind, 0) + 1
        elif isinstance(record, User):
            commit()
            turn = None
            merge_user(data.messages, record.message)
            data.follow_ups += 1
        elif isinstance(record, Terminal):
            _check_terminal(record)
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


#: The reasons a terminal record can give: the machine's terminal states.
_ENDS = frozenset(
    (
        States.COMPLETED,
        States.SUSPENDED,
        States.FAILED,
        States.BUDGET_EXHAUSTED,
        States.ITERATIONS_EXHAUSTED,
    )
)


def _check_terminal(record: Terminal) -> None:
    """A run only ever ends in a terminal state, and only a suspend stops a chat at its prompt:
    anything else was not written by a run, and no replay of it could be trusted."""
    if record.reason not in _ENDS:
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
    answered = {r["tool_use_id"] for r in data.results}
    uses = tool_uses(turn.message)
    unanswered = [u for u in uses if u["id"] not in answered]
    if uses and not unanswered:
        return States.SUSPEND_CHECK
    if not answered and not started and not asked:
        data.pending = uses
        return States.DECIDE
    data.pending = unanswered
    data.interrupted = [u["id"] for u in unanswered if u["id"] in started]
    if not unanswered:
        raise FoldError("tool or approval records for a turn that called no tool")
    first = unanswered[0]["id"]
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
    # as `chat_turn_ended` has it: a final answer, or a turn that cannot be used
    final = not tool_uses(turn.message) and data.stop_reason != "pause_turn"
    return final or data.stop_reason == "max_tokens"


def approval_of(request: ApprovalRequested) -> dict[str, Any]:
    """The pending approval a run holds (`RunData.approval`) for `request`."""
    return {
        "run_id": request.run_id,
        "tool_use_id": request.tool_use_id,
        "name": request.name,
        "input": dict(request.input),
        "tag": request.tag,
    }

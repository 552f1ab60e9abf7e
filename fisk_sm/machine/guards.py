"""Guards: pure predicates over a run, named by `states/agent_loop.yaml`.

Each takes the run (anything with `data`, `budget`, `suspend_requested`, `call_cancelled` and
`interrupt_requested`) and returns a bool; none does I/O or changes anything. `transitions`
evaluates them (`fisk_sm.machine.evaluator`); the phase actions that need the same facts call
these functions rather than restating them.
`unusable_turn` and `terminal_message` are the matching pure functions that say why a turn
cannot be used and why a run ended.

The `chat_*` guards hold only in a chat run (`RunData.chat`): they are tried before the exits
that end a one-shot run (completed, failed, iterations_exhausted) and lead to `awaiting_input`
instead, so those states stay terminal and a one-shot run never takes a chat exit.
"""

from __future__ import annotations

from typing import Protocol

from fisk_sm.config.agent import Budget
from fisk_sm.config.states import States
from fisk_sm.journal.fold import AT_INPUT, final_answer, turn_over
from fisk_sm.journal.snapshot import PendingApproval, RunData

__all__ = [
    "CALL_CANCELLED",
    "GUARDS",
    "REFUSED",
    "TRUNCATED",
    "Facts",
    "awaiting_approval_message",
    "iteration_cap",
    "terminal_message",
    "unusable_turn",
]

TRUNCATED = "model reply truncated at the output token limit; the answer is incomplete"
REFUSED = "model refused to respond"
#: The message of a `suspended` terminal record left by a suspend-now that cut a model call:
#: the journal's one sign of it (`fisk_sm.machine.path` reads it as the `call_cancelled` exit).
CALL_CANCELLED = "a model call was cancelled; a resume makes it again"


class Facts(Protocol):
    """What a guard may read."""

    @property
    def data(self) -> RunData: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def suspend_requested(self) -> bool: ...
    @property
    def call_cancelled(self) -> bool: ...
    @property
    def interrupt_requested(self) -> bool: ...


def iteration_cap(run: Facts) -> int:
    """The run's iteration cap: `max_iterations`, plus as many again for each follow-up of a
    chat (REFERENCE §1.2: `maxIter += max_iterations`), so a resume never changes it."""
    return run.budget.max_iterations * (1 + run.data.follow_ups)


def iteration_cap_reached(run: Facts) -> bool:
    """The run has used up its iteration cap of model calls."""
    return run.data.iteration >= iteration_cap(run)


def chat_turn_stopped(run: Facts) -> bool:
    """A chat's turn stops at this boundary: its iterations are used up, or the user
    interrupted it (Ctrl-C); the chat waits for the next prompt."""
    return run.data.chat and (iteration_cap_reached(run) or run.interrupt_requested)


def suspend_requested(run: Facts) -> bool:
    """Someone asked the run to stop at this boundary."""
    return run.suspend_requested


def call_cancelled(run: Facts) -> bool:
    """A suspend-now cancelled the model request before it was answered."""
    return run.call_cancelled


def call_failed(run: Facts) -> bool:
    """The model request failed or timed out."""
    return run.data.error is not None


def chat_call_failed(run: Facts) -> bool:
    """A chat's model request failed: the chat reports it and waits for the next prompt."""
    return run.data.chat and call_failed(run)


def turn_is_final(run: Facts) -> bool:
    """No tool_use and not a paused turn: the model has answered."""
    return final_answer(run.data)


def unusable_turn(run: Facts) -> str | None:
    """Why the turn cannot be used: truncated at the output cap, or a final turn that is a
    refusal; None for a usable turn."""
    stop = run.data.stop_reason
    if stop == "max_tokens":
        return TRUNCATED
    if stop == "refusal" and turn_is_final(run):
        return REFUSED
    return None


def turn_unusable(run: Facts) -> bool:
    """Truncated at the output cap, or a final turn that is a refusal."""
    return unusable_turn(run) is not None


def chat_turn_ended(run: Facts) -> bool:
    """A chat's turn is over: a final answer, or one that cannot be used (reported); the chat
    waits for the next prompt."""
    return run.data.chat and turn_over(run.data)


def input_ended(run: Facts) -> bool:
    """The user ended the chat at its prompt (`/exit`, end of input)."""
    return run.data.input_ended


def over_budget(run: Facts) -> bool:
    """All four token tiers together have reached `max_tokens`."""
    limit = run.budget.max_tokens
    return limit > 0 and run.data.usage.total >= limit


def tools_pending(run: Facts) -> bool:
    """Tool calls of this turn are still unanswered."""
    return bool(run.data.pending)


def approval_pending(run: Facts) -> bool:
    """The first pending call waits for the operator's answer (asked, not yet answered)."""
    return run.data.approval is not None


GUARDS = {
    f.__name__: f
    for f in (
        chat_turn_stopped,
        iteration_cap_reached,
        suspend_requested,
        call_cancelled,
        chat_call_failed,
        call_failed,
        chat_turn_ended,
        turn_is_final,
        turn_unusable,
        over_budget,
        tools_pending,
        approval_pending,
        input_ended,
    )
}


def awaiting_approval_message(approval: PendingApproval) -> str:
    """The message of a run suspended while an approval was pending."""
    return f"suspended awaiting approval of {approval.name} ({approval.tool_use_id})"


def terminal_message(state: str, run: Facts) -> str | None:
    """Why a run ended in `state`; None for a final answer or a suspend at a boundary."""
    data, budget = run.data, run.budget
    if state == States.SUSPENDED and run.call_cancelled:
        return CALL_CANCELLED
    if state == States.SUSPENDED and data.approval is not None:
        return awaiting_approval_message(data.approval)
    if state == States.SUSPENDED and data.at_input:
        return AT_INPUT
    if state == States.FAILED:
        return data.error
    if state == States.BUDGET_EXHAUSTED:
        return f"token budget ({budget.max_tokens}) exhausted after {data.iteration} iterations"
    if state == States.ITERATIONS_EXHAUSTED:
        return f"max iterations ({iteration_cap(run)}) reached without a final answer"
    return None

"""The approval desk: where a supervisor's runs wait for an operator's answer.

Each run is handed a `DeskPrompter` (its `RunOptions.prompter`). Its `approve(request)` puts the
request on the desk (`pending`) and waits for `answer(run_id, tool_use_id, approval)`; the
waiting run holds no concurrency slot (the `awaiting_approval` state is not stepped under one).

One answer per approval: an answer is first `claim`ed, synchronously on the loop and before
any await, so of two answers racing the first wins and the other is refused (`AlreadyAnswered`,
naming the winner). The claim is remembered until the run ends; the journal's
`approval_answered` (`journaled_answer`) is the truth after that, and after a restart. A claim
also serves a run that asks later: for a run whose journal folds to `awaiting_approval` while
no task drives it (parked when the supervisor stopped), the supervisor claims the answer and
resumes the session, and the run's renewed question is answered at once; so is a question asked
again after a suspend cut the wait between the answer and its journal record. A wait cancelled
by a suspend with no answer given leaves nothing behind: the request stays pending in the
journal, not on the desk.

A cluster member's desk is given the cluster's `ApprovalsMirror` (`shared`): a question goes to
the bucket too (where an answer given already is found), and an answer any member writes there
is handed to the run waiting here.

The other questions a prompter is asked (the `ask_human_*` tools, crash policy `ask`) have no
operator here: they raise `PromptError`, which the tools report to the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from fisk_sm.client.records import Approval as PendingApproval
from fisk_sm.journal.records import ApprovalAnswered, Record
from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptError
from fisk_sm.supervisor.errors import AlreadyAnswered
from fisk_sm.supervisor.interface import Answer

if TYPE_CHECKING:
    from fisk_sm.supervisor.cluster.approvals import ApprovalsMirror

__all__ = [
    "ANSWERS",
    "NAMES",
    "ApprovalDesk",
    "DeskPrompter",
    "PendingApproval",
    "journaled_answer",
]

#: The API's answers and what the gate is told.
ANSWERS: dict[Answer, Approval] = {
    "once": Approval.ONCE,
    "always": Approval.ALWAYS,
    "deny": Approval.NO,
}
#: The API's name of each answer.
NAMES = {value: name for name, value in ANSWERS.items()}


def journaled_answer(records: Sequence[Record], tool_use_id: str) -> str | None:
    """The API's name of the answer a journal recorded for the call `tool_use_id` (None if it
    has none): a `no`, the operator's or a failed prompt's, is `deny`."""
    for record in records:
        if isinstance(record, ApprovalAnswered) and record.tool_use_id == tool_use_id:
            return "deny" if record.answer == Approval.NO.value else record.answer
    return None


class ApprovalDesk:
    """The pending approvals of every run, and the answer each approval was given first."""

    def __init__(
        self,
        on_change: Callable[[str], None] = lambda run_id: None,
        shared: ApprovalsMirror | None = None,
    ) -> None:
        self.shared = shared
        if shared is not None:
            shared.on_answer = lambda run_id, tool_use_id, name: self.answer(
                run_id, tool_use_id, ANSWERS[name]
            )
        self._waiting: dict[tuple[str, str], tuple[PendingApproval, asyncio.Future[Approval]]] = {}
        self._claims: dict[tuple[str, str], Approval] = {}
        self._on_change = on_change

    def pending(self, run_id: str | None = None) -> list[PendingApproval]:
        """The approvals being waited for (of one run, or all), oldest first."""
        return [p for p, _ in self._waiting.values() if run_id in (None, p.run_id)]

    def waiting(self, run_id: str, tool_use_id: str) -> bool:
        """Whether a run is waiting at the desk for this call's answer."""
        return (run_id, tool_use_id) in self._waiting

    def claim(self, run_id: str, tool_use_id: str, approval: Approval) -> None:
        """Make `approval` the approval's answer, unless it has one: then `AlreadyAnswered`
        names it. Synchronous, so that of two answers racing on the loop the first wins."""
        first = self._claims.get((run_id, tool_use_id))
        if first is not None:  # the same answer again is refused too: it was not this one
            raise AlreadyAnswered(run_id, tool_use_id, NAMES[first])
        self._claims[run_id, tool_use_id] = approval

    def settle(self, run_id: str, tool_use_id: str, approval: Approval) -> None:
        """Record an answer given elsewhere (another supervisor's, the journal's): the run
        asking this question is answered with it."""
        self._claims[run_id, tool_use_id] = approval

    def release(self, run_id: str, tool_use_id: str) -> None:
        """Withdraw a claim whose answer never reached its run (the resume failed)."""
        self._claims.pop((run_id, tool_use_id), None)

    async def refuse_answered(
        self,
        run_id: str,
        tool_use_id: str,
        records_of: Callable[[str], Awaitable[Sequence[Record]]],
        *,
        own: bool = False,
    ) -> None:
        """`AlreadyAnswered` if the approval has an answer: claimed here (unless `own`: the
        claim is the caller's), or in the run's journal."""
        given = None if own else self._claims.get((run_id, tool_use_id))
        found: str | None = NAMES[given] if given is not None else None
        if found is None:
            found = journaled_answer(await records_of(run_id), tool_use_id)
        if found is not None:
            raise AlreadyAnswered(run_id, tool_use_id, found)

    def answer(self, run_id: str, tool_use_id: str, approval: Approval) -> bool:
        """Hand an answer to the run waiting for it; False if nothing waits for it."""
        found = self._waiting.pop((run_id, tool_use_id), None)
        if found is None:
            return False
        future = found[1]
        if not future.done():
            future.set_result(approval)
        self._on_change(run_id)
        return True

    def forget(self, run_id: str) -> None:
        """Drop the answers of a run that ended (its journal has them)."""
        for key in [k for k in self._claims if k[0] == run_id]:
            del self._claims[key]

    async def ask(self, request: PendingApproval) -> Approval:
        """Wait for the answer to `request` (at once if it was given already)."""
        key = (request.run_id, request.tool_use_id)
        if self.shared is not None:
            found = await self.shared.ask_shared(request)
            if found is not None:  # answered in the bucket already
                self.settle(request.run_id, request.tool_use_id, ANSWERS[found])
        given = self._claims.get(key)
        if given is not None:
            return given
        future: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._waiting[key] = (request, future)
        self._on_change(request.run_id)
        try:
            return await future
        finally:
            if self._waiting.get(key, (None, None))[1] is future:
                del self._waiting[key]  # cancelled by a suspend: nothing answered
                self._on_change(request.run_id)


class DeskPrompter:
    """A run's prompter: approvals go to the desk; nobody answers other questions."""

    #: who answers: an operator through the supervisor (its API or dashboard)
    name = "supervisor"

    def __init__(self, desk: ApprovalDesk, run_id: str) -> None:
        self.desk = desk
        self.run_id = run_id
        self._calls = 0

    @property
    def available(self) -> bool:
        return True

    async def approve(self, request: ApprovalRequest) -> Approval:
        """Put the call on the desk and wait for an operator's answer."""
        tool_use_id = str(getattr(request, "tool_use_id", "") or "")
        if not tool_use_id:  # a gate that does not say which call: number them
            self._calls += 1
            tool_use_id = f"call-{self._calls}"
        arguments = getattr(request, "arguments", None)
        pending = PendingApproval(
            run_id=str(getattr(request, "run_id", "") or self.run_id),
            tool_use_id=tool_use_id,
            tool=request.tool,
            input=dict(arguments) if isinstance(arguments, dict) else {},
            tag=request.tag,
        )
        return await self.desk.ask(pending)

    def _nobody(self) -> PromptError:
        return PromptError("the supervisor answers approvals only; nobody can answer this")

    async def confirm(self, question: str) -> bool:
        raise self._nobody()

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        raise self._nobody()

    async def ask(self, question: str, default: str | None) -> str | None:
        raise self._nobody()

"""The approval desk: where a supervisor's runs wait for an operator's answer.

Each run is handed a `DeskPrompter` (its `RunOptions.prompter`). Its `approve(request)` puts the
request on the desk (`pending`) and waits for `answer(run_id, tool_use_id, approval)`; the
waiting run holds no concurrency slot (the `awaiting_approval` state is not stepped under one).
An answer may also come first: for a run whose journal folds to `awaiting_approval` while no
task drives it (parked when the supervisor stopped), the supervisor leaves the answer on the desk
and resumes the session, and the run's renewed question is answered at once. A wait cancelled by
a suspend leaves nothing behind: the request stays pending in the journal, not on the desk.

The other questions a prompter is asked (the `ask_human_*` tools, crash policy `ask`) have no
operator here: they raise `PromptError`, which the tools report to the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptError

__all__ = ["ANSWERS", "ApprovalDesk", "DeskPrompter", "PendingApproval"]

#: The API's answers and what the gate is told.
ANSWERS = {"once": Approval.ONCE, "always": Approval.ALWAYS, "deny": Approval.NO}


@attrs.frozen
class PendingApproval:
    """A gated call waiting for an answer (the API's `Approval` object)."""

    run_id: str
    tool_use_id: str
    tool: str
    input: dict[str, Any]
    tag: str

    def to_json(self) -> dict[str, Any]:
        """The API's `Approval` JSON."""
        return attrs.asdict(self)


class ApprovalDesk:
    """The pending approvals of every run, and the answers given ahead of a question."""

    def __init__(self, on_change: Callable[[str], None] = lambda run_id: None) -> None:
        self._waiting: dict[tuple[str, str], tuple[PendingApproval, asyncio.Future[Approval]]] = {}
        self._ahead: dict[tuple[str, str], Approval] = {}
        self._on_change = on_change

    def pending(self, run_id: str | None = None) -> list[PendingApproval]:
        """The approvals being waited for (of one run, or all), oldest first."""
        return [p for p, _ in self._waiting.values() if run_id in (None, p.run_id)]

    def waiting(self, run_id: str, tool_use_id: str) -> bool:
        """Whether a run is waiting at the desk for this call's answer."""
        return (run_id, tool_use_id) in self._waiting

    def answer_ahead(self, run_id: str, tool_use_id: str, approval: Approval) -> None:
        """Leave an answer for a question the run will ask once resumed."""
        self._ahead[run_id, tool_use_id] = approval

    def answer(self, run_id: str, tool_use_id: str, approval: Approval) -> bool:
        """Answer a waiting call; False if nothing waits for it."""
        found = self._waiting.pop((run_id, tool_use_id), None)
        if found is None:
            return False
        future = found[1]
        if not future.done():
            future.set_result(approval)
        self._on_change(run_id)
        return True

    def forget(self, run_id: str) -> None:
        """Drop answers left for a run that will not ask them (it ended)."""
        for key in [k for k in self._ahead if k[0] == run_id]:
            del self._ahead[key]

    async def ask(self, request: PendingApproval) -> Approval:
        """Wait for the answer to `request` (at once if one was left ahead)."""
        key = (request.run_id, request.tool_use_id)
        ahead = self._ahead.pop(key, None)
        if ahead is not None:
            return ahead
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

"""The operator at the full-screen UI: the `Prompter` protocol, each question a modal dialog.

The same protocol the terminal prompter answers (`fisk_sm.operator.prompter`): the confirm
gate's approvals and the `ask_human_*` tools put their questions to it, and it pushes the
matching dialog (`fisk_sm.tui.dialogs`) and waits for its dismissal. The journal records it as
who answered (`ApprovalAnswered.by` is "tui").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

from textual.app import App
from textual.screen import Screen

from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptError
from fisk_sm.tui.dialogs import ApprovalDialog, AskDialog, ConfirmDialog, SelectDialog

__all__ = ["TuiPrompter"]

R = TypeVar("R")


class TuiPrompter:
    """Asks in dialogs on `app`'s screen."""

    #: who answers: the operator at the full-screen UI
    name = "tui"

    def __init__(self, app: App[int]) -> None:
        self.app = app

    @property
    def available(self) -> bool:
        """Whether the app is running (its screen can show a dialog)."""
        return self.app.is_running

    async def _asked(self, dialog: Screen[R]) -> R | None:
        if not self.app.is_running:
            raise PromptError("the full-screen UI has closed")
        answered: asyncio.Future[R | None] = asyncio.get_running_loop().create_future()

        def settle(answer: R | None) -> None:
            if not answered.done():
                answered.set_result(answer)

        self.app.push_screen(dialog, settle)
        try:
            return await answered
        except asyncio.CancelledError:  # a suspend abandons the question: the dialog goes
            if self.app.screen is dialog:
                self.app.pop_screen()
            raise

    async def approve(self, request: ApprovalRequest) -> Approval:
        """The gate's question: may this call run?"""
        dialog = ApprovalDialog(request.tool, request.tag, request.arguments, request.run_id)
        return await self._asked(dialog) or Approval.NO

    async def confirm(self, question: str) -> bool:
        """A yes/no question."""
        answer = await self._asked(ConfirmDialog(question))
        return answer is True

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        """One of `options`."""
        return await self._asked(SelectDialog(question, options))

    async def ask(self, question: str, default: str | None) -> str | None:
        """A line of text."""
        return await self._asked(AskDialog(question, default))

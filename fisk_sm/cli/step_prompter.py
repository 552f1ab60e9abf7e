"""The stepper's operator (`fisk-sm step`): it answers the gate's approvals.

An answer given in advance by the stepper's `approve once|always|deny` is taken by the next
approval; with none given, the question is asked on the stepper's own input (a terminal or
stdin lines alike), where `q` or the end of input suspends the run (no answer: the approval
stays pending, as on SIGTERM). Anything else (`ask_human_*`, a crash's rerun question) is asked
by the prompter it replaces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from fisk_sm.loop.run import Run
from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptCancelled, Prompter
from fisk_sm.operator.sanitize import sanitize

__all__ = ["ANSWERS", "PROMPT", "Operator", "Reader", "StepPrompter", "parse_answer"]

PROMPT = "(fisk-sm) "
#: Reads one command after showing a prompt; None at the end of input.
Reader = Callable[[str], Awaitable[str | None]]


class Operator(Protocol):
    """What the prompter uses of the stepper: its run, its output and input, its quit flag."""

    run: Run
    read: Reader
    quitting: bool

    def say(self, text: str = "", *, heading: bool = False) -> None:
        """Write a line."""
        ...


#: The answers of `approve`, by the word the operator types.
ANSWERS = {"once": Approval.ONCE, "always": Approval.ALWAYS, "deny": Approval.NO}


def parse_answer(argument: str) -> Approval | None:
    """The answer `approve ARGUMENT` gives (`once`, `always`, `deny`), None if none."""
    return ANSWERS.get(argument.strip().lower())


class StepPrompter:
    """The gate's prompter while stepping: the stepper answers approvals (an answer given in
    advance by `approve`, else asked on the stepper's own input); anything else is asked by
    the prompter it replaces."""

    #: who answers: the operator stepping the run (`fisk-sm step`)
    name = "stepper"

    def __init__(self, inner: Prompter, stepper: Operator) -> None:
        self.inner = inner
        self.stepper = stepper
        #: the answer `approve` gave for the next approval, if any
        self.queued: Approval | None = None
        #: answers given since the stepper last showed them: (tool, answer)
        self.answered: list[tuple[str, Approval]] = []

    @property
    def available(self) -> bool:
        """The stepper is an operator: always available."""
        return True

    async def approve(self, request: ApprovalRequest) -> Approval:
        """The queued answer, or one read from the stepper's input (`q` or the end of input
        suspends the run: no answer, the approval stays pending)."""
        answer = self.queued
        self.queued = None
        stepper = self.stepper
        if answer is None:
            stepper.say(
                f"approval: {request.display} (gated by {sanitize(request.tag, 80)});"
                " answer approve once|always|deny, or q",
                heading=True,
            )
            while answer is None:
                line = await stepper.read(PROMPT)
                command, _, argument = (line or "q").strip().partition(" ")
                if command == "q":
                    stepper.quitting = True
                    stepper.run.request_suspend()
                    raise PromptCancelled("the stepper is quitting")
                answer = parse_answer(argument) if command == "approve" else None
                if answer is None:
                    stepper.say("an approval is pending: approve once|always|deny, or q")
        self.answered.append((request.tool, answer))
        return answer

    async def confirm(self, question: str) -> bool:
        """Asked by the replaced prompter."""
        return await self.inner.confirm(question)

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        """Asked by the replaced prompter."""
        return await self.inner.select(question, options)

    async def ask(self, question: str, default: str | None) -> str | None:
        """Asked by the replaced prompter."""
        return await self.inner.ask(question, default)

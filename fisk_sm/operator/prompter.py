"""Asking the operator: the `Prompter` protocol, its terminal, scripted and absent forms.

Whatever a prompter shows may come from the model (a command line, a question, options), so the
terminal prompter passes every string through `sanitize` or `strip_control` first: an escape
sequence in a tool argument must not be able to recolour, clear, retitle or rewrite the very prompt
that asks the operator to approve it.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TextIO, TypeVar

import attrs

from fisk_sm.config.text import UnencodableText, refuse_unencodable
from fisk_sm.operator.sanitize import is_terminal, sanitize, strip_control

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "NO_OPERATOR",
    "Approval",
    "ApprovalRequest",
    "NoOperator",
    "PromptCancelled",
    "PromptError",
    "Prompter",
    "ScriptedPrompter",
    "TerminalPrompter",
]


class Approval(enum.Enum):
    """The operator's answer to a gated call."""

    ONCE = "once"
    ALWAYS = "always"
    NO = "no"


@attrs.frozen
class ApprovalRequest:
    """A gated call put to the operator: tool, the call as one sanitized line, gating tag; and,
    for an operator answering many runs (a supervisor), whose call it is and its arguments."""

    tool: str
    display: str
    tag: str
    run_id: str = ""
    tool_use_id: str = ""
    #: The call's JSON input, as the model sent it (only passed on: shown, journaled).
    arguments: Mapping[str, object] = attrs.field(factory=dict)


_A = TypeVar("_A")


class PromptError(Exception):
    """The operator could not be asked, or gave no usable answer (end of input, a closed UI)."""


class PromptCancelled(PromptError):
    """The prompt was abandoned because the run is ending."""


class Prompter(Protocol):
    """Someone who can be asked: approvals for gated tools and the `ask_human_*` questions.

    Any method may raise `PromptError`. Callers check `available` before asking. A prompter
    may say who it stands for in a `name` attribute ("terminal", "stepper", "supervisor", ...):
    the journal records it as who answered an approval (`ApprovalAnswered.by`).
    """

    @property
    def available(self) -> bool:
        """Whether an operator can be asked at all."""
        ...

    async def approve(self, request: ApprovalRequest) -> Approval:
        """Ask whether a gated call may run."""
        ...

    async def confirm(self, question: str) -> bool:
        """Ask a yes/no question."""
        ...

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        """Ask for one of `options`; its index, or None when none was chosen."""
        ...

    async def ask(self, question: str, default: str | None) -> str | None:
        """Ask for a line of text; `default` stands for an empty answer."""
        ...


#: What a tool is told when nobody could be asked (the gate's denial, the ask_human_* tools).
NO_OPERATOR = "no interactive terminal is attached, so no operator could be asked"


class NoOperator:
    """Nobody to ask: `available` is False and every question raises `PromptError`."""

    #: who answers: nobody (it answers nothing; named for completeness)
    name = "nobody"

    @property
    def available(self) -> bool:
        return False

    def _fail(self) -> PromptError:
        return PromptError("no operator can be asked")

    async def approve(self, request: ApprovalRequest) -> Approval:
        raise self._fail()

    async def confirm(self, question: str) -> bool:
        raise self._fail()

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        raise self._fail()

    async def ask(self, question: str, default: str | None) -> str | None:
        raise self._fail()


class ScriptedPrompter:
    """A prompter for tests: replays queued answers and records every question in `asked`.

    A queued answer that is an exception instance is raised instead. A question with no answer
    left, or any question while `available` is False, fails with AssertionError.
    """

    #: who answers: the script of queued answers
    name = "script"

    def __init__(
        self,
        *,
        approvals: Sequence[Approval | BaseException] = (),
        confirms: Sequence[bool | BaseException] = (),
        selections: Sequence[int | BaseException | None] = (),
        inputs: Sequence[str | BaseException | None] = (),
        available: bool = True,
    ) -> None:
        self._available = available
        self._approvals = list(approvals)
        self._confirms = list(confirms)
        self._selections = list(selections)
        self._inputs = list(inputs)
        self.asked: list[tuple[str, object]] = []

    @property
    def available(self) -> bool:
        return self._available

    def _answer(self, kind: str, question: object, queue: list[_A | BaseException]) -> _A:
        self.asked.append((kind, question))
        if not self._available:
            raise AssertionError(f"{kind} asked although no operator is available: {question!r}")
        if not queue:
            raise AssertionError(f"unscripted {kind}: {question!r}")
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def approve(self, request: ApprovalRequest) -> Approval:
        return self._answer("approve", request, self._approvals)

    async def confirm(self, question: str) -> bool:
        return bool(self._answer("confirm", question, self._confirms))

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        return self._answer("select", (question, list(options)), self._selections)

    async def ask(self, question: str, default: str | None) -> str | None:
        return self._answer("ask", (question, default), self._inputs)


async def _read_line(stream: TextIO) -> str:
    """One line from `stream`, read in a daemon thread: a prompt abandoned by a suspend leaves
    the thread blocked on the terminal, and a daemon thread does not keep the process alive."""
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()

    def settle(line: str | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(line or "")

    def read() -> None:
        line: str | None = None
        error: BaseException | None = None
        try:
            # Bytes, decoded leniently: an answer that is not UTF-8 is refused by
            # `TerminalPrompter._read` (asked again), where a strict decoder would end the run.
            binary = getattr(stream, "buffer", None)
            raw = stream.readline() if binary is None else binary.readline()
            line = raw if isinstance(raw, str) else raw.decode("utf-8", "surrogateescape")
        except BaseException as exc:  # handed to the waiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, line, error)

    threading.Thread(target=read, name="fisk-sm-prompt", daemon=True).start()
    return await future


class TerminalPrompter:
    """Asks on the terminal: prompts on `stream_out` (stderr), answers from `stream_in` (stdin).

    Available only when both streams are TTYs. Every string shown goes through `sanitize`.
    Reading happens in a daemon thread; end of input raises `PromptError`.
    """

    #: who answers: the operator at the terminal
    name = "terminal"

    def __init__(self, stream_in: TextIO | None = None, stream_out: TextIO | None = None) -> None:
        self.stream_in = sys.stdin if stream_in is None else stream_in
        self.stream_out = sys.stderr if stream_out is None else stream_out

    @property
    def available(self) -> bool:
        return is_terminal(self.stream_in) and is_terminal(self.stream_out)

    async def _read(self, prompt: str) -> str:
        # `prompt` is assembled only from sanitized pieces; strip once more as a last line of
        # defence, keeping the newlines the layout itself uses.
        while True:
            self.stream_out.write(strip_control(prompt))
            self.stream_out.flush()
            line = await _read_line(self.stream_in)
            if not line:
                raise PromptError("end of input")
            try:
                return refuse_unencodable(line, "answer").strip()
            except UnencodableText as exc:  # one line, then the same question again
                self.stream_out.write(f"{exc}; type it again\n")

    async def approve(self, request: ApprovalRequest) -> Approval:
        tool, tag = sanitize(request.tool, 200), sanitize(request.tag, 200)
        display = sanitize(request.display, 4000)
        answer = await self._read(
            f'{tool}: approve "{display}" [{tag}]? [o]nce / [a]lways / [N]o: '
        )
        choice = answer.lower()
        if choice in ("o", "once"):
            return Approval.ONCE
        if choice in ("a", "always"):
            return Approval.ALWAYS
        return Approval.NO  # empty, "n" or anything unrecognised: deny by default

    async def confirm(self, question: str) -> bool:
        answer = await self._read(f"{sanitize(question)} [y/N]: ")
        return answer.lower() in ("y", "yes")

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        lines = [sanitize(question)]
        lines += [f"  {n}) {sanitize(option)}" for n, option in enumerate(options, 1)]
        answer = await self._read("\n".join(lines) + f"\nchoose 1-{len(options)}: ")
        try:
            chosen = int(answer) - 1
        except ValueError:
            return None
        return chosen if 0 <= chosen < len(options) else None

    async def ask(self, question: str, default: str | None) -> str | None:
        hint = f" [{sanitize(default)}]" if default else ""
        answer = await self._read(f"{sanitize(question)}{hint}: ")
        return answer if answer or default is None else default

"""One MCP-served chat session: its run, driven in a task of its own, and what its calls see.

The run is a journaled chat session. The `ask` call that started a turn (or resumed one) only
awaits the session's `updates`: progress (a model call, a tool), a question for the client
(`Asked`: a gated call's approval, an `ask_human_*` question), or the turn's answer
(`Answered`: the chat is back at its prompt, or the run ended). A cancelled call never cancels
the run: it asks for a suspend (`Run.request_suspend(now=True)`), so a tool in flight finishes
and is journaled, and the next `ask` on the session resumes it from its journal.

The session is its run's events sink and its operator (`SessionPrompter`): a question is put on
`updates` and waited for in the run's own task, never in a call. The client's answer arrives
with a later call (`answer`), which hands it to the waiting question.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs

from fisk_sm.config.states import States
from fisk_sm.events.types import (
    ApprovalDenied,
    Event,
    MessageReceived,
    RunEnded,
    StateEntered,
    ToolCalled,
)
from fisk_sm.loop.run import Run
from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptError

__all__ = ["Answered", "Asked", "Progress", "Session", "SessionPrompter", "Update"]


@attrs.frozen
class Progress:
    """A step worth telling the client about: a model call, a tool."""

    message: str


@attrs.frozen
class Asked:
    """A question the client's user must answer: `kind` is "approval", "confirm", "select"
    or "ask"; `key` names it in the input request and its answer."""

    key: str
    kind: str
    message: str
    request: ApprovalRequest | None = None
    options: tuple[str, ...] = ()


@attrs.frozen
class Answered:
    """The turn is over: the chat waits for its next prompt, or the run ended in `state`."""

    text: str
    state: str
    message: str | None = None


Update = Progress | Asked | Answered


class Session:
    """A served session: its run and task, its prompts, and the updates its calls await."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.run: Run | None = None
        self.task: asyncio.Task[str] | None = None
        self.prompts: asyncio.Queue[str] = asyncio.Queue()
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        #: answers to skip: a resumed turn's, when the call that resumed it also gave a prompt
        self.skip = 0
        self.last_text = ""
        #: whether the current call's client can answer input requests
        self.can_ask = False
        self.waiting: dict[str, asyncio.Future[object]] = {}
        self.denied: list[str] = []

    @property
    def live(self) -> bool:
        """Whether its run is still being driven here."""
        return self.task is not None and not self.task.done()

    def start(self, run: Run) -> None:
        """Drive `run` in a task of its own, and close it when it ends; the chat's prompts come
        from `prompts`."""
        self.run = run
        run.input = self.prompts.get
        self.task = asyncio.create_task(self._drive(run), name=f"fisk-sm run {self.run_id}")

    async def _drive(self, run: Run) -> str:
        try:
            return await run.run()
        finally:
            await run.aclose()  # the session's lock: free for the next `ask` to resume it

    # the run's events
    def wants(self, kind: type[Event]) -> bool:
        """The kinds the session follows."""
        return kind in (StateEntered, MessageReceived, ToolCalled, ApprovalDenied, RunEnded)

    def emit(self, event: Event) -> None:
        """Turn an event of the run into an update for the calls."""
        if isinstance(event, MessageReceived):
            self.last_text = event.text or self.last_text
        elif isinstance(event, StateEntered):
            if event.state == States.CALL:
                self.updates.put_nowait(Progress(f"call (iteration {event.iteration + 1})"))
            elif event.state == States.AWAITING_INPUT and event.source is not None:
                self._answered(Answered(self.last_text, event.state))
        elif isinstance(event, ToolCalled):
            self.updates.put_nowait(Progress(f"execute: {event.name}"))
        elif isinstance(event, ApprovalDenied):
            self.denied.append(f"{event.tool} ({event.reason})")
        elif isinstance(event, RunEnded):
            text = event.answer or self.last_text
            self.updates.put_nowait(Answered(text, event.state, event.message))

    def _answered(self, answered: Answered) -> None:
        if self.skip:
            self.skip -= 1
            return
        self.updates.put_nowait(answered)

    # questions
    async def asked(self, question: Asked) -> object:
        """Put `question` to the client and wait (in the run's task) for its answer."""
        if not self.can_ask:
            raise PromptError("the MCP client cannot answer input requests")
        answer: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.waiting[question.key] = answer
        self.updates.put_nowait(question)
        try:
            return await answer
        finally:
            self.waiting.pop(question.key, None)

    def answer(self, key: str, value: object) -> bool:
        """Hand the client's answer to the question `key`; False if none waits for it."""
        waiting = self.waiting.get(key)
        if waiting is None or waiting.done():
            return False
        waiting.set_result(value)
        return True


class SessionPrompter:
    """The operator of a served run: the MCP client's user, through input requests."""

    #: who answers: the MCP client (journaled as `by`)
    name = "mcp"

    def __init__(self, session: Session) -> None:
        self.session = session
        self.count = 0

    @property
    def available(self) -> bool:
        """Whether the current call's client can answer input requests."""
        return self.session.can_ask

    def _key(self, kind: str) -> str:
        self.count += 1
        return f"{kind}-{self.count}"

    async def approve(self, request: ApprovalRequest) -> Approval:
        """The gate's question, as an input request: once, always or deny."""
        key = request.tool_use_id or self._key("approval")
        message = f"approve {request.tool} [{request.tag}]?"
        answer = await self.session.asked(Asked(key, "approval", message, request))
        return answer if isinstance(answer, Approval) else Approval.NO

    async def confirm(self, question: str) -> bool:
        """A yes/no question."""
        return await self.session.asked(Asked(self._key("confirm"), "confirm", question)) is True

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        """One of `options`."""
        asked = Asked(self._key("select"), "select", question, options=tuple(options))
        answer = await self.session.asked(asked)
        return answer if isinstance(answer, int) else None

    async def ask(self, question: str, default: str | None) -> str | None:
        """A line of text."""
        answer = await self.session.asked(Asked(self._key("ask"), "ask", question))
        return answer if isinstance(answer, str) else default

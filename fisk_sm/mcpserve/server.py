"""The agent as an MCP server: one tool, `ask(prompt, session?)`, answering from a chat session.

A call without `session` starts a journaled chat session on `prompt`; with one, it is the
session's next turn (its run resumed from the journal first when it is not driven here: after
a suspend, a cancelled call or a restart). The call returns the turn's answer, its text and a
structured `{session, state, answer}`; progress notifications go out per model call and per
tool, named by state, the first one naming the session.

A gated call or an `ask_human_*` question is returned as the protocol's input request
(`InputRequiredResult`, revision 2026-07-28): the call ends there while the run waits, holding
nothing. The client's retry carries the answer (`inputResponses`, with the `requestState`
naming the session and the question); it is handed to the run, which journals it like any
operator's answer (`by: mcp`), and the retry goes on with the turn. A client that cannot answer
input requests gets the gate's denial, as with no operator, and the answer says so.

A cancelled call (a `notifications/cancelled`, or on streamable HTTP a closed response stream)
suspends the run, never kills a tool: the run is driven in its own task, which the call only
awaits; the cancellation becomes `request_suspend(now=True)`, a tool in flight finishes and is
journaled, and the next `ask` on the session resumes it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pydantic
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.limits import MAX_OUTPUT
from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import FileStore, InvalidIdError, check_run_id
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.fingerprint import ResumeRefused
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import new_run_id
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.mcpserve.session import Answered, Asked, Progress, Session, SessionPrompter
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import sanitize
from fisk_sm.supervisor.host.desk import ANSWERS
from fisk_sm.tools.output import cap_text

__all__ = ["REVISION", "AgentServer"]

#: The MCP revision the input requests follow.
REVISION = "2026-07-28"
ASK = (
    "Ask the agent {name}: it answers PROMPT, calling its tools as it needs. Give the session id"
    " of an earlier answer to continue that conversation (or resume it, if it was suspended);"
    " leave it out to start a new one."
)


class ApprovalAnswer(pydantic.BaseModel):
    """The answer to a gated call."""

    answer: Literal["once", "always", "deny"] = pydantic.Field(
        description="once: run it this time; always: for the rest of the run; deny: refuse it"
    )


class ConfirmAnswer(pydantic.BaseModel):
    """A yes or no."""

    yes: bool


class TextAnswer(pydantic.BaseModel):
    """A line of text."""

    text: str


class BadCall(Exception):
    """A call that cannot be served: one line for the client."""


class AgentServer:
    """The MCP server of one agent, its sessions in `store`."""

    def __init__(self, config: AgentConfig, store: FileStore | JetStreamStore) -> None:
        self.config, self.store = config, store
        self.sessions: dict[str, Session] = {}
        self.mcp = MCPServer(
            "fisk-sm",
            instructions=f"The agent {config.identity}, served by fisk-sm.",
            log_level="WARNING",
        )
        self.mcp.tool(
            name="ask",
            description=ASK.format(name=sanitize(config.identity, 200)),
            annotations=ToolAnnotations(
                title=f"ask {config.identity}",
                read_only_hint=False,
                destructive_hint=True,  # its tools may change things; the gate asks first
                open_world_hint=True,
            ),
        )(self.ask)

    async def ask(
        self, ctx: Context, prompt: str = "", session: str | None = None
    ) -> CallToolResult | InputRequiredResult:
        """The `ask` tool."""
        can_ask = _can_answer_input(ctx)
        try:
            served = await self._served(ctx, prompt, session)
        except BadCall as exc:
            return _error(str(exc))
        served.can_ask = can_ask
        told_session = False
        step = 0
        try:
            while True:
                update = await served.updates.get()
                if isinstance(update, Progress):
                    step += 1
                    named = "" if told_session else f"session {served.run_id}: "
                    told_session = True
                    await ctx.report_progress(step, None, named + update.message)
                elif isinstance(update, Asked):
                    return _input_request(served, update)
                else:
                    return _answer(served, update)
        except asyncio.CancelledError:
            if served.run is not None and served.live:  # a cancelled call: suspend, never kill
                served.run.request_suspend(now=True)
            raise

    async def _served(self, ctx: Context, prompt: str, session: str | None) -> Session:
        """The session this call serves: the one an answer is for, or the prompt's."""
        state, responses = ctx.request_state, ctx.input_responses
        if state is not None and responses:
            return self._answered(state, responses)
        if not prompt.strip() and session is None:
            raise BadCall("ask: prompt is empty")
        if session is None:
            return await self._start(prompt)
        try:
            check_run_id(session)  # nothing from the client is trusted as a path
        except InvalidIdError as exc:
            raise BadCall(f"ask: session: {exc}") from None
        served = self.sessions.get(session)
        if served is not None and served.live:
            if served.run is None or served.run.state != States.AWAITING_INPUT:
                raise BadCall(f"ask: session {session} is busy with a turn")
            if not prompt.strip():
                raise BadCall("ask: prompt is empty")
            served.prompts.put_nowait(prompt)
            return served
        return await self._resume(session, prompt)

    def _answered(self, state: str, responses: object) -> Session:
        try:
            told = json.loads(state)
            served = self.sessions[told["session"]]
            key = told["key"]
            kind = told["kind"]
        except (ValueError, KeyError, TypeError):
            raise BadCall("ask: requestState is not one this server gave") from None
        response = responses.get(key) if isinstance(responses, dict) else None
        options = told.get("options") or []
        served.answer(key, _decoded(kind, response, [str(o) for o in options]))
        return served

    def _options(self, served: Session) -> RunOptions:
        return RunOptions(events=served, prompter=SessionPrompter(served))

    async def _start(self, prompt: str) -> Session:
        served = Session(new_run_id())
        run = await start_session(
            self.config, prompt, self.store, self._options(served), run_id=served.run_id, chat=True
        )
        self.sessions[served.run_id] = served
        served.start(run)
        return served

    async def _resume(self, session: str, prompt: str) -> Session:
        served = Session(session)
        try:
            run = await resume_session(self.config, session, self.store, self._options(served))
        except (JournalError, ResumeRefused, OSError) as exc:  # unknown, locked, refused
            raise BadCall(f"ask: session {session}: {sanitize(str(exc), 300)}") from None
        if not run.data.chat:
            await run.aclose()
            raise BadCall(f"ask: session {session} is not a chat session")
        if prompt.strip():
            served.prompts.put_nowait(prompt)
            if run.state != States.AWAITING_INPUT:
                served.skip = 1  # the interrupted turn ends first; the prompt's answer is told
        elif run.state == States.AWAITING_INPUT:
            await run.aclose()
            raise BadCall("ask: prompt is empty")
        self.sessions[session] = served
        served.start(run)
        return served


def _can_answer_input(ctx: Context) -> bool:
    """Whether the client can answer input requests on this call (revision 2026-07-28)."""
    caps = ctx.client_capabilities
    return ctx.protocol_version == REVISION and caps is not None and caps.elicitation is not None


def _schema(kind: str, options: tuple[str, ...]) -> dict[str, object]:
    if kind == "approval":
        return render_elicitation_schema(ApprovalAnswer)
    if kind == "confirm":
        return render_elicitation_schema(ConfirmAnswer)
    if kind == "select":
        return {
            "type": "object",
            "properties": {"choice": {"type": "string", "enum": list(options)}},
            "required": ["choice"],
        }
    return render_elicitation_schema(TextAnswer)


def _input_request(served: Session, asked: Asked) -> InputRequiredResult:
    message = asked.message
    if asked.request is not None:
        shown = json.dumps(dict(asked.request.arguments), ensure_ascii=False)
        message = f"{message}\ninput: {shown}"
    params = ElicitRequestFormParams(
        message=message, requested_schema=_schema(asked.kind, asked.options)
    )
    state: dict[str, object] = {"session": served.run_id, "key": asked.key, "kind": asked.kind}
    if asked.kind == "select":
        state["options"] = list(asked.options)
    return InputRequiredResult(
        input_requests={asked.key: ElicitRequest(params=params)}, request_state=json.dumps(state)
    )


def _decoded(kind: str, response: object, options: list[str]) -> object:
    """The client's answer as the prompter returns it (None: declined or unusable)."""
    if not isinstance(response, ElicitResult) or response.action != "accept":
        return Approval.NO if kind == "approval" else None
    content = response.content or {}
    if kind == "approval":
        try:  # read by the model its schema was drawn from
            return ANSWERS[ApprovalAnswer.model_validate(content).answer]
        except pydantic.ValidationError:
            return Approval.NO
    if kind == "confirm":
        return content.get("yes") is True
    if kind == "select":
        choice = content.get("choice")
        return options.index(choice) if choice in options else None
    text = content.get("text")
    return text if isinstance(text, str) else None


def _answer(served: Session, answered: Answered) -> CallToolResult:
    text, _ = cap_text(answered.text, MAX_OUTPUT)  # the caps of every tool's result
    if served.denied:
        why = "" if served.can_ask else f"; this client cannot answer input requests ({REVISION})"
        text += "\n\n(denied: " + "; ".join(served.denied) + why + ")"
        served.denied.clear()
    if answered.state not in (States.AWAITING_INPUT, States.COMPLETED):
        why = f": {answered.message}" if answered.message else ""
        text = f"[the run ended {answered.state}{why}] {text}".strip()

    structured = {"session": served.run_id, "state": answered.state, "answer": text}
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured
    )


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)

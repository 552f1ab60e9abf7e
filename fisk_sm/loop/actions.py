"""Phase actions: one small async function per state, named by `states/agent_loop.yaml`.

An action does the I/O of its phase (the model call, one tool, the journal) and records facts on
the run's data; it never chooses the next state, which is the guards' job. Each takes the run
(with its `data`, `harness` and `next_seq()`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Protocol

from fisk_sm.config.agent import Budget
from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.events.types import MessageReceived, ToolCalled, ToolFinished, WarningRaised, wants
from fisk_sm.journal.fold import approval_of, merge_user
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    ToolResult,
    ToolStarted,
    User,
)
from fisk_sm.journal.snapshot import RunData, Usage, tool_uses
from fisk_sm.loop.harness import Harness
from fisk_sm.loop.inflight import CallCancelled, InFlight
from fisk_sm.machine.guards import (
    iteration_cap,
    iteration_cap_reached,
    turn_is_final,
    unusable_turn,
)
from fisk_sm.model.anthropic import ModelError
from fisk_sm.model.blocks import Message, ToolResultBlock, block_of
from fisk_sm.operator.prompter import Approval, PromptCancelled
from fisk_sm.tools.base import Outcome, Tool
from fisk_sm.tools.gate import Audit, denial

if TYPE_CHECKING:
    import asyncio

__all__ = ["ACTIONS", "INTERRUPTED", "Inbox", "InputSource", "Phase"]

#: Where a chat's next prompt comes from: the text, or None when the user ends the chat.
InputSource = Callable[[], Coroutine[object, object, str | None]]

INTERRUPTED = "outcome unknown: the run stopped while this tool was running"


class Inbox:
    """An input source that others post to (a supervisor's `say`): the chat waiting in
    `awaiting_input` takes the next text posted, in order. Use it on the run's event loop."""

    def __init__(self) -> None:
        import asyncio

        self._texts: asyncio.Queue[str | None] = asyncio.Queue()

    def put(self, text: str | None) -> None:
        """Post a follow-up (None ends the chat)."""
        self._texts.put_nowait(text)

    async def __call__(self) -> str | None:
        return await self._texts.get()


class Phase(Protocol):
    """What an action may touch."""

    data: RunData
    harness: Harness
    suspend_requested: bool
    call_cancelled: bool
    interrupt_requested: bool
    in_flight: InFlight
    input: InputSource | None
    #: the last model call's wall time (ms), from `call_model` to the `journal_turn` that
    #: records it; beside the run's resumable data, so a snapshot never carries it
    call_latency_ms: int | None

    @property
    def budget(self) -> Budget: ...

    def next_seq(self) -> int: ...


async def check_boundary(run: Phase) -> None:
    """Poll the harness's suspend source (a signal flag, a supervisor) at the loop boundary."""
    if run.harness.should_suspend():
        run.suspend_requested = True


async def call_model(run: Phase) -> None:
    """One model request; it counts as an iteration even if it fails.

    A request cancelled by a suspend-now (`Run.request_suspend(now=True)`) was never answered:
    it is recorded as `call_cancelled` and does not count, so the iteration stays what the
    journal's fold gives on resume (its number of assistant turns).
    """
    data = run.data
    data.iteration += 1
    data.error = None
    run.call_latency_ms = None
    started = time.monotonic()
    try:
        reply = await run.in_flight.run(
            run.harness.model.create(run.harness.request(data.messages))
        )
    except CallCancelled:
        data.iteration -= 1
        run.call_cancelled = True
        return
    except ModelError as exc:
        data.error = str(exc)
        return
    run.call_latency_ms = int((time.monotonic() - started) * 1000)
    data.llm_calls += 1
    data.last_usage = Usage.from_api(reply.get("usage"))
    data.usage = data.usage + data.last_usage
    # the reply's blocks become records here, once; each keeps the object the model sent
    data.turn = Message("assistant", tuple([block_of(b) for b in reply.get("content") or ()]))
    data.stop_reason = reply.get("stop_reason")


async def journal_turn(run: Phase) -> None:
    """Append the assistant turn to the conversation and journal it, before any tool runs."""
    data = run.data
    turn = data.turn
    if turn is None:  # pragma: no cover - the table only enters journal after a reply
        raise RuntimeError("journal entered without a model reply")
    data.messages.append(turn)
    data.pending = tool_uses(turn)
    data.results = []
    record = Assistant(
        seq=run.next_seq(),
        iteration=data.iteration,
        message=turn.to_json(),
        stop_reason=data.stop_reason,
        usage=data.last_usage,
        latency_ms=run.call_latency_ms,
    )
    await run.harness.journal.append(record)


async def decide_turn(run: Phase) -> None:
    """Report the turn; a truncated or refused answer becomes the run's error.

    The guards that pick the exit (`turn_unusable`, `turn_is_final`) are asked, never restated.
    """
    data = run.data
    unusable = unusable_turn(run)
    if unusable is not None:
        data.error = unusable
    events = run.harness.events
    if wants(events, MessageReceived):  # the answer text is joined only for a reader
        message = MessageReceived(
            run_id=data.run_id,
            iteration=data.iteration,
            stop_reason=data.stop_reason,
            terminal=unusable is not None or turn_is_final(run),
            text=data.answer(),
            usage=data.last_usage,
        )
        events.emit(message)


async def account_tokens(run: Phase) -> None:
    """Nothing to do: the guards read the usage the call already summed over four tiers."""


async def execute_tool(run: Phase) -> None:
    """Run the first pending tool call and journal its result the instant it ends."""
    data = run.data
    harness = run.harness
    call = data.pending[0]
    name, use_id, arguments = call.name, call.id, call.input
    duration_ms: int | None = None  # measured only for a tool that ran
    data.tool_calls += 1
    known = harness.tools.tools.get(name)
    kind = known.kind if known is not None else "unknown"
    data.tool_kinds[kind] = data.tool_kinds.get(kind, 0) + 1
    outcome = await _interrupted(run, known, use_id, arguments)
    outcome = outcome or harness.tools.rejection(name, arguments)
    if outcome is None and use_id in data.denials:
        outcome = denial(data.denials.pop(use_id))
    if outcome is not None:
        if outcome.warning:
            warning = WarningRaised(
                run_id=data.run_id, warning=outcome.warning, name=name, detail=outcome.content
            )
            harness.events.emit(warning)
    else:
        await harness.journal.append(ToolStarted(seq=run.next_seq(), tool_use_id=use_id, name=name))
        called = ToolCalled(
            run_id=data.run_id,
            name=name,
            tool_use_id=use_id,
            input=dict(arguments),
            tool_kind=kind,
            agent=known.agent if known is not None else "",
        )
        harness.events.emit(called)
        started = time.monotonic()
        outcome = await harness.tools.invoke(name, arguments)
        duration_ms = int((time.monotonic() - started) * 1000)
        finished = ToolFinished(
            run_id=data.run_id,
            name=name,
            tool_use_id=use_id,
            output=outcome.content,
            is_error=outcome.is_error,
        )
        harness.events.emit(finished)
    content = tuple(outcome.blocks) if outcome.blocks else outcome.content
    result = ToolResultBlock(use_id, content, outcome.is_error)
    record = ToolResult(
        seq=run.next_seq(),
        tool_use_id=use_id,
        result=result.to_json(),
        is_error=outcome.is_error,
        kind=kind,
        duration_ms=duration_ms,
    )
    await harness.journal.append(record)
    data.results.append(result)
    data.pending.pop(0)


async def _interrupted(
    run: Phase, tool: Tool | None, use_id: str, arguments: JSONObject
) -> Outcome | None:
    """A call that was running when the process died, under a crash policy other than retry.

    `fail` answers it as an error without running it; `ask` runs it again only if the
    operator says so through the confirm gate's prompter.
    """
    interrupted = run.data.interrupted
    if use_id not in interrupted:
        return None
    interrupted.remove(use_id)
    if tool is None or tool.crash_policy == "retry":
        return None
    if tool.crash_policy == "ask" and await run.harness.gate.may_rerun(tool, arguments):
        return None
    return Outcome(INTERRUPTED, is_error=True, warning="tool_interrupted")


async def check_gate(run: Phase) -> None:
    """Screen the first pending call: it runs, it is denied (nobody to ask), or it must be
    asked, and then the request is journaled and becomes the run's pending approval."""
    data, harness = run.data, run.harness
    call = data.pending[0]
    use_id, arguments = call.id, call.input
    tool = harness.tools.tools.get(call.name)
    if tool is None or use_id in data.interrupted:
        return  # execute rejects an unknown tool; an interrupted call was let through before
    if harness.tools.rejection(call.name, arguments) is not None:
        return
    audit = Audit(data.run_id, use_id, harness.events)
    verdict = harness.gate.screen(tool, arguments, audit, data.allowed)
    if isinstance(verdict, str):
        data.denials[use_id] = verdict
    elif verdict is not None:
        request = ApprovalRequested(
            seq=run.next_seq(),
            run_id=data.run_id,
            tool_use_id=use_id,
            name=tool.name,
            input=dict(arguments),
            tag=verdict.tag,
        )
        await harness.journal.append(request)
        data.approval = approval_of(request)


async def await_approval(run: Phase) -> None:
    """Wait for the operator's answer to the pending approval, holding no slot, and journal
    it. A suspend (before or during the wait) leaves it pending: the run then suspends and a
    resume asks again."""
    data, harness = run.data, run.harness
    pending = data.approval
    if pending is None or run.suspend_requested:
        return
    use_id, name = pending.tool_use_id, pending.name
    audit = Audit(data.run_id, use_id, harness.events)
    request = harness.gate.request(pending, harness.tools.tools.get(name))
    try:
        answer, reason = await run.in_flight.run(harness.gate.ask(request, audit))
    except (CallCancelled, PromptCancelled):
        return
    # A failed prompt (a reason) was answered by nobody: only an operator's answer has an author.
    by = None if reason else _prompter_name(harness.gate.prompter)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = ApprovalAnswered(
        seq=run.next_seq(),
        tool_use_id=use_id,
        answer=answer.value,
        reason=reason or None,
        by=by,
        at=at,
    )
    await harness.journal.append(record)
    data.approval = None
    if answer is Approval.NO:
        data.denials[use_id] = reason
    elif answer is Approval.ALWAYS and name not in data.allowed:
        data.allowed.append(name)


def _prompter_name(prompter: object) -> str | None:
    """Who a prompter stands for (its `name`, e.g. "terminal"), None if it does not say."""
    name = getattr(prompter, "name", None)
    return name if isinstance(name, str) and name else None


async def feed_back_results(run: Phase) -> None:
    """All results of the turn become one user message, the next call's input."""
    data = run.data
    data.messages.append(Message("user", tuple(data.results)))
    data.results = []


async def await_input(run: Phase) -> None:
    """Wait for a chat's next prompt, holding no slot, and journal it as a `user` record that
    holds only the new text (merged into a trailing user message, as the fold does); each
    follow-up adds `max_iterations` to the cap. A suspend (before or during the wait) leaves
    the chat at its prompt; the end of input (`None`) ends the chat; with no input source the
    run suspends, so a journaled chat stays resumable."""
    data, harness = run.data, run.harness
    if not data.at_input:  # the turn that led here: say why it stopped, once
        data.at_input = True
        why = None
        if data.error is not None:
            why = ("turn_error_interactive", data.error)
        elif iteration_cap_reached(run):
            why = ("max_iter_interactive", f"max iterations ({iteration_cap(run)}) reached")
        if why is not None:
            harness.events.emit(WarningRaised(run_id=data.run_id, warning=why[0], detail=why[1]))
    data.pending, run.interrupt_requested = [], False
    if run.suspend_requested:
        return
    if run.input is None:
        run.suspend_requested = True
        return
    text: str | None = ""
    while text is not None and not text.strip():
        try:
            text = await run.in_flight.run(run.input())
        except (CallCancelled, PromptCancelled):
            return
    if text is None:
        data.input_ended = True
        return
    message = Message("user", text)
    await harness.journal.append(User(seq=run.next_seq(), message=message.to_json()))
    merge_user(data.messages, message)
    data.follow_ups += 1
    data.at_input, data.error, data.stop_reason = False, None, None


ACTIONS: dict[str, Callable[[Phase], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        check_boundary,
        call_model,
        journal_turn,
        decide_turn,
        account_tokens,
        check_gate,
        await_approval,
        execute_tool,
        feed_back_results,
        await_input,
    )
}

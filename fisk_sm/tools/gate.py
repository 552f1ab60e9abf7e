"""The confirm gate: a gated tool runs only once the operator has approved the call.

A tool is gated when it carries `ai:confirm` (always honoured) or a tag listed in the config's
`confirm_tags` (exact match). Remote tools are gated by their own host, never here. The operator
answers through a `Prompter`: once, always (remembered by tool name, whatever the arguments, for
the rest of the run) or no. Nobody to ask means no. A denial is a normal result the model reasons
about, `{"allowed": false, "reason": ...}`, never an `is_error`: the call was fine, the operator
said no, and the reason tells the model not to retry.

The gate is two states of the loop (`gate`, `awaiting_approval`), so it works in two halves:
`screen` decides whether a call runs, is denied (nobody to ask) or must be asked, and `ask`
puts a request to the prompter. Between the two the request is journaled, so a run waiting for
an answer can be suspended, restarted and answered later. A prompt abandoned because the run is
suspending (`PromptCancelled`) is no answer: the approval stays pending.

Every gated call is reported through an `Audit` (the run, the call's id, the event sink):
`ApprovalAsked` when the operator is asked, then one `ApprovalGranted` (`once`, `always`, or
`remembered` for an "always" given earlier) or `ApprovalDenied` (with a short reason:
`declined`, `no operator`, or why the prompt failed), so a watcher can audit every decision,
denials without an operator included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from fisk_sm.events.types import (
    ApprovalAsked,
    ApprovalDenied,
    ApprovalGranted,
    Events,
    GatedCall,
    wants,
)
from fisk_sm.journal.snapshot import PendingApproval
from fisk_sm.operator.prompter import (
    NO_OPERATOR,
    Approval,
    ApprovalRequest,
    PromptCancelled,
    Prompter,
    PromptError,
)
from fisk_sm.operator.sanitize import sanitize, strip_control
from fisk_sm.tools.base import Outcome, Tool

__all__ = [
    "CONFIRM_TAG",
    "NO_OPERATOR_REASON",
    "Audit",
    "Gate",
    "GateDecision",
    "denial",
    "gate_decision",
]

CONFIRM_TAG = "ai:confirm"
DISPLAY_LIMIT = 2000
FINAL = "this decision is final, do not retry"
DECLINED = f"the operator declined to permit this command; {FINAL}"
#: The reason of a denial because nobody could be asked.
NO_OPERATOR_REASON = "no operator"
ALTERED = " [terminal control sequences removed]"


def denial(reason: str) -> Outcome:
    """The result handed to the model for a denied call; `reason` as journaled: empty for the
    operator's no, `NO_OPERATOR_REASON`, or why the prompt failed."""
    if not reason:
        text = DECLINED
    elif reason == NO_OPERATOR_REASON:
        text = NO_OPERATOR
    else:
        text = f"the operator did not permit this command: {reason}; {FINAL}"
    return Outcome(json.dumps({"allowed": False, "reason": text}), is_error=False)


def _why(exc: BaseException) -> str:
    return sanitize(str(exc)) or type(exc).__name__


def _display(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """The call as the operator sees it; a control sequence that had to go is pointed out, since
    its payload (an OSC title, say) was part of what would run."""
    try:
        line = tool.describe(arguments)
    # A boundary: a tool module may export a `Tool` with a `display` of its own, and whatever
    # that raises must not stop the question being asked (the JSON call is shown instead).
    except Exception:
        line = f"{tool.name} {json.dumps(dict(arguments), ensure_ascii=False, default=str)}"
    shown = sanitize(line, limit=DISPLAY_LIMIT)
    return shown + ALTERED if strip_control(line) != line else shown


@attrs.frozen
class GateDecision:
    """What the gate will do with a call of `tool`: `verdict` is `ungated` (it runs),
    `remembered` (an `always` given earlier in the run: it runs), `ask` (the operator is
    asked) or `no operator` (denied: nobody to ask); `tag` is the tag that gates it."""

    tool: str
    tag: str | None
    verdict: str

    @property
    def asks(self) -> bool:
        """Whether the operator will be asked."""
        return self.verdict == "ask"

    def __str__(self) -> str:
        if self.tag is None:
            return f"{self.tool} is ungated: it runs"
        said = {
            "remembered": "an earlier `always` is remembered: it runs",
            "ask": "the operator will be asked",
            "no operator": "nobody to ask: it is denied",
        }[self.verdict]
        return f"{self.tool} is gated by {self.tag}: {said}"


def gate_decision(
    name: str, tag: str | None, allowed: Collection[str], available: bool
) -> GateDecision:
    """The gate's decision for a call of tool `name` gated by `tag` (None: ungated), given the
    tools answered `always` (`allowed`) and whether an operator is `available`. Pure: the gate
    acts on it (`Gate.screen`) and `explain()` shows it before the step."""
    if tag is None:
        return GateDecision(name, None, "ungated")
    if name in allowed:
        return GateDecision(name, tag, "remembered")
    return GateDecision(name, tag, "ask" if available else "no operator")


@attrs.frozen
class Audit:
    """Where the gate reports a call's approval: the run, the call's tool_use id, the sink."""

    run_id: str
    tool_use_id: str
    events: Events


def _reporter(
    audit: Audit | None, name: str, arguments: Mapping[str, Any], tag: str
) -> Callable[..., None]:
    """`report(kind, **fields)`: emit one gate event of `kind` for this call (or nothing)."""

    def report(kind: type[GatedCall], **fields: str) -> None:
        if audit is None or not wants(audit.events, kind):
            return
        event = kind(
            run_id=audit.run_id,
            tool=name,
            tool_use_id=audit.tool_use_id,
            arguments=dict(arguments),
            tag=tag,
            **fields,
        )
        audit.events.emit(event)

    return report


class Gate:
    """Decides, per call, whether a tool may run, and asks the operator when it must."""

    def __init__(self, prompter: Prompter, confirm_tags: Sequence[str] = ()) -> None:
        if isinstance(confirm_tags, str):
            raise TypeError("confirm_tags must be a sequence of tags, not one string")
        self.prompter = prompter
        trimmed = (tag.strip() for tag in confirm_tags)
        self.confirm_tags: tuple[str, ...] = tuple(dict.fromkeys(t for t in trimmed if t))

    def gated_tag(self, tool: Tool) -> str | None:
        """The tag that gates `tool`: `ai:confirm`, else its first confirm tag; None if ungated."""
        if tool.kind == "remote":
            return None
        if CONFIRM_TAG in tool.tags:
            return CONFIRM_TAG
        return next((tag for tag in tool.tags if tag in self.confirm_tags), None)

    def gated_tools(self, tools: Iterable[Tool]) -> list[str]:
        """The names of the gated tools among `tools`, in order."""
        return [t.name for t in tools if self.gated_tag(t) is not None]

    def unmatched_tags(self, tools: Iterable[Tool]) -> list[str]:
        """The confirm tags that no local (non-remote) tool carries, in config order."""
        carried = {tag for t in tools if t.kind != "remote" for tag in t.tags}
        return [tag for tag in self.confirm_tags if tag not in carried]

    def decide(self, tool: Tool, allowed: Collection[str] = ()) -> GateDecision:
        """What `screen` will decide for a call of `tool` (`gate_decision`); asks nothing."""
        return gate_decision(tool.name, self.gated_tag(tool), allowed, self.prompter.available)

    def screen(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        audit: Audit,
        allowed: Collection[str] = (),
    ) -> ApprovalRequest | str | None:
        """None if the call may run now (ungated, or its tool is in `allowed`: answered
        "always" earlier in the run); the denial reason if it may not and nobody can be asked;
        else the `ApprovalRequest` to put to the operator (reported as asked)."""
        tag = self.gated_tag(tool)
        if tag is None:
            return None  # ungated: most calls; no decision record built for them
        decision = gate_decision(tool.name, tag, allowed, self.prompter.available)
        report = _reporter(audit, tool.name, arguments, tag)
        if decision.verdict == "remembered":
            report(ApprovalGranted, answer="remembered")
            return None
        if decision.verdict == "no operator":
            report(ApprovalDenied, reason=NO_OPERATOR_REASON)
            return NO_OPERATOR_REASON
        report(ApprovalAsked)
        pending = PendingApproval(audit.run_id, audit.tool_use_id, tool.name, dict(arguments), tag)
        return self.request(pending, tool)

    def request(self, pending: PendingApproval, tool: Tool | None) -> ApprovalRequest:
        """The request for a pending approval (`RunData.approval`), shown as `tool` describes
        it (by name and arguments if the tool is no longer configured)."""
        arguments = dict(pending.input)
        display = (
            _display(tool, arguments)
            if tool is not None
            else sanitize(f"{pending.name} {json.dumps(arguments, default=str)}", DISPLAY_LIMIT)
        )
        return ApprovalRequest(
            pending.name,
            display,
            pending.tag,
            run_id=pending.run_id,
            tool_use_id=pending.tool_use_id,
            arguments=arguments,
        )

    async def ask(self, request: ApprovalRequest, audit: Audit) -> tuple[Approval, str]:
        """Put `request` to the operator: the answer, and for a no the reason to journal (empty
        for the operator's own no). A prompt that fails is a no with its reason; a
        `PromptCancelled` (the run is suspending) propagates: that is no answer."""
        report = _reporter(audit, request.tool, request.arguments, request.tag)
        try:
            answer = await self.prompter.approve(request)
        except PromptError as exc:
            if isinstance(exc, PromptCancelled):
                raise
            report(ApprovalDenied, reason=f"prompt failed: {_why(exc)}")
            return Approval.NO, _why(exc)
        if answer in (Approval.ALWAYS, Approval.ONCE):
            report(ApprovalGranted, answer=answer.value)
            return answer, ""
        report(ApprovalDenied, reason="declined")
        return Approval.NO, ""

    async def may_rerun(self, tool: Tool, arguments: Mapping[str, Any]) -> bool:
        """Whether the operator wants a call that a crash interrupted (crash policy `ask`) run
        again. Nobody to ask, or a failed prompt, means no: the call may have had its effect."""
        if not self.prompter.available:
            return False
        question = (
            f"{tool.name} was interrupted by a crash; run it again? {_display(tool, arguments)}"
        )
        try:
            return bool(await self.prompter.confirm(sanitize(question, limit=DISPLAY_LIMIT + 100)))
        except PromptError:
            return False

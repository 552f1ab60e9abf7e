"""The confirm gate: a gated tool runs only once the operator has approved the call.

A tool is gated when it carries `ai:confirm` (always honoured) or a tag listed in the config's
`confirm_tags` (exact match). Remote tools are gated by their own host, never here. The gate asks
through a `Prompter`: once, always (remembered by tool name, whatever the arguments, for this
process only) or no. Nobody to ask means no. A denial is a normal result the model reasons
about, `{"allowed": false, "reason": ...}`, never an `is_error`: the call was fine, the operator
said no, and the reason tells the model not to retry.

Every gated call is reported, when the caller passes an `Audit` (the run, the call's id, the
event sink): `ApprovalAsked` just before the operator is asked, then one `ApprovalGranted`
(`once`, `always`, or `remembered` for an "always" given earlier) or `ApprovalDenied` (with a
short reason: `declined`, `no operator`, or why the prompt failed), so a watcher can audit
every decision, denials without an operator included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
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

__all__ = ["CONFIRM_TAG", "Audit", "Gate"]

CONFIRM_TAG = "ai:confirm"
DISPLAY_LIMIT = 2000
FINAL = "this decision is final, do not retry"
DECLINED = f"the operator declined to permit this command; {FINAL}"
ENDED = "the run ended before the operator could approve this command"
ALTERED = " [terminal control sequences removed]"


def _denial(reason: str) -> Outcome:
    return Outcome(json.dumps({"allowed": False, "reason": reason}), is_error=False)


def _why(exc: BaseException) -> str:
    return sanitize(str(exc)) or type(exc).__name__


def _display(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """The call as the operator sees it; a control sequence that had to go is pointed out, since
    its payload (an OSC title, say) was part of what would run."""
    try:
        line = tool.describe(arguments)
    except Exception:  # a broken renderer must not stop the question being asked
        line = f"{tool.name} {json.dumps(dict(arguments), ensure_ascii=False, default=str)}"
    shown = sanitize(line, limit=DISPLAY_LIMIT)
    return shown + ALTERED if strip_control(line) != line else shown


@attrs.frozen
class Audit:
    """Where the gate reports a call's approval: the run, the call's tool_use id, the sink."""

    run_id: str
    tool_use_id: str
    events: Events


def _reporter(
    audit: Audit | None, tool: Tool, arguments: Mapping[str, Any], tag: str
) -> Callable[..., None]:
    """`report(kind, **fields)`: emit one gate event of `kind` for this call (or nothing)."""

    def report(kind: type[GatedCall], **fields: str) -> None:
        if audit is None or not wants(audit.events, kind):
            return
        event = kind(
            run_id=audit.run_id,
            tool=tool.name,
            tool_use_id=audit.tool_use_id,
            arguments=dict(arguments),
            tag=tag,
            **fields,
        )
        audit.events.emit(event)

    return report


class Gate:
    """Decides, per call, whether a tool may run; remembers "always" answers by tool name."""

    def __init__(self, prompter: Prompter, confirm_tags: Sequence[str] = ()) -> None:
        if isinstance(confirm_tags, str):
            raise TypeError("confirm_tags must be a sequence of tags, not one string")
        self.prompter = prompter
        trimmed = (tag.strip() for tag in confirm_tags)
        self.confirm_tags: tuple[str, ...] = tuple(dict.fromkeys(t for t in trimmed if t))
        self._always: set[str] = set()

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

    @property
    def always_allowed(self) -> frozenset[str]:
        """The tool names the operator answered "always" for in this process."""
        return frozenset(self._always)

    async def check(
        self, tool: Tool, arguments: Mapping[str, Any], audit: Audit | None = None
    ) -> Outcome | None:
        """None if the call may run, else the (non-error) denial to hand back to the model;
        the decision on a gated call is reported through `audit` (see the module doc)."""
        tag = self.gated_tag(tool)
        if tag is None:
            return None
        report = _reporter(audit, tool, arguments, tag)
        if tool.name in self._always:
            report(ApprovalGranted, answer="remembered")
            return None
        if not self.prompter.available:
            report(ApprovalDenied, reason="no operator")
            return _denial(NO_OPERATOR)
        request = ApprovalRequest(tool.name, _display(tool, arguments), tag)
        report(ApprovalAsked)
        try:
            answer = await self.prompter.approve(request)
        except PromptCancelled as exc:
            report(ApprovalDenied, reason=f"prompt cancelled: {_why(exc)}")
            return _denial(f"{ENDED}: {_why(exc)}; {FINAL}")
        except PromptError as exc:
            report(ApprovalDenied, reason=f"prompt failed: {_why(exc)}")
            return _denial(f"the operator did not permit this command: {_why(exc)}; {FINAL}")
        if answer is Approval.ALWAYS:
            self._always.add(tool.name)
        if answer in (Approval.ALWAYS, Approval.ONCE):
            report(ApprovalGranted, answer=answer.value)
            return None
        report(ApprovalDenied, reason="declined")
        return _denial(DECLINED)

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

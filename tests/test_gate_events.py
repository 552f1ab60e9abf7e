"""The confirm gate reports every gated call: asked, granted (once, always, remembered) or
denied (by the operator, or because there is none), through a real run against the fake API."""

from __future__ import annotations

import io
import json

import structlog
from conftest import make_run

from fisk_sm import JsonLinesEvents, Recorder, StructlogEvents, tool
from fisk_sm.cli.lineui import LineUI
from fisk_sm.events import ApprovalAsked, ApprovalDenied, ApprovalGranted
from fisk_sm.events.types import GatedCall
from fisk_sm.operator.prompter import Approval, NoOperator, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply


@tool(tags=["ai:confirm"])
def rm(path: str) -> str:
    """Remove a path (pretend).

    Args:
        path: what to remove
    """
    return f"removed {path}"


def gate_events(events: Recorder) -> list[tuple[str, str, str, str]]:
    """Each gate event as (kind, tool_use_id, path argument, answer or reason)."""
    return [
        (
            e.kind,
            e.tool_use_id,
            e.arguments["path"],
            getattr(e, "answer", "") or getattr(e, "reason", ""),
        )
        for e in events.of(GatedCall)
    ]


def calls(*paths: str) -> list[Reply]:
    """One turn per path, each calling `rm`, then a final answer."""
    turns = [Reply.tool_use("rm", {"path": p}, id=f"t{n}") for n, p in enumerate(paths)]
    return [*turns, Reply.text("done")]


async def test_once_then_always_then_remembered(api: FakeMessagesAPI) -> None:
    api.add(*calls("a", "b", "c"))
    prompter = ScriptedPrompter(approvals=[Approval.ONCE, Approval.ALWAYS])
    run, events, _ = make_run(api, [rm], prompter=prompter)
    assert await run.run() == "completed"
    assert gate_events(events) == [
        ("approval_asked", "t0", "a", ""),
        ("approval_granted", "t0", "a", "once"),
        ("approval_asked", "t1", "b", ""),
        ("approval_granted", "t1", "b", "always"),
        ("approval_granted", "t2", "c", "remembered"),  # nobody asked again
    ]
    granted = events.of(ApprovalGranted)[0]
    assert (granted.run_id, granted.tool, granted.tag) == ("test-run", "rm", "ai:confirm")
    assert len(prompter.asked) == 2


async def test_a_denial_by_the_operator_is_reported(api: FakeMessagesAPI) -> None:
    api.add(*calls("a"))
    prompter = ScriptedPrompter(approvals=[Approval.NO])
    run, events, _ = make_run(api, [rm], prompter=prompter)
    assert await run.run() == "completed"
    assert gate_events(events) == [
        ("approval_asked", "t0", "a", ""),
        ("approval_denied", "t0", "a", "declined"),
    ]


async def test_a_denial_without_an_operator_is_reported(api: FakeMessagesAPI) -> None:
    api.add(*calls("a"))
    run, events, _ = make_run(api, [rm], prompter=NoOperator())
    assert await run.run() == "completed"
    assert gate_events(events) == [("approval_denied", "t0", "a", "no operator")]
    assert events.of(ApprovalAsked) == []


def test_the_line_ui_and_the_adapters_carry_them() -> None:
    fields = {"run_id": "r", "tool": "rm", "tool_use_id": "t0", "arguments": {"path": "/x"}}
    tag = "ai:\x1b]0;pwned\x07confirm"  # whatever is shown goes through the sanitizer
    asked = ApprovalAsked(**fields, tag=tag)
    granted = ApprovalGranted(**fields, tag=tag, answer="once")
    denied = ApprovalDenied(**fields, tag=tag, reason="no operator")
    err = io.StringIO()
    ui = LineUI(out=io.StringIO(), err=err)
    for event in (asked, granted, denied):
        ui.emit(event)
    assert err.getvalue().splitlines() == [
        "approval granted: rm (once)",
        "approval denied: rm (no operator)",
    ]
    traced = io.StringIO()
    LineUI(out=io.StringIO(), err=traced, trace=True).emit(asked)
    assert (
        traced.getvalue().startswith("approval asked: rm [ai:") and "\x1b" not in traced.getvalue()
    )

    stream = io.StringIO()
    lines = JsonLinesEvents(stream)
    lines.emit(denied)
    lines.close()
    assert json.loads(stream.getvalue()) == {
        "event": "approval_denied",
        **fields,
        "tag": tag,
        "reason": "no operator",
    }
    with structlog.testing.capture_logs() as logged:
        StructlogEvents().emit(granted)
    assert logged == [{"event": "approval_granted", "log_level": "info", **fields, "tag": tag,
                       "answer": "once"}]  # fmt: skip

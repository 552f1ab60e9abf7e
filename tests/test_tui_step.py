"""`fisk-sm tui --step`: the debugger's keys through the Pilot. A breakpoint toggled in its
pane stops the run before the gate asks; `e` explains; the next step asks the approval in a
dialog, `o` answers it, and `c` runs on to the answer. Asserted on the journal (who answered,
and what), the requests the fake received, the app's messages and the screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tui_run import SIZE, journal, write_agent
from textual.message import Message
from textual.widgets import SelectionList, Static
from tuikit import check_snapshot, dialog, local_app, messages_of, wait_for

from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.dialogs import ApprovalDialog
from fisk_sm.tui.step import StepApp


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.delenv("NO_COLOR", raising=False)


def pane(app: StepApp) -> str:
    return str(app.query_one("#step", Static).visual)


async def test_a_breakpoint_an_explanation_and_an_approval(
    tmp_path: Path, api: FakeMessagesAPI, request: pytest.FixtureRequest
) -> None:
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="toolu_1"),
        Reply.tool_use("deploy", {"target": "prod"}, id="toolu_2"),
        Reply.text("shipped"),
    )
    agent, state = write_agent(tmp_path, api), tmp_path / "state"
    seen: list[Message] = []
    argv = ("-c", str(agent), "--step", "--checkpoint", "--name", "st", "--state-dir", str(state))
    async with (
        local_app(*argv, "ship", "it") as app,
        app.run_test(size=SIZE, message_hook=seen.append) as pilot,
    ):
        assert isinstance(app, StepApp)
        points: SelectionList[str] = app.query_one(SelectionList)
        await wait_for(pilot, lambda: points.option_count > 0, "the breakpoints")
        points.focus()
        names = [str(points.get_option_at_index(i).prompt) for i in range(points.option_count)]
        points.highlighted = names.index("approval")
        await pilot.press("space")
        assert points.selected == ["approval"]
        await pilot.press("s")
        await wait_for(pilot, lambda: pane(app).startswith("stepped: "), "one step")
        assert pane(app).startswith("stepped: suspend_check --")
        # the record of the step: the exits tried before the one taken, and their guards
        assert "tried suspended: suspend_requested = False" in pane(app)
        await pilot.press("c")
        await wait_for(pilot, lambda: pane(app).startswith("stopped: "), "the breakpoint")
        assert app.run_ is not None and app.run_.state == "gate"
        assert not any(r.get("type") == "approval_requested" for r in journal(state))
        check_snapshot(app, "step-at-breakpoint", request.config, tmp_path)
        await pilot.press("e")
        await wait_for(pilot, lambda: "gate" in pane(app) and "deploy" in pane(app), "explain")
        await pilot.press("s")  # the gate journals the question
        await wait_for(pilot, lambda: app.run_.state == "awaiting_approval", "the gate")
        await pilot.press("s")  # and the wait asks it: the dialog
        await dialog(pilot, ApprovalDialog, "the dialog")
        shown = str(app.screen.query_one("#approval-input", Static).visual)
        assert '"target": "prod"' in shown
        await pilot.press("o")
        await wait_for(pilot, lambda: not isinstance(app.screen, ApprovalDialog), "answered")
        points.deselect_all()
        await pilot.press("c")
        await wait_for(pilot, lambda: app.ended == "completed", "the answer")
        await pilot.press("q")
    assert app.return_code == 0
    records = journal(state)
    (answered,) = [r for r in records if r.get("type") == "approval_answered"]
    assert answered["answer"] == "once" and answered["by"] == "tui"
    results = [r["result"]["content"] for r in records if r.get("type") == "tool_result"]
    assert results == ["5", "deployed prod"]
    assert len(api.requests) == 3
    toggled = messages_of(SelectionList.SelectionToggled, seen)
    assert [m.selection.value for m in toggled] == ["approval"]
    dismissed = [m for m in seen if type(m).__name__ == "ScreenResume"]
    assert dismissed  # the main screen came back after the dialog

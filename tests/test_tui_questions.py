"""The `ask_human_*` tools in the full-screen UI: each question is a modal dialog behind the
`Prompter` protocol (a line, a choice, yes/no), answered by keypresses; the answers reach the
model as the tools' results. A question's markup is shown as typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_mcp_serve import tool_results
from test_tui_run import SIZE
from textual.widgets import Static
from tuikit import dialog, local_app, wait_for

from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.dialogs import AskDialog, ConfirmDialog, SelectDialog


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.delenv("NO_COLOR", raising=False)


async def test_ask_human_questions_are_dialogs(tmp_path: Path, api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("ask_human_input", {"question": "[bold]your name?[/bold]"}, id="t1"),
        Reply.tool_use("ask_human_select", {"question": "which?", "options": ["a", "b"]}, id="t2"),
        Reply.tool_use("ask_human_confirm", {"question": "sure?"}, id="t3"),
        Reply.text("thanks"),
    )
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        f"llm: {{model: claude-test, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "harness: {human_in_the_loop: {enabled: true}}\n"
    )
    async with local_app("-c", str(agent), "ask me") as app, app.run_test(size=SIZE) as pilot:
        await dialog(pilot, AskDialog, "the line")
        question = str(app.screen.query_one(".question", Static).visual)
        assert question == "[bold]your name?[/bold]"
        await pilot.press(*"ada", "enter")
        await dialog(pilot, SelectDialog, "the choice")
        await pilot.press("down", "enter")
        await dialog(pilot, ConfirmDialog, "yes or no")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.ended == "completed", "the answer")
        await pilot.press("q")
    assert app.return_code == 0
    assert tool_results(api) == [{"value": "ada"}, {"selected": "b"}, {"confirmed": True}]

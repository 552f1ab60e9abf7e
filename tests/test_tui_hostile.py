"""A hostile transcript in the full-screen UI: Textual markup, control and bidi characters, a
10,000-line tool result and a 1 MB answer. Each message stays one line (the answer, unfolded
for the run that completed, is capped), markup is shown as typed and never run, no control
character reaches the screen, and the panes keep their places."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentkit import write_agent
from test_tui_run import SIZE
from tuikit import check_snapshot, colours, local_app, settle

from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.text import BLOCK_CHARS, BLOCK_LINES
from fisk_sm.tui.transcript import Entry

MARKUP = "[bold]loud[/bold] [@click=app.quit]quit[/] [red on white]x[/]"
CONTROLS = "\x1b[2J\x1b]0;pwned\x07 \u202egnp.exe\u202c \x9b31m"
DUMP = '''

@tool
def dump(n: int) -> str:
    """n hostile lines.

    Args:
        n: how many
    """
    return "\\n".join(f"[bold]line {i}[/bold] \\x1b[31m\\u202e" for i in range(n))
'''


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.delenv("NO_COLOR", raising=False)


def write_hostile_agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    return write_agent(tmp_path, api, "tui_hostile_tools", ("dump",), DUMP)


@pytest.mark.timeout(300)
async def test_a_hostile_transcript_stays_one_line_per_message(
    tmp_path: Path, api: FakeMessagesAPI, request: pytest.FixtureRequest
) -> None:
    answer = ("A" * 99 + "\n") * 10_000  # 1 MB, in 10,000 lines
    api.add(
        Reply.tool_use("dump", {"n": 10_000}, id="toolu_1", text=f"{MARKUP} {CONTROLS}"),
        Reply.text(f"{MARKUP}\n{CONTROLS}\n{answer}"),
    )
    agent = write_hostile_agent(tmp_path, api)
    async with (
        local_app("-c", str(agent), f"{MARKUP} {CONTROLS}") as app,
        app.run_test(size=SIZE) as pilot,
    ):
        await settle(pilot)
        assert app.ended == "completed"
        panes = {name: app.query_one(name).region for name in ("#machine", "#transcript")}
        entries = list(app.query(Entry))
        assert [e.label for e in entries] == ["you:", "model:", "→ dump", "←", "model:"]
        *folded, last = entries
        assert all(e.folded and e.size.height == 1 for e in folded)
        assert not last.folded
        assert str(last.visual).count("\n") <= BLOCK_LINES + 2  # its label, the lines, the note
        assert last.size.height <= BLOCK_LINES + 2 + BLOCK_CHARS // last.size.width  # wrapped
        # the result as the loop kept it (the tool's cap keeps its head and tail): thousands of
        # lines, folded to one
        result = entries[3].text
        assert result.count("\n") > 2_000 and result.endswith("line 9999[/bold] \x1b[31m\u202e")
        shown = [str(e.visual) for e in entries]
        assert all(MARKUP in text for text in (shown[0], shown[1], shown[4]))
        assert "more characters" in shown[4] and "not shown" in shown[4]
        for text in shown:
            assert not any(c in text for c in "\x1b\x07\x9b\u202e\u202c"), text[:200]
        await pilot.click(entries[1])  # a click unfolds: the markup's @click does not run
        await settle(pilot)
        assert app.is_running and not entries[1].folded
        await pilot.click(entries[1])
        await settle(pilot)
        assert {n: app.query_one(n).region for n in panes} == panes
        svg = check_snapshot(app, "run-hostile", request.config, tmp_path)
        assert "[bold]loud[/bold]" in svg.replace("&#160;", " ")
        assert colours(svg)
        await pilot.press("q")
    assert app.return_code == 0

"""`fisk-sm tui`, a run: Textual's Pilot drives the app against the fake Messages API (the
real SDK over loopback), and the tests assert on the journal, the requests the fake received,
the app's messages and its screen (an SVG snapshot)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agentkit
import pytest
from textual.message import Message
from tuikit import check_snapshot, colours, dialog, local_app, messages_of, settle, wait_for

from fisk_sm.config.agent import Budget
from fisk_sm.events.types import MessageReceived, RunEnded, RunResumed, StateEntered, ToolCalled
from fisk_sm.loop.run import Run, loop_machine
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.app import RunApp, Wiring
from fisk_sm.tui.dialogs import ApprovalDialog
from fisk_sm.tui.panes import MachinePane
from fisk_sm.tui.sink import EventPosted, TextStreamed
from fisk_sm.tui.transcript import Entry, Transcript

SIZE = (150, 44)


def write_agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    """An agent.yaml with `add` and the gated `deploy` (tui_tools.py), against the fake API."""
    return agentkit.write_agent(tmp_path, api, "tui_tools", ("add", "deploy"))


def journal(state: Path) -> list[dict[str, object]]:
    """The records of the one session journal under `state`."""
    (path,) = [p for p in state.iterdir() if p.suffix == ".json"]
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.delenv("NO_COLOR", raising=False)


async def test_a_run_to_its_answer(
    tmp_path: Path, api: FakeMessagesAPI, request: pytest.FixtureRequest
) -> None:
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="toolu_1"),
        Reply.text("2 + 3 is **5**, as [bold]add[/bold] said"),
    )
    agent, state = write_agent(tmp_path, api), tmp_path / "state"
    seen: list[Message] = []
    argv = ("-c", str(agent), "--checkpoint", "--name", "tui-run", "--state-dir", str(state))
    async with (
        local_app(*argv, "add", "2", "and", "3") as app,
        app.run_test(size=SIZE, message_hook=seen.append) as pilot,
    ):
        await settle(pilot)
        assert app.ended == "completed"
        entries = [(e.label, e.text) for e in app.query(Entry)]
        assert entries == [
            ("you:", "add 2 and 3"),
            ("→ add", '{"a": 2, "b": 3}'),
            ("←", "5"),
            ("model:", "2 + 3 is **5**, as [bold]add[/bold] said"),
        ]
        machine = app.query_one(MachinePane)
        assert machine.current == "completed"
        assert {"call", "execute", "feed_back", "decide"} <= machine.entered
        check_snapshot(app, "run-completed", request.config, tmp_path)
        await pilot.press("q")
    assert app.return_code == 0
    # the app's messages: every event of the run, and the streamed text, coalesced
    events = [m.event for m in messages_of(EventPosted, seen)]
    assert [type(e) for e in events if isinstance(e, MessageReceived | RunEnded)] == [
        MessageReceived,
        MessageReceived,
        RunEnded,
    ]
    assert [e.name for e in events if isinstance(e, ToolCalled)] == ["add"]
    assert [e.state for e in events if isinstance(e, StateEntered)][-1] == "completed"
    streamed = messages_of(TextStreamed, seen)
    assert streamed and len(streamed) <= streamed[0].buffer.received
    # what the fake received and what the journal holds
    assert len(api.requests) == 2 and api.requests[0]["stream"] is True
    assert api.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"
    records = journal(state)
    assert [r.get("type") for r in records] == [
        "meta",
        "assistant",  # the turn that calls add
        "tool_started",
        "tool_result",
        "assistant",  # the answer
        "terminal",
    ]
    assert records[3]["result"]["content"] == "5" and records[-1]["reason"] == "completed"


def greys(colours: set[str]) -> bool:
    """Whether every colour is a grey (red, green and blue alike)."""
    return all(c[1:3] == c[3:5] == c[5:7] for c in colours)


async def test_no_color_draws_a_screen_without_colour(
    tmp_path: Path,
    api: FakeMessagesAPI,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: dict[str, str] = {}
    for name, no_color in (("run-colour", False), ("run-no-color", True)):
        api.add(Reply.tool_use("add", {"a": 1, "b": 1}, id="toolu_1"), Reply.text("2"))
        agent = write_agent(tmp_path, api)
        if no_color:  # Textual reads it (and pops it) as each app is made: set it just before
            monkeypatch.setenv("NO_COLOR", "1")
        async with (
            local_app("-c", str(agent), "one", "and", "one") as app,
            app.run_test(size=SIZE) as pilot,
        ):
            await settle(pilot)
            assert app.ended == "completed"
            if no_color:
                drawn[name] = check_snapshot(app, name, request.config, tmp_path)
            else:
                drawn[name] = app.export_screenshot()
            await pilot.press("q")
    assert not greys(colours(drawn["run-colour"]))  # the borders, the keys: blue, orange
    assert greys(colours(drawn["run-no-color"]))


async def _never(wiring: Wiring, prompt: str | None) -> Run:
    await asyncio.Event().wait()  # no run: the test hands the text over itself
    raise AssertionError


async def test_a_fast_stream_is_coalesced_not_one_message_per_token() -> None:
    app = RunApp(_never, loop_machine().table, Budget(), "stream")
    seen: list[Message] = []
    tokens = [f"t{i} " for i in range(1000)]
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await pilot.pause()
        for token in tokens:  # faster than the app takes them: all before it looks
            app.sink.on_text(token)
        transcript = app.query_one(Transcript)
        await wait_for(
            pilot,
            lambda: (e := transcript.streaming) is not None and e.text == "".join(tokens),
            "the whole text",
        )
    handled = messages_of(TextStreamed, seen)
    assert 1 <= len(handled) <= 3  # one per token without `can_replace`


async def test_ctrl_c_suspends_at_the_question_and_resume_asks_again(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("deploy", {"target": "prod"}, id="toolu_1"), Reply.text("shipped"))
    agent, state = write_agent(tmp_path, api), tmp_path / "state"
    where = ("-c", str(agent), "--state-dir", str(state))
    async with (
        local_app(*where, "--checkpoint", "--name", "sus", "ship", "it") as app,
        app.run_test(size=SIZE) as pilot,
    ):
        await dialog(pilot, ApprovalDialog, "the question")
        await pilot.press("ctrl+c")  # a key, not a signal: suspend now
        await wait_for(pilot, lambda: app.ended == "suspended", "the suspend")
        assert not isinstance(app.screen, ApprovalDialog)  # the question went with it
        await pilot.press("q")
    assert app.return_code == 0
    types = [r.get("type") for r in journal(state)]
    assert "approval_requested" in types and "approval_answered" not in types
    assert types[-1] == "terminal" and journal(state)[-1]["reason"] == "suspended"
    seen: list[Message] = []
    async with (
        local_app(*where, "--resume", "sus") as app,
        app.run_test(size=SIZE, message_hook=seen.append) as pilot,
    ):
        await dialog(pilot, ApprovalDialog, "asked again")
        await pilot.press("o")
        await wait_for(pilot, lambda: app.ended == "completed", "the answer")
        labels = [e.label for e in app.query(Entry)]
        assert labels[:2] == ["user:", "->"]  # the transcript so far, from RunResumed
        await pilot.press("q")
    assert app.return_code == 0
    assert any(isinstance(m.event, RunResumed) for m in messages_of(EventPosted, seen))
    records = journal(state)
    results = [r["result"]["content"] for r in records if r.get("type") == "tool_result"]
    assert results == ["deployed prod"]  # ran once, after the answer given on resume
    (answered,) = [r for r in records if r.get("type") == "approval_answered"]
    assert answered["by"] == "tui" and answered["answer"] == "once"

"""`fisk-sm tui --chat`: two turns typed in the box, `/reset` to a new session, and Ctrl-C (a
key, not a signal) suspending at the prompt; asserted on the journal, the requests the fake
received and the app's messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tui_run import SIZE, journal, write_agent
from textual.message import Message
from textual.widgets import Input
from tuikit import check_snapshot, local_app, messages_of, wait_for

from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.transcript import Entry


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.delenv("NO_COLOR", raising=False)


def said(app: object) -> list[tuple[str, str]]:
    from textual.app import App

    assert isinstance(app, App)
    return [(e.label, e.text) for e in app.query(Entry)]


async def test_two_chat_turns_a_reset_and_ctrl_c(
    tmp_path: Path, api: FakeMessagesAPI, request: pytest.FixtureRequest
) -> None:
    api.add(Reply.text("hello, you"), Reply.text("the second answer"), Reply.text("fresh start"))
    agent, state = write_agent(tmp_path, api), tmp_path / "state"
    seen: list[Message] = []
    argv = ("-c", str(agent), "--chat", "--checkpoint", "--name", "talk", "--state-dir", str(state))
    async with local_app(*argv) as app, app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: ("model:", "hello, you") in said(app), "turn 1")
        await pilot.press(*"and again", "enter")
        await wait_for(pilot, lambda: ("model:", "the second answer") in said(app), "turn 2")
        answers = [e for e in app.query(Entry) if e.label == "model:"]
        assert [e.folded for e in answers] == [False, False]  # each turn's answer, to be read
        check_snapshot(app, "chat-two-turns", request.config, tmp_path)
        await pilot.press(*"/reset", "enter")
        await wait_for(pilot, lambda: app.run_ is not None and app.run_.finished, "reset")
        await pilot.press(*"anew", "enter")
        await wait_for(pilot, lambda: ("model:", "fresh start") in said(app), "new session")
        await pilot.press("ctrl+c")  # at the prompt: the session ends, suspended
        await wait_for(pilot, lambda: app.return_code is not None, "the chat's end")
    assert app.ended == "suspended"
    assert app.return_code == 0
    assert [m.value for m in messages_of(Input.Submitted, seen)] == [
        "hi",
        "and again",
        "/reset",
        "anew",
    ]
    # the second turn was sent with the first in the conversation; the reset's was not
    texts = [[text_of(m["content"]) for m in r["messages"]] for r in api.requests]
    assert texts == [["hi"], ["hi", "hello, you", "and again"], ["anew"]]
    first, second = sorted(p.name for p in state.iterdir() if p.suffix == ".json")
    assert (first, second) == ("talk-2.json", "talk.json")
    users = [r for r in journal_of(state / "talk.json") if r.get("type") == "user"]
    assert [text_of(u["message"]["content"]) for u in users] == ["and again"]
    ended = [r for r in journal_of(state / "talk-2.json") if r.get("type") == "terminal"]
    assert ended[-1]["reason"] == "suspended"


def text_of(content: object) -> str:
    """A message's text, whether its content is a string or blocks."""
    if isinstance(content, str):
        return content
    assert isinstance(content, list)
    return "".join(b["text"] for b in content if b.get("type") == "text")


def journal_of(path: Path) -> list[dict[str, object]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line]


_ = journal

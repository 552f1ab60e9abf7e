"""Ctrl-C at every prompt and on every turn of `fisk-sm chat`, and `/reset` with `--name`: on a
real pseudo-terminal (pexpect), real signals and real journals, against the fake Messages API.

At a prompt the terminal is in raw mode, so Ctrl-C is a key prompt_toolkit reads; during a turn
it is a SIGINT, which the chat's own handler takes. prompt_toolkit's `prompt_async` removed that
handler when it returned, so every turn after the first ignored Ctrl-C.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pexpect
import pytest
from test_chat_cli import CLI, HANG, environment, spawn, text, wait_for

from fisk_sm.cli.chat import derived_id
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.ids import MAX_RUN_ID
from fisk_sm.journal.records import Assistant, Meta, Terminal, User
from fisk_sm.testing import FakeMessagesAPI, Reply


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n")
    return path


def turn(child: pexpect.spawn, prompt: str, answer: str) -> None:
    child.expect_exact("you>")
    child.sendline(prompt)
    child.expect_exact(answer)


def ended(child: pexpect.spawn) -> int:
    """Wait for the chat to exit; its exit status."""
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, f"killed by signal {child.signalstatus}"
    return child.exitstatus


def terminals(state: Path, run_id: str) -> list[str]:
    return [r.reason for r in FileStore(state).load(run_id) if isinstance(r, Terminal)]


def follow_ups(state: Path, run_id: str) -> list[object]:
    return [r.message["content"] for r in FileStore(state).load(run_id) if isinstance(r, User)]


def test_ctrl_c_at_the_third_prompt_suspends_and_the_chat_resumes_there(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("one"), Reply.text("two"), Reply.text("three"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "k")
    try:
        turn(child, "first", "one")
        turn(child, "second", "two")
        child.expect_exact("you>")  # the third prompt
        child.sendintr()
        child.expect_exact("suspended; resume with: fisk-sm chat")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert terminals(state, "k") == ["suspended"]
    assert len(api.requests) == 2
    child = spawn(tmp_path, *where, "--resume", "k")
    try:
        child.expect_exact("in awaiting_input")
        turn(child, "third", "three")
        child.expect_exact("you>")
        child.sendline("/exit")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert api.requests[2]["messages"] == [
        {"role": "user", "content": "first"}, text("one"),
        {"role": "user", "content": "second"}, text("two"),
        {"role": "user", "content": "third"},
    ]  # fmt: skip
    assert follow_ups(state, "k") == ["second", "third"]
    assert terminals(state, "k") == ["suspended", "suspended"]


def test_ctrl_c_on_the_third_turn_interrupts_it_and_a_second_suspends_now(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    # The third answer never comes on its own (the delay outlasts the test): only the second
    # Ctrl-C, a suspend-now that cancels the call, ends the turn.
    api.add(Reply.text("one"), Reply.text("two"), Reply.text("LATE", delay=HANG * 2))
    api.add(Reply.text("three"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "t")
    try:
        turn(child, "first", "one")
        turn(child, "second", "two")
        child.expect_exact("you>")
        child.sendline("third")
        wait_for(lambda: len(api.requests) == 3)  # the third turn's call is in flight
        child.sendintr()
        child.expect_exact("interrupting at the next loop boundary")
        child.sendintr()
        child.expect_exact("suspending now")
        child.expect_exact("suspended; resume with: fisk-sm chat")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert terminals(state, "t") == ["suspended"]
    records = FileStore(state).load("t")  # nothing of the cancelled call is journaled
    assert [r.message for r in records if isinstance(r, Assistant)] == [text("one"), text("two")]
    assert follow_ups(state, "t") == ["second", "third"]
    child = spawn(tmp_path, *where, "--resume", "t")
    try:
        child.expect_exact("three")  # the cancelled call is made again
        child.expect_exact("you>")
        child.sendline("/exit")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert api.requests[3]["messages"] == api.requests[2]["messages"]


def test_ctrl_c_on_the_second_turn_of_a_plain_chat_interrupts_it_and_a_second_aborts(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("one"), Reply.text("LATE", delay=HANG * 2))
    child = spawn(tmp_path, "-c", str(agent))
    try:
        turn(child, "first", "one")
        child.expect_exact("you>")
        child.sendline("second")
        wait_for(lambda: len(api.requests) == 2)
        child.sendintr()
        child.expect_exact("interrupting at the next loop boundary")
        child.sendintr()  # a plain chat cannot be suspended: the second Ctrl-C aborts
        child.expect_exact("aborted")
        assert ended(child) == 130
    finally:
        child.close(force=True)
    assert len(api.requests) == 2


def test_ctrl_c_at_the_first_prompt_leaves_without_a_session_or_suspends_a_resumed_one(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("one"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "f")
    try:
        child.expect_exact("you>")
        child.sendintr()
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert FileStore(state).list() == []  # nothing was typed: no session was begun
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "f")
    try:
        turn(child, "first", "one")
        child.expect_exact("you>")
        child.sendline("/exit")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    child = spawn(tmp_path, *where, "--resume", "f")
    try:
        child.expect_exact("you>")  # a resumed chat's first prompt
        child.sendintr()
        child.expect_exact("suspended; resume with: fisk-sm chat")
        assert ended(child) == 0
    finally:
        child.close(force=True)
    assert terminals(state, "f") == ["suspended", "suspended"]
    assert len(api.requests) == 1


def test_reset_with_name_gives_the_next_sessions_derived_ids_and_leaves_others_alone(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("older"), Reply.text("one"), Reply.text("two"), Reply.text("three"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    # A session that already has the first derived id: the chat must skip it, not reopen it.
    older = subprocess.run(
        [*CLI, "chat", *where, "--checkpoint", "--name", "talk-2"],
        input="an older chat\n", capture_output=True, text=True, env=environment(), timeout=HANG,
    )  # fmt: skip
    assert older.returncode == 0, older.stderr
    older_bytes = FileStore(state).path("talk-2").read_bytes()
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "talk")
    try:
        turn(child, "hello", "one")
        child.expect_exact("you>")
        child.sendline("/reset")
        child.expect_exact("you>")
        child.sendline("start over")
        child.expect_exact("session talk-2 exists already")
        child.expect_exact("session: talk-3")
        child.expect_exact("two")
        child.expect_exact("you>")
        child.sendline("/reset")
        child.expect_exact("you>")
        child.sendline("once more")
        child.expect_exact("session: talk-4")
        child.expect_exact("three")
        child.expect_exact("you>")
        child.sendeof()
        assert ended(child) == 0
    finally:
        child.close(force=True)
    store = FileStore(state)
    assert sorted(s.run_id for s in store.list()) == ["talk", "talk-2", "talk-3", "talk-4"]
    assert store.path("talk-2").read_bytes() == older_bytes
    first = store.load("talk")
    assert isinstance(first[0], Meta) and first[0].prompt == "hello"
    assert [r.message for r in first if isinstance(r, Assistant)] == [text("one")]
    assert terminals(state, "talk") == ["suspended"]
    for run_id, prompt, answer in (
        ("talk-3", "start over", "two"),
        ("talk-4", "once more", "three"),
    ):
        records = store.load(run_id)
        assert isinstance(records[0], Meta) and records[0].prompt == prompt
        assert [r.message for r in records if isinstance(r, Assistant)] == [text(answer)]
        assert terminals(state, run_id) == ["suspended"]
    # each new session is its own conversation, begun with the line typed after /reset
    assert [r["messages"] for r in api.requests[2:]] == [
        [{"role": "user", "content": "start over"}],
        [{"role": "user", "content": "once more"}],
    ]


def test_derived_ids_count_up_and_fit_the_id_length() -> None:
    assert [derived_id("talk", n) for n in (2, 3, 10)] == ["talk-2", "talk-3", "talk-10"]
    long = "a" * MAX_RUN_ID
    assert derived_id(long, 2) == "a" * (MAX_RUN_ID - 2) + "-2"
    assert derived_id(long, 100) == "a" * (MAX_RUN_ID - 4) + "-100"

"""`fisk-sm chat`, driven in a pseudo-terminal (pexpect) and through stdin lines, against the
fake Messages API over loopback: real processes, real signals (SIGINT, SIGKILL), real journals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Terminal, User
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
#: A guard against a hang, far above what any machine needs.
HANG = 60

TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b
'''


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    (tmp_path / "calc_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "tools: [{python: 'calc_tools:add'}]\n"
    )
    return path


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return {**env, "ANTHROPIC_API_KEY": "test", "PROMPT_TOOLKIT_NO_CPR": "1"}


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    return pexpect.spawn(
        CLI[0],
        [*CLI[1:], "chat", *args],
        cwd=str(tmp_path),
        env=environment(),
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )


def chat_lines(tmp_path: Path, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "chat", *args],
        input=stdin,
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=HANG,
    )


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.02)


def text(reply: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": reply}]}


def test_two_follow_ups_in_a_terminal_each_after_the_whole_conversation(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("first answer"), Reply.text("second answer"), Reply.text("third answer"))
    child = spawn(tmp_path, "-c", str(agent))
    try:
        child.expect_exact("you>")
        child.sendline("hello")
        child.expect_exact("first answer")
        child.expect_exact("you>")
        child.sendline("and then?")
        child.expect_exact("second answer")
        child.expect_exact("you>")
        child.sendline("more")
        child.expect_exact("third answer")
        child.expect_exact("you>")
        child.sendeof()  # Ctrl-D: a plain chat ends completed
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert [r["messages"] for r in api.requests] == [
        [{"role": "user", "content": "hello"}],
        [{"role": "user", "content": "hello"}, text("first answer"),
         {"role": "user", "content": "and then?"}],
        [{"role": "user", "content": "hello"}, text("first answer"),
         {"role": "user", "content": "and then?"}, text("second answer"),
         {"role": "user", "content": "more"}],
    ]  # fmt: skip
    assert all(r.get("stream") is True for r in api.requests)  # streamed on a terminal


def test_a_chat_killed_at_its_prompt_resumes_there_with_no_model_call(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("first answer"), Reply.text("second answer"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    child = spawn(tmp_path, *where, "--checkpoint", "--name", "k")
    try:
        child.expect_exact("you>")
        child.sendline("hello")
        child.expect_exact("first answer")
        child.expect_exact("you>")
        os.kill(child.pid, signal.SIGKILL)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    records = FileStore(state).load("k")
    assert not any(isinstance(r, Terminal) for r in records)  # killed: no end was journaled
    child = spawn(tmp_path, *where, "--resume", "k")
    try:
        child.expect_exact("in awaiting_input")
        child.expect_exact("you>")
        assert len(api.requests) == 1  # back at the prompt, and no model call was made
        child.sendline("next")
        child.expect_exact("second answer")
        child.expect_exact("you>")
        child.sendline("/exit")
        child.expect_exact("suspended; resume with: fisk-sm chat")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert api.requests[1]["messages"] == [
        {"role": "user", "content": "hello"},
        text("first answer"),
        {"role": "user", "content": "next"},
    ]
    records = FileStore(state).load("k")
    assert [r.message for r in records if isinstance(r, User)] == [
        {"role": "user", "content": "next"}
    ]
    assert records[-1].reason == "suspended"  # type: ignore[union-attr]


def test_reset_starts_a_new_session_and_the_old_one_ends_suspended(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("first answer"), Reply.text("fresh answer"))
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    done = chat_lines(
        tmp_path, "hello\n/reset\nstart over\n", *where, "--checkpoint", "--name", "r1"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["first answer", "fresh answer"]
    # the second session starts with the text typed after /reset, alone
    assert api.requests[1]["messages"] == [{"role": "user", "content": "start over"}]
    listed = subprocess.run(
        [*CLI, "session", "ls", "--json", "--state-dir", str(state)],
        capture_output=True, text=True, env=environment(), check=True,
    )  # fmt: skip
    sessions = {s["id"]: s for s in json.loads(listed.stdout)}
    assert len(sessions) == 2 and sessions["r1"]["status"] == "suspended"
    (other,) = set(sessions) - {"r1"}
    assert sessions[other]["status"] == "suspended"  # end of input: a journaled chat suspends
    assert sessions[other]["prompt"] == "start over"


def test_resume_refuses_a_chat_as_a_one_shot_run_and_the_reverse(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("a chat answer"), Reply.error(400))  # the one-shot fails: resumable
    state = tmp_path / "state"
    where = ["-c", str(agent), "--state-dir", str(state)]
    assert chat_lines(tmp_path, "hi\n", *where, "--checkpoint", "--name", "c").returncode == 0
    one_shot = subprocess.run(
        [*CLI, "run", *where, "--checkpoint", "--name", "o", "hi"],
        capture_output=True, text=True, env=environment(), timeout=HANG,
    )  # fmt: skip
    assert one_shot.returncode == 1, one_shot.stderr
    before = [len(FileStore(state).load(i)) for i in ("c", "o")]
    refused = subprocess.run(
        [*CLI, "run", *where, "--resume", "c"],
        capture_output=True, text=True, env=environment(), timeout=HANG,
    )  # fmt: skip
    assert refused.returncode == 2
    assert 'session "c" is a chat: resume it with fisk-sm chat' in refused.stderr
    refused = chat_lines(tmp_path, "hi\n", *where, "--resume", "o")
    assert refused.returncode == 2
    assert 'session "o" is not a chat: resume it with fisk-sm run --resume o' in refused.stderr
    assert "Traceback" not in refused.stderr
    assert [len(FileStore(state).load(i)) for i in ("c", "o")] == before  # nothing written
    assert len(api.requests) == 2


def test_ctrl_c_interrupts_a_turn_and_at_an_empty_prompt_exits(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("add", {"a": 2, "b": 3}, delay=1.0), Reply.text("never asked"))
    child = spawn(tmp_path, "-c", str(agent))
    try:
        child.expect_exact("you>")
        child.sendline("add 2 and 3")
        wait_for(lambda: len(api.requests) == 1)  # the model call is in flight
        child.sendintr()
        child.expect_exact("interrupting at the next loop boundary")
        child.expect_exact("-> add")  # the tool of the turn still runs
        child.expect_exact("you>")  # and the turn stops at the boundary: back at the prompt
        assert len(api.requests) == 1
        child.sendintr()  # Ctrl-C at an empty prompt ends the chat
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert len(api.requests) == 1

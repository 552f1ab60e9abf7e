"""Sessions journaled by an older build resume and finish under the current code.

What this protects: every journal already on disk. tests/fixtures/compat/<shape>/ holds a
session exactly as the build at commit be621ac wrote it (made once by make_fixtures.py, which
says how), with its agent.yaml, the fingerprint that build computed, and the fake API replies
that finish it. Each shape must:

- have the same resume fingerprint under the current code (no `--force` needed to resume);
- resume and finish, the model receiving exactly the conversation the old journal implies;
- keep its old lines byte for byte (a resume only appends).

If one fails, a change broke the journal format, the fold, the resume gate or the fingerprint
for sessions that already exist. Fix the code, or write a migration; never regenerate these
fixtures with the current code, which would hide the very break they are here to catch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fisk_sm import RunOptions, resume_session
from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Terminal
from fisk_sm.loop.fingerprint import fingerprint
from fisk_sm.loop.harness import Harness
from fisk_sm.operator.prompter import Approval, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, load_script

FIXTURES = Path(__file__).parent / "fixtures" / "compat"
SHAPES = [
    "chat_waiting",
    "pending_approval",
    "mid_batch",
    "crash_after_tool_started",
    "completed",
    "lone_surrogate",
]
RUN_ID = "compat"
CLI = [sys.executable, "-m", "fisk_sm.cli"]
HANG = 60  # a guard against a hang, far above what any machine needs


def copied(shape: str, tmp_path: Path) -> Path:
    """The fixture copied to `tmp_path` (the checked-in files are never written), as a state
    dir would hold it (0700, 0600)."""
    where = shutil.copytree(FIXTURES / shape, tmp_path / shape)
    (where / "sessions").chmod(0o700)
    journal(where).chmod(0o600)
    return where


def journal(where: Path) -> Path:
    return where / "sessions" / f"{RUN_ID}.json"


def old_lines(shape: str) -> list[dict[str, Any]]:
    """The fixture's records as plain JSON (the stdlib reads the old \\u escapes as is)."""
    return [json.loads(line) for line in journal(FIXTURES / shape).read_bytes().splitlines()]


def cli(
    where: Path, api: FakeMessagesAPI, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.base_url}
    return subprocess.run(
        [*CLI, *args], cwd=where, env=env, input=stdin, capture_output=True, text=True,
        timeout=HANG,
    )  # fmt: skip


def resume(where: Path, api: FakeMessagesAPI, command: str, stdin: str = "") -> str:
    """`fisk-sm COMMAND --resume compat` (never --force) with the fixture's finishing replies;
    its stdout."""
    api.add(*load_script(where / "script.yaml"))
    args = [command, "-c", "agent.yaml", "--state-dir", "sessions", "--resume", RUN_ID]
    done = cli(where, api, *args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def finished(shape: str, where: Path, end: str = "completed") -> list[str]:
    """Check the resumed journal kept the old bytes and ended `end`; the new record types."""
    old, new = journal(FIXTURES / shape).read_bytes(), journal(where).read_bytes()
    assert new.startswith(old)  # append-only: not one old byte rewritten
    new.decode("utf-8")  # strictly valid UTF-8
    records = FileStore(where / "sessions").load(RUN_ID)
    assert isinstance(records[-1], Terminal) and records[-1].reason == end
    return [json.loads(line)["type"] for line in new[len(old) :].splitlines()]


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def result(use_id: str, content: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": content}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_fingerprint_of_an_old_session_is_unchanged(shape: str, tmp_path: Path) -> None:
    where = copied(shape, tmp_path)
    recorded = json.loads((where / "fingerprint.txt").read_text())
    assert old_lines(shape)[0]["fingerprint"] == recorded
    config = load_config(where / "agent.yaml", env={})
    assert fingerprint(Harness.build(config, RunOptions())) == recorded


def test_a_chat_waiting_for_input_takes_its_next_prompt(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    where = copied("chat_waiting", tmp_path)
    assert resume(where, api, "chat", stdin="and then?\n") == "second answer\n"
    meta, assistant, _ = old_lines("chat_waiting")
    [request] = api.requests
    assert request["messages"] == [user(meta["prompt"]), assistant["message"], user("and then?")]
    assert request["system"][0]["text"].startswith("You are the compatibility fixture agent.")
    # the end of stdin leaves a journaled chat at its prompt again, resumable
    new = ["user", "assistant", "terminal"]
    assert finished("chat_waiting", where, end="suspended") == new


async def test_a_pending_approval_is_asked_again_and_the_tool_runs(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = copied("pending_approval", tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
    api.add(*load_script(where / "script.yaml"))
    prompter = ScriptedPrompter(approvals=[Approval.ONCE])
    store = FileStore(where / "sessions")
    config = load_config(where / "agent.yaml")
    run = await resume_session(config, RUN_ID, store, RunOptions(prompter=prompter))
    try:
        assert await run.run() == "completed"
    finally:
        await run.aclose()
    assert [kind for kind, _ in prompter.asked] == ["approve"]
    meta, assistant, *_ = old_lines("pending_approval")
    [request] = api.requests
    expected = [
        user(meta["prompt"]),
        assistant["message"],
        user([result("toolu_rm", "removed /tmp/x")]),
    ]
    assert request["messages"] == expected
    new = ["approval_answered", "tool_started", "tool_result", "assistant", "terminal"]
    assert finished("pending_approval", where) == new


def test_a_run_stopped_mid_batch_runs_only_the_call_without_a_result(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    where = copied("mid_batch", tmp_path)
    assert resume(where, api, "run") == "both seen\n"
    meta, assistant, _, kept = old_lines("mid_batch")
    [request] = api.requests
    batch = [kept["result"], result("toolu_b", "looked at b")]
    assert request["messages"] == [user(meta["prompt"]), assistant["message"], user(batch)]
    assert finished("mid_batch", where) == ["tool_started", "tool_result", "assistant", "terminal"]


def test_a_crash_after_tool_started_runs_the_tool_again(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    where = copied("crash_after_tool_started", tmp_path)
    assert resume(where, api, "run") == "seen c\n"
    meta, assistant, _ = old_lines("crash_after_tool_started")
    [request] = api.requests
    batch = [result("toolu_c", "looked at c")]  # retry, the default crash policy
    assert request["messages"] == [user(meta["prompt"]), assistant["message"], user(batch)]
    new = ["tool_started", "tool_result", "assistant", "terminal"]
    assert finished("crash_after_tool_started", where) == new


def test_a_completed_run_is_refused_with_one_line(tmp_path: Path, api: FakeMessagesAPI) -> None:
    where = copied("completed", tmp_path)
    args = ["-c", "agent.yaml", "--state-dir", "sessions", "--resume", RUN_ID]
    done = cli(where, api, "run", *args)
    assert done.returncode == 2
    assert (
        done.stderr == f'fisk-sm: session "{RUN_ID}" has already completed and cannot be resumed\n'
    )
    assert api.requests == []
    assert journal(where).read_bytes() == journal(FIXTURES / "completed").read_bytes()


def test_a_journaled_lone_surrogate_is_sent_as_fffd(tmp_path: Path, api: FakeMessagesAPI) -> None:
    where = copied("lone_surrogate", tmp_path)
    assert b'"content":"a\\ud800b"' in journal(where).read_bytes()  # as that build wrote it
    assert resume(where, api, "run") == "odd seen\n"
    meta, assistant, *_ = old_lines("lone_surrogate")
    [request] = api.requests
    batch = [result("toolu_odd", "a\ufffdb")]
    assert request["messages"] == [user(meta["prompt"]), assistant["message"], user(batch)]
    assert finished("lone_surrogate", where) == ["assistant", "terminal"]

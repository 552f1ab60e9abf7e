"""Replay honours what people answered: the journaled approvals of gated tools and the answers to
the `ask_human_*` tools; and a replay that departs names the first differing record and prints
a unified diff of the journal against what happened.

The acceptance runs the real CLI on a pseudo-terminal: a session approves its gated `deploy`
tool at the terminal prompt; `--replay` then runs without asking and exits 0; with the tool's
module changed, `--replay --replay-tools live` exits 1 with the diff naming the tool_result.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attrs
import pexpect
import pytest

from fisk_sm.config.agent import load_config, parse_config
from fisk_sm.journal.base import MemoryJournal
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ApprovalAnswered, ApprovalRequested, Meta, Record, ToolResult
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.replay import replay
from fisk_sm.loop.sessions import start_session
from fisk_sm.operator.prompter import Approval, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
HANG = 60  # a guard against a hang, far above what any machine needs
PROMPT = "[o]nce / [a]lways / [N]o: "

TOOLS = '''
from pathlib import Path


def deploy(version: str) -> str:
    """Deploy a version (pretend: note it in effects.txt).

    Args:
        version: what to deploy
    """
    with open(Path(__file__).parent / "effects.txt", "a") as f:
        f.write(version + "\\n")
    return "deployed " + version
'''


def write_agent(
    tmp_path: Path, base_url: str, tools: str = TOOLS, module: str = "deploy_tools"
) -> Path:
    """agent.yaml with `deploy` gated by its `deploy` tag, its module next to it (another
    `module` name for changed code in this process: an imported module stays imported)."""
    (tmp_path / f"{module}.py").write_text(tools)
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        f"llm: {{model: m, base_url: '{base_url}'}}\n"
        f"tools: [{{python: '{module}:deploy', tags: [deploy]}}]\n"
        "harness: {confirm_tags: [deploy]}\n"
    )
    return agent


def effects(tmp_path: Path) -> str:
    path = tmp_path / "effects.txt"
    return path.read_text() if path.exists() else ""


async def record(tmp_path: Path, prompter: ScriptedPrompter, *replies: Reply) -> list[object]:
    """Record a session of agent.yaml in tmp_path/s, answered by `prompter`; its records."""
    with FakeMessagesAPI(list(replies)) as api:
        agent = write_agent(tmp_path, api.base_url)
        config = load_config(agent)
        store = FileStore(tmp_path / "s")
        options = RunOptions(prompter=prompter)
        async with await start_session(config, "ship v1", store, options) as run:
            assert await run.run() == "completed", run.outcome
    return list(store.load(run.data.run_id))


@pytest.mark.parametrize(
    ("answer", "ran"),
    [(Approval.ONCE, "v1\n"), (Approval.NO, "")],
)
async def test_a_replay_answers_the_gate_from_the_journal(
    tmp_path: Path, answer: Approval, ran: str
) -> None:
    prompter = ScriptedPrompter(approvals=[answer])
    deploy = Reply.tool_use("deploy", {"version": "v1"}, id="toolu_1")
    records = await record(tmp_path, prompter, deploy, Reply.text("done"))
    assert len(prompter.asked) == 1
    assert effects(tmp_path) == ran
    config = load_config(tmp_path / "agent.yaml")
    for live in (False, True):
        journal = MemoryJournal()
        # No prompter given: before, nobody could answer and the gate denied ("no operator").
        async with replay(config, records, RunOptions(journal=journal), live_tools=live) as run:
            assert await run.run() == "completed", run.outcome
        answers = [r for r in journal.records if isinstance(r, ApprovalAnswered)]
        assert [(a.tool_use_id, a.answer) for a in answers] == [("toolu_1", answer.value)]
        recorded = [r.result for r in records if isinstance(r, ToolResult)]
        assert [r.result for r in journal.records if isinstance(r, ToolResult)] == recorded
    # Recorded tools never ran; the live replay ran the approved call once more.
    assert effects(tmp_path) == ran * 2


async def test_a_call_the_recording_never_approved_is_denied_and_diverges(
    tmp_path: Path,
) -> None:
    deploy = Reply.tool_use("deploy", {"version": "v1"}, id="toolu_1")
    prompter = ScriptedPrompter(approvals=[Approval.ONCE])
    records = await record(tmp_path, prompter, deploy, Reply.text("done"))
    config = load_config(tmp_path / "agent.yaml")
    # The journal's approval is of another call (v0): this one was never approved, so it is
    # denied (nobody is asked) and the next request departs at its tool_result.
    other = [
        attrs.evolve(r, input={"version": "v0"}) if isinstance(r, ApprovalRequested) else r
        for r in records
    ]
    async with replay(config, other) as run:
        assert await run.run() == "failed"
    assert run.outcome is not None
    assert "record 6 (tool_result of deploy, toolu_1)" in run.outcome, run.outcome


async def test_a_live_replay_answers_ask_human_from_the_journal(tmp_path: Path) -> None:
    script = [
        Reply.tool_use("ask_human_confirm", {"question": "ship it?"}, id="toolu_q"),
        Reply.tool_use("ask_human_input", {"question": "which tag?"}, id="toolu_i"),
        Reply.text("shipped"),
    ]
    prompter = ScriptedPrompter(confirms=[True], inputs=["v7"])
    with FakeMessagesAPI(script) as api:
        raw = {"llm": {"model": "m", "base_url": api.base_url}}
        config = parse_config({**raw, "harness": {"human_in_the_loop": {"enabled": True}}}, env={})
        store = FileStore(tmp_path)
        options = RunOptions(prompter=prompter)
        async with await start_session(config, "ship", store, options) as recorded:
            assert await recorded.run() == "completed", recorded.outcome
    records = store.load(recorded.data.run_id)
    results = [json.loads(r.result["content"]) for r in records if isinstance(r, ToolResult)]
    assert results == [{"confirmed": True}, {"value": "v7"}]
    for live in (False, True):
        # Before, a live replay asked nobody again and got {"confirmed": false, "reason": ...}.
        async with replay(config, records, live_tools=live) as run:
            assert await run.run() == "completed", run.outcome
            assert run.answer() == "shipped"


async def test_the_divergence_diff_names_the_tool_result_and_cuts_long_values(
    tmp_path: Path,
) -> None:
    from fisk_sm.loop.replay import divergence_diff  # new: the rest runs on the old code too

    deploy = Reply.tool_use("deploy", {"version": "v1"}, id="toolu_1")
    prompter = ScriptedPrompter(approvals=[Approval.ONCE])
    records = await record(tmp_path, prompter, deploy, Reply.text("done"))
    changed = TOOLS.replace('"deployed " + version', '"now " + version + "x" * 5000')
    config = load_config(write_agent(tmp_path, "http://127.0.0.1:9", changed, "changed_tools"))
    async with replay(config, records, live_tools=True) as run:
        assert await run.run() == "failed"
    assert run.outcome == (
        "replay diverged at iteration 1: message 2 differs from the recording at"
        " record 6 (tool_result of deploy, toolu_1)"
    )
    diff = divergence_diff(run).splitlines()
    assert diff[:2] == [
        "--- recorded (record 6 (tool_result of deploy, toolu_1), message 2)",
        "+++ replayed (message 2)",
    ]
    assert '-  "content": "deployed v1"' in diff
    cut = '+  "content": "now v1' + "x" * 194 + '… (5006 characters)"'
    assert cut in diff
    assert all(len(line) < 300 for line in diff)  # bounded, whatever the tool returned
    assert len(diff) < 20


# --- the CLI on a real pseudo-terminal ---


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    return pexpect.spawn(
        CLI[0],
        [*CLI[1:], "run", "-c", str(tmp_path / "agent.yaml"), "--state-dir", "s", *args],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )


def finish(child: pexpect.spawn) -> tuple[int, str]:
    """Wait for the end: the exit code and everything it wrote since the last match."""
    child.expect(pexpect.EOF)
    output = str(child.before)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return int(child.exitstatus), output


def test_replay_on_a_terminal_honours_the_approval_and_diffs_a_changed_tool(
    tmp_path: Path,
) -> None:
    with FakeMessagesAPI() as api:
        write_agent(tmp_path, api.base_url)
        api.add(Reply.tool_use("deploy", {"version": "v1"}, id="toolu_1"), Reply.text("shipped"))
        child = spawn(tmp_path, "--checkpoint", "--name", "ship", "deploy v1")
        child.expect_exact(PROMPT)
        child.sendline("o")
        code, output = finish(child)
        assert code == 0, output
        assert "shipped" in output
    assert effects(tmp_path) == "v1\n"

    # The fake API is closed: a replay that called the model would fail.
    child = spawn(tmp_path, "--replay", "ship")
    asked = child.expect_exact([PROMPT, pexpect.EOF])
    assert asked == 1, "the replay asked the operator again"  # before: it asked again
    output = str(child.before)
    child.close()
    assert child.exitstatus == 0, output
    assert "shipped" in output
    assert "diverged" not in output
    assert effects(tmp_path) == "v1\n"  # recorded: deploy did not run again

    (tmp_path / "deploy_tools.py").write_text(TOOLS.replace('"deployed "', '"rolled out "'))
    child = spawn(tmp_path, "--replay", "ship", "--replay-tools", "live")
    asked = child.expect_exact([PROMPT, pexpect.EOF])
    assert asked == 1, "the live replay asked the operator again"
    output = str(child.before)
    child.close()
    assert child.exitstatus == 1, output
    lines = [line.rstrip("\r") for line in output.split("\n")]
    failed = (
        "failed: replay diverged at iteration 1: message 2 differs from the recording at"
        " record 6 (tool_result of deploy, toolu_1)"
    )
    assert failed in lines, output
    at = lines.index("+++ replayed (message 2)")  # after the run's summary line
    assert lines[at - 1 : at + 1] == [
        "--- recorded (record 6 (tool_result of deploy, toolu_1), message 2)",
        "+++ replayed (message 2)",
    ], output
    assert '-  "content": "deployed v1"' in lines, output
    assert '+  "content": "rolled out v1"' in lines, output
    assert "Traceback" not in output
    assert effects(tmp_path) == "v1\nv1\n"  # live: the approved deploy ran again


def test_first_difference_of_an_extra_message_and_a_long_diff_is_bounded() -> None:
    from fisk_sm.loop.replay_diff import MAX_DIFF_LINES, first_difference

    records: list[Record] = [
        Meta(seq=1, version=1, run_id="r", created="2026-12-03", fingerprint={}, prompt="go")
    ]
    prompt = {"role": "user", "content": [{"type": "text", "text": "go"}]}
    extra = {"role": "user", "content": [{"type": "text", "text": f"line {n}"} for n in range(50)]}
    found = first_difference(records, [prompt], [prompt, extra])
    assert found is not None
    assert (found.message, found.record) == (1, "the end of the recording")
    lines = found.diff.splitlines()
    assert lines[:2] == [
        "--- recorded (the end of the recording, message 1)",
        "+++ replayed (message 1)",
    ]
    assert len(lines) == MAX_DIFF_LINES + 1
    assert lines[-1].startswith("… (") and lines[-1].endswith(" more diff lines)")
    assert first_difference(records, [prompt], [prompt]) is None
    changed = {"role": "user", "content": [{"type": "text", "text": "stop"}]}
    found = first_difference(records, [prompt], [changed])
    assert found is not None and found.record == "record 1 (meta: the prompt)"
    assert '-  "text": "go"' in found.diff.splitlines()

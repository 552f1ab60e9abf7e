"""Acceptance ([15/19], approvals in the debugger), on a real pseudo-terminal: the real
`fisk-sm step` against the fake API stops before the operator is asked at a gated tool
(`b approval:deploy`), `explain` shows the gate's decision, `approve once` answers, and the run
completes; the journal holds the request and the answer.

The whole acceptance is one scenario on one session: stepped and approved at the terminal, then
replayed on a terminal with no divergence (nobody asked, the tool not run again), then, with the
tool's code changed, replayed with `--replay-tools live`: exit 1, the first differing record
named (the tool_result) and the unified diff shown, by `fisk-sm run --replay` and by
`fisk-sm step --replay` alike."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pexpect
from test_step_approvals import CLI, HANG, environment, journal, write_agent

from fisk_sm.testing import FakeMessagesAPI, Reply


def stop_explain_approve(
    child: pexpect.spawn, not_asked_yet: Callable[[], bool], stopped_in: str | None = None
) -> None:
    """The stepper's dialogue at a gated `deploy`: `b approval:deploy`, `c` to the stop (in
    `stopped_in`, if given), where `not_asked_yet()` must hold, `explain` showing the gate's
    decision, `approve once`, `c` to the end, `q`."""
    child.expect_exact("(fisk-sm)")
    child.sendline("b approval:deploy")
    child.expect_exact("breakpoint set: approval:deploy")
    child.expect_exact("(fisk-sm)")
    child.sendline("c")
    child.expect_exact("stopped: approval deploy")
    if stopped_in is not None:
        child.expect_exact(stopped_in)
    child.expect_exact("(fisk-sm)")
    assert not_asked_yet()
    child.sendline("explain")
    child.expect_exact("gate: deploy is gated by ai:confirm: the operator will be asked")
    child.expect_exact("(fisk-sm)")
    child.sendline("approve once")
    child.expect_exact("approval answered: deploy approved once")
    child.expect_exact("(fisk-sm)")
    child.sendline("c")
    child.expect_exact("the run has ended in completed")
    child.expect_exact("(fisk-sm)")
    child.sendline("q")
    child.expect(pexpect.EOF)


def test_stop_explain_and_approve_at_a_gated_tool_in_a_terminal(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    agent = write_agent(tmp_path, api)
    state = tmp_path / "state"
    flags = ["-c", str(agent), "--checkpoint", "--name", "ship", "--state-dir", str(state)]
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "step", *flags, "ship it"],
        cwd=str(tmp_path),
        env={**environment(), "PROMPT_TOOLKIT_NO_CPR": "1", "NO_COLOR": "1"},
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )
    try:
        stop_explain_approve(
            child,
            lambda: not [p for p in state.iterdir() if "approval" in p.read_text()],
            stopped_in="state: gate (iteration 2)",
        )
    finally:
        child.close()
    assert child.exitstatus == 0
    records = journal(state)
    requested = [r for r in records if r["type"] == "approval_requested"]
    answered = [r for r in records if r["type"] == "approval_answered"]
    assert [(r["name"], r["input"], r["tag"]) for r in requested] == [
        ("deploy", {"target": "prod"}, "ai:confirm")
    ]
    assert [(r["tool_use_id"], r["answer"]) for r in answered] == [("toolu_2", "once")]
    assert records[-1]["type"] == "terminal"
    assert records[-1]["reason"] == "completed"
    assert "deployed prod" in json.dumps(api.requests[-1]["messages"])


# --- the whole acceptance: one session stepped, replayed, then replayed against changed code ---

#: `deploy`, gated, noting each run of it in effects.txt (so a replay that ran it shows)
EFFECT_TOOLS = """
from pathlib import Path

from fisk_sm import tool


@tool(tags=["ai:confirm"])
def deploy(target: str) -> str:
    \"\"\"Deploy somewhere.

    Args:
        target: where to
    \"\"\"
    with open(Path(__file__).parent / "effects.txt", "a") as f:
        f.write(target + "\\n")
    return "deployed " + target
"""

#: what `fisk-sm run` prints when the operator is asked at the gate
ASKED = "[o]nce / [a]lways / [N]o: "


def effects(tmp_path: Path) -> str:
    path = tmp_path / "effects.txt"
    return path.read_text() if path.exists() else ""


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    return pexpect.spawn(
        CLI[0],
        [*CLI[1:], *args],
        cwd=str(tmp_path),
        env={**environment(), "PROMPT_TOOLKIT_NO_CPR": "1", "NO_COLOR": "1"},
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )


def to_the_end(child: pexpect.spawn) -> tuple[int, list[str]]:
    """Wait for the end, failing if the operator is asked: the exit code and the lines written
    since the last match."""
    asked = child.expect_exact([ASKED, pexpect.EOF])
    output = str(child.before)
    child.close()
    assert asked == 1, f"the replay asked the operator: {output}"
    assert child.exitstatus is not None, child.signalstatus
    return int(child.exitstatus), [line.rstrip("\r") for line in output.split("\n")]


def differing_record(records: list[dict[str, object]], lines: list[str]) -> str:
    """The "record N (...)" the divergence names, checked to be the journal's tool_result."""
    found = [m for line in lines if (m := re.search(r"record (\d+) \(([^)]*)\)", line))]
    assert found, lines
    seq, what = int(found[0][1]), found[0][2]
    assert what == "tool_result of deploy, toolu_1"
    assert [r["type"] for r in records if r["seq"] == seq] == ["tool_result"]
    return found[0][0]


def test_step_approve_replay_then_replay_changed_code_live(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = tmp_path / "agent.yaml"
    (tmp_path / "ship_tools.py").write_text(EFFECT_TOOLS)
    with FakeMessagesAPI() as api:
        api.add(Reply.tool_use("deploy", {"target": "prod"}, id="toolu_1"), Reply.text("shipped"))
        agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
            "tools: [{python: 'ship_tools:deploy'}]\n"
        )
        common = ["-c", str(agent), "--state-dir", str(state)]
        child = spawn(tmp_path, "step", *common, "--checkpoint", "--name", "ship", "ship it")
        try:
            stop_explain_approve(child, lambda: effects(tmp_path) == "")
        finally:
            child.close()
        assert child.exitstatus == 0
        calls = len(api.requests)
    assert calls == 2
    assert effects(tmp_path) == "prod\n"
    recorded = journal(state)
    answered = [
        (r["tool_use_id"], r["answer"]) for r in recorded if r["type"] == "approval_answered"
    ]
    assert answered == [("toolu_1", "once")]
    journal_bytes = b"".join(p.read_bytes() for p in sorted(state.iterdir()) if p.is_file())

    # The fake API is closed now: a replay that called the model would fail.
    code, lines = to_the_end(spawn(tmp_path, "run", *common, "--replay", "ship"))
    assert code == 0, lines
    assert "shipped" in lines, lines
    assert not [line for line in lines if "diverged" in line or "Traceback" in line], lines
    assert effects(tmp_path) == "prod\n"  # recorded: deploy did not run again

    (tmp_path / "ship_tools.py").write_text(EFFECT_TOOLS.replace('"deployed "', '"rolled out "'))
    live = ["--replay", "ship", "--replay-tools", "live"]
    code, lines = to_the_end(spawn(tmp_path, "run", *common, *live))
    assert code == 1, lines
    named = differing_record(recorded, lines)
    failed = (
        f"failed: replay diverged at iteration 1: message 2 differs from the recording at {named}"
    )
    assert failed in lines, lines
    at = lines.index("+++ replayed (message 2)")
    assert lines[at - 1] == f"--- recorded ({named}, message 2)", lines
    assert '-  "content": "deployed prod"' in lines[at:], lines
    assert '+  "content": "rolled out prod"' in lines[at:], lines
    assert not [line for line in lines if "Traceback" in line], lines
    assert effects(tmp_path) == "prod\nprod\n"  # live: the journaled approval let it run again

    # The stepper replays the same session and shows the same diff where the run ends.
    child = spawn(tmp_path, "step", *common, *live)
    try:
        child.expect_exact("(fisk-sm)")
        child.sendline("approve once")
        child.expect_exact("a replay answers approvals from its journal")
        child.expect_exact("(fisk-sm)")
        child.sendline("c")
        ended = "the run has ended in failed: replay diverged at iteration 1"
        asked = child.expect_exact([ended, "approval: deploy"])
        assert asked == 0, "the stepper asked the operator in a replay"  # before: it asked
        child.expect_exact("(fisk-sm)")
        shown = [line.rstrip("\r") for line in str(child.before).split("\n")]
        child.sendline("q")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 1
    at = shown.index("+++ replayed (message 2)")
    assert shown[at - 1] == f"--- recorded ({named}, message 2)", shown
    assert '-  "content": "deployed prod"' in shown[at:], shown
    assert '+  "content": "rolled out prod"' in shown[at:], shown
    assert not [line for line in shown if "Traceback" in line], shown
    assert effects(tmp_path) == "prod\nprod\nprod\n"
    # Every replay only read the journal.
    assert b"".join(p.read_bytes() for p in sorted(state.iterdir()) if p.is_file()) == journal_bytes

"""Acceptance ([15/19], approvals in the debugger), on a real pseudo-terminal: the real
`fisk-sm step` against the fake API stops before the operator is asked at a gated tool
(`b approval:deploy`), `explain` shows the gate's decision, `approve once` answers, and the run
completes; the journal holds the request and the answer. (Replaying it is the replay's.)"""

from __future__ import annotations

import json
from pathlib import Path

import pexpect
from test_step_approvals import CLI, HANG, environment, journal, write_agent

from fisk_sm.testing import FakeMessagesAPI


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
        child.expect_exact("(fisk-sm)")
        child.sendline("b approval:deploy")
        child.expect_exact("breakpoint set: approval:deploy")
        child.expect_exact("(fisk-sm)")
        child.sendline("c")
        child.expect_exact("stopped: approval deploy")
        child.expect_exact("state: gate (iteration 2)")
        child.expect_exact("(fisk-sm)")
        assert not [p for p in state.iterdir() if "approval" in p.read_text()]  # not asked yet
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

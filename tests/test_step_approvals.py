"""`fisk-sm step` on stdin, second round ([15/19]): breakpoint names are checked, breakpoints
are each their own, `b approval:NAME` stops before the operator is asked, `explain` shows the
gate's decision, `approve once|always|deny` answers, and `q` at a prompt suspends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
#: A guard against a hang, far above what any machine needs.
HANG = 60

TOOLS = '''
from fisk_sm import tool


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@tool(tags=["ai:confirm"])
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: where to
    """
    return f"deployed {target}"
'''


def write_agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    """An agent.yaml with `add` and the gated `deploy`, against the fake API, which answers:
    add, then deploy, then a final text."""
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="toolu_1"),
        Reply.tool_use("deploy", {"target": "prod"}, id="toolu_2"),
        Reply.text("shipped"),
    )
    (tmp_path / "ship_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "tools: [{python: 'ship_tools:add'}, {python: 'ship_tools:deploy'}]\n"
    )
    return path


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    return write_agent(tmp_path, api)


def environment() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return {**env, "ANTHROPIC_API_KEY": "test"}


def step(agent: Path, script: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "step", "-c", str(agent), *extra, "ship it"],
        input=script,
        capture_output=True,
        text=True,
        cwd=agent.parent,
        env=environment(),
        timeout=HANG,
    )


def journal(state: Path) -> list[dict[str, object]]:
    """The records of the one session journal under `state`."""
    (path,) = [p for p in state.iterdir() if p.suffix == ".json"]
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_breakpoint_names_are_checked(agent: Path) -> None:
    done = step(agent, "b tool:delpoy\nb exeucte\nb approval:ad\nb iter:x\nb\n")
    out = done.stdout
    assert "unknown tool 'delpoy'; did you mean 'deploy'?\n" in out
    assert "unknown state 'exeucte'; did you mean 'execute'?" in out
    assert "unknown tool 'ad'; did you mean 'add'?\n" in out
    assert "not an iteration: 'x' (a whole number from 1)\n" in out
    assert "breakpoints: none\n" in out


def test_approval_breakpoint_explain_and_approve(agent: Path, api: FakeMessagesAPI) -> None:
    script = "b approval:deploy\nb iter:3\nc\nexplain\napprove once\nc\nc\n"
    done = step(agent, script)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "stopped: approval deploy\n" in out
    assert "gate: deploy is gated by ai:confirm: the operator will be asked\n" in out
    assert "approval answered: deploy approved once\n" in out
    assert "stopped: iteration 3\n" in out  # the other breakpoint, on its own (OR)
    assert "shipped\n" in out
    assert "the run has ended in completed; q quits\n" in out
    # the tool ran: its result went back to the model
    assert "deployed prod" in json.dumps(api.requests[-1]["messages"])


def test_an_approval_asked_on_stdin_is_answered_there(agent: Path, api: FakeMessagesAPI) -> None:
    done = step(agent, "c\napprove deny\nc\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "approval: deploy" in out
    assert "approval answered: deploy denied\n" in out
    assert "the operator declined" in json.dumps(api.requests[-1]["messages"])


def test_q_at_an_approval_prompt_suspends(agent: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = step(agent, "c\nq\n", "--checkpoint", "--name", "ship", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    records = journal(state)
    assert [r["type"] for r in records[-2:]] == ["approval_requested", "terminal"]
    assert records[-1]["reason"] == "suspended"  # pending, not denied: a resume asks again
    listed = subprocess.run(
        [*CLI, "session", "ls", "-c", str(agent), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=HANG,
    )
    assert "owner gone" not in listed.stdout
    assert "suspended" in listed.stdout

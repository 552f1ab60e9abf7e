"""`fisk-sm step`, driven in a pseudo-terminal (pexpect) and through stdin lines."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from fisk_sm import Harness, Run, RunOptions, Snapshot, load_config
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
    api.add(Reply.tool_use("add", {"a": 2, "b": 3}, id="toolu_1"), Reply.text("five"))
    (tmp_path / "calc_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\ntools: [{{python: 'calc_tools:add'}}]\n"
    )
    return path


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return {**env, "ANTHROPIC_API_KEY": "test", "PROMPT_TOOLKIT_NO_CPR": "1", **extra}


def check_restorable(path: Path, agent: Path) -> None:
    """`Run.restore` accepts the snapshot the stepper wrote, stopped before the tool."""
    snapshot = Snapshot.from_json(path.read_text())
    run = Run.restore(snapshot, Harness.build(load_config(agent), RunOptions()))
    assert run.state == "execute"
    assert run.data.pending[0].name == "add"
    asyncio.run(run.aclose())


def test_step_in_a_terminal(agent: Path, tmp_path: Path) -> None:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "step", "-c", str(agent), "what is 2+3?"],
        cwd=str(tmp_path),
        env=environment(),
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )
    try:
        child.expect_exact("state: suspend_check (iteration 0)")
        child.expect_exact("(fisk-sm)")
        child.sendline("b tool:add")
        child.expect_exact("breakpoint set: tool:add")
        child.sendline("c")
        child.expect_exact("stopped: tool add")
        child.expect_exact("\x1b[1;36mstate: execute (iteration 1)")  # a heading, in color
        child.expect_exact("-> gate if tools_pending: false")  # the exit that will be taken:
        child.expect_exact("-> feed_back (else)")
        child.expect_exact("next: feed_back")
        child.expect_exact('add {"a": 2, "b": 3}')
        child.expect_exact("(fisk-sm)")
        child.sendline("p pending.0.name")
        child.expect_exact('"add"')
        child.expect_exact("(fisk-sm)")
        child.send("\x1b[A\r")  # up arrow: the line editor's history repeats the command
        child.expect_exact('"add"')
        child.sendline("w snap.json")
        child.expect_exact("wrote the snapshot to snap.json")
        check_restorable(tmp_path / "snap.json", agent)
        child.sendline("c")
        child.expect_exact("five")
        child.expect_exact("the run has ended in completed")
        child.sendline("q")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_no_color_in_a_terminal(agent: Path, tmp_path: Path) -> None:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "step", "-c", str(agent), "what is 2+3?"],
        cwd=str(tmp_path),
        env=environment(NO_COLOR="1"),
        encoding="utf-8",
        timeout=HANG,
    )
    child.logfile_read = seen = io.StringIO()
    try:
        child.expect_exact("(fisk-sm)")
        child.sendline("s")
        child.expect_exact("stepped: suspend_check --boundary--> call")
        child.expect_exact("(fisk-sm)")
        child.sendline("q")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert "state: suspend_check (iteration 0)" in seen.getvalue()
    assert "\x1b[1;36m" not in seen.getvalue()
    assert child.exitstatus == 1  # an unjournaled run is aborted


def test_step_driven_through_stdin(agent: Path, tmp_path: Path) -> None:
    script = "b tool:add\nb iter:9\nb -iter:9\nb\nc\np usage.output_tokens\nw snap.json\nc\n"
    done = subprocess.run(
        [*CLI, "step", "-c", str(agent), "what is 2+3?"],
        input=script,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment(),
        timeout=HANG,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b[" not in out  # not a terminal: no color
    assert "breakpoints: tool:add\n" in out
    assert "stopped: tool add\n" in out
    assert "state: execute (iteration 1)\n" in out
    assert "(fisk-sm) 5\n" in out  # p usage.output_tokens
    assert "five\n" in out
    assert "the run has ended in completed; q quits\n" in out
    check_restorable(tmp_path / "snap.json", agent)


def test_quitting_a_checkpointed_run_at_a_boundary_suspends_it(agent: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    command = [*CLI, "step", "-c", str(agent), "--checkpoint", "--name", "dbg"]
    done = subprocess.run(
        [*command, "--state-dir", str(state), "go"],
        input="n\nq\n",
        capture_output=True,
        text=True,
        env=environment(),
        timeout=HANG,
    )
    assert done.returncode == 0, done.stderr
    assert "suspended; resume with: fisk-sm run -c" in done.stdout
    assert '"suspended"' in (state / "dbg.json").read_text()  # the terminal record


def test_quitting_a_checkpointed_run_mid_iteration_leaves_it_resumable(
    agent: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    command = [*CLI, "step", "-c", str(agent), "--checkpoint", "--name", "mid"]
    done = subprocess.run(
        [*command, "--state-dir", str(state), "go"],
        input="b tool:add\nc\nq\n",
        capture_output=True,
        text=True,
        env=environment(),
        timeout=HANG,
    )
    assert done.returncode == 0, done.stderr
    # q requests a suspend, as SIGTERM does: the tool runs, the next boundary suspends
    assert "suspended; " in done.stdout
    assert '"suspended"' in (state / "mid.json").read_text().splitlines()[-1]
    listed = subprocess.run(
        [*CLI, "session", "ls", "-c", str(agent), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=HANG,
    )
    assert "owner gone" not in listed.stdout
    assert "suspended" in listed.stdout
    resumed = subprocess.run(
        [*CLI, "run", "-c", str(agent), "--state-dir", str(state), "--resume", "mid"],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=HANG,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "five\n"
    lines = (state / "mid.json").read_text().splitlines()
    started = [line for line in lines if '"type":"tool_started"' in line]
    assert len(started) == 1  # the tool ran before the suspend, and only then

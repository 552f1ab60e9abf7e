"""`Host.adopt`: the runs of a process that died, taken in by another, by the crash rules.

A real child process drives a run (the real SDK against the fake API, a real journal with
fsync) into a tool that hangs, and is SIGKILLed there: its journal ends in `tool_started`
without a result. Another host adopts the registry's entries: the run resumes, the tool runs
once more (`crash_policy: retry`, the default), and the run completes. The journal written by
the dead process is kept byte for byte; the rest is appended after it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_supervisor import until

from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Assistant, Terminal, ToolResult, ToolStarted
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.host.registry import Registry
from fisk_sm.testing import FakeMessagesAPI, Reply

DEADLINE = 60.0
TOOLS = '''
import os, time

def note(mark: str) -> str:
    """Note a mark; the first time, hang there (the test kills the process)."""
    path = os.environ["NOTES"]
    first = not os.path.exists(path)
    with open(path, "a") as out:
        out.write(f"start {mark} {os.getpid()}\\n")
    if first:
        time.sleep(3600)
    with open(path, "a") as out:
        out.write(f"end {mark}\\n")
    return "noted " + mark
'''
CHILD = """
import asyncio, sys
from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor import Supervisor

async def main():
    host = Supervisor(load_config(sys.argv[1]), FileStore(sys.argv[2]))
    await host.start()
    tracked = await host.submit("note", name="noting")
    print(tracked.entry.run_id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _wait_for(path: Path, text: str) -> None:
    end = time.monotonic() + DEADLINE
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < end, f"timed out waiting for {text!r} in {path}"
        time.sleep(0.02)


def killed_mid_tool(agent: Path, state: Path, notes: Path) -> tuple[str, int]:
    """A child process's run, the child SIGKILLed while its tool runs: (run id, its pid)."""
    env = {**os.environ, "ANTHROPIC_API_KEY": "test", "NOTES": str(notes)}
    argv = [sys.executable, "-c", CHILD, str(agent), str(state)]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        _wait_for(notes, "start m1")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(DEADLINE)
    assert child.returncode == -signal.SIGKILL
    return run_id, child.pid


@pytest.mark.parametrize("via", ["adopt", "submit"])
async def test_adopt_resumes_a_dead_owners_runs_by_the_crash_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """`via="submit"`: the run is submitted again under its id (a front resending the submit
    of a worker that died): the host finds its session and adopts it, once."""
    reply = Reply.tool_use("note", {"mark": "m1"}, id="toolu_n")
    (tmp_path / "note_tools.py").write_text(TOOLS)
    agent = tmp_path / "agent.yaml"
    notes, state = tmp_path / "notes.txt", tmp_path / "state"
    monkeypatch.setenv("NOTES", str(notes))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    with FakeMessagesAPI(conversations={"note": [reply, Reply.text("ok")]}) as api:
        agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
            "tools:\n  - {python: 'note_tools:note'}\n"
        )
        run_id, child_pid = await asyncio.to_thread(killed_mid_tool, agent, state, notes)
        store = FileStore(state)
        left = store.path(run_id).read_bytes()
        assert isinstance(store.load(run_id)[-1], ToolStarted)  # the tool's result never came

        host = Supervisor(load_config(agent), store)
        entries = Registry(state / "supervisor").load()
        assert list(entries) == [run_id]
        if via == "adopt":
            assert await host.adopt(entries.values()) == [run_id]
            tracked = host.get(run_id)
        else:
            tracked = await host.submit("note", name="noting", run_id=run_id)
            assert await host.submit("note", name="noting", run_id=run_id) is tracked
        await until(lambda: tracked.status == "completed" and not tracked.live, "the run to end")
        assert await host.adopt(entries.values()) == []  # ended: listed, not resumed again
        await host.shutdown()

    here = os.getpid()
    assert notes.read_text().splitlines() == [f"start m1 {child_pid}", f"start m1 {here}", "end m1"]
    after = store.path(run_id).read_bytes()
    assert after.startswith(left) and len(after) > len(left)  # appended to, never rewritten
    records = store.load(run_id)
    started = [r for r in records if isinstance(r, ToolStarted)]
    results = [r for r in records if isinstance(r, ToolResult)]
    assert [r.tool_use_id for r in started] == ["toolu_n", "toolu_n"]  # one repeat, no more
    assert [(r.tool_use_id, r.result["content"], r.is_error) for r in results] == [
        ("toolu_n", "noted m1", False)
    ]
    assert sum(isinstance(r, Assistant) for r in records) == 2
    assert isinstance(records[-1], Terminal) and records[-1].reason == "completed"
    assert tracked.row().answer == "ok"
    assert len(api.requests) == 2  # the call before the kill, and the one after the tool

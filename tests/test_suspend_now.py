"""`Run.request_suspend(now=True)`: a model call in flight is cancelled, a tool is not.

A suspend-now cuts the `call` state's request and ends the run `suspended` through the
`call_cancelled` exit, journaling nothing for the cancelled call, so a resume calls the model
again at the same iteration. During a tool it is an ordinary suspend: the tool finishes, its
result is journaled, and the run stops at the next boundary. The delayed replies here are far
longer than any test waits; the waits are hang guards, never timing assertions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_config, make_run
from crashkit import STALL
from test_session_cli import CLI, TOOLS, fisk

from fisk_sm import Recorder, tool
from fisk_sm.events import StateEntered
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Record
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.guards import CALL_CANCELLED
from fisk_sm.testing import FakeMessagesAPI, Reply

HANG = 60.0  # a guard against a hang, far above what any machine needs
SLOW = 30.0  # a reply delay no test waits out


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds (polling the loop); HANG guards against a hang."""
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def kinds(records: list[Record]) -> list[str]:
    return [type(r).__name__ for r in records]


async def test_suspend_now_cancels_the_call_and_the_resume_calls_again(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    store, config, events = FileStore(tmp_path), make_config(api), Recorder()
    api.add(Reply.text("never delivered", delay=SLOW))
    run = await start_session(config, "go", store, RunOptions(events=events), run_id="n1")
    running = asyncio.ensure_future(run.run())
    await eventually(lambda: len(api.requests) == 1)  # the model request is in flight
    run.request_suspend(now=True)
    assert await asyncio.wait_for(running, HANG) == "suspended"
    entered = events.of(StateEntered)[-1]
    assert (entered.state, entered.source, entered.guard) == ("suspended", "call", "call_cancelled")
    assert entered.iteration == 0 and run.data.iteration == 0  # the cut call is not counted
    assert run.snapshot().llm_calls == 0
    await run.aclose()
    records = store.load("n1")
    assert kinds(records) == ["Meta", "Terminal"]  # nothing of the cancelled call
    assert records[-1].message == CALL_CANCELLED  # type: ignore[attr-defined]

    api.add(Reply.text("done"))
    again = await resume_session(config, "n1", store, RunOptions(events=events))
    assert (again.state, again.data.iteration) == ("suspend_check", 0)
    assert await asyncio.wait_for(again.run(), HANG) == "completed"
    assert again.answer() == "done" and again.data.iteration == 1
    await again.aclose()
    assert len(api.requests) == 2
    assert kinds(store.load("n1")) == ["Meta", "Terminal", "Assistant", "Terminal"]


async def test_suspend_now_before_the_call_starts_makes_no_request(api: FakeMessagesAPI) -> None:
    run, _, journal = make_run(api)
    assert await run.run_until("call") == "call"
    run.request_suspend(now=True)
    step = await run.step()
    assert (step.destination, step.guard) == ("suspended", "call_cancelled")
    assert api.requests == [] and run.data.iteration == 0
    assert kinds(journal.records) == ["Meta", "Terminal"]


async def test_suspend_now_lets_a_running_tool_finish(api: FakeMessagesAPI, tmp_path: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def hold(label: str) -> str:
        """Wait until the test releases it.

        Args:
            label: echoed back
        """
        started.set()
        await release.wait()
        return f"held {label}"

    store, config = FileStore(tmp_path), make_config(api)
    api.add(Reply.tool_use("hold", {"label": "x"}))
    options = RunOptions(tools=[hold])
    run = await start_session(config, "go", store, options, run_id="n2")
    running = asyncio.ensure_future(run.run())
    await asyncio.wait_for(started.wait(), HANG)  # the tool is running
    run.request_suspend(now=True)
    await asyncio.sleep(0.05)  # give a wrong cancellation its chance
    assert not running.done()
    release.set()
    assert await asyncio.wait_for(running, HANG) == "suspended"
    await run.aclose()
    records = store.load("n2")
    assert kinds(records) == ["Meta", "Assistant", "ToolStarted", "ToolResult", "Terminal"]
    assert records[3].result["content"] == "held x"  # type: ignore[attr-defined]
    assert len(api.requests) == 1  # suspended at the boundary, before the next call

    api.add(Reply.text("done"))
    again = await resume_session(config, "n2", store, options)
    assert await asyncio.wait_for(again.run(), HANG) == "completed"
    await again.aclose()


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    (tmp_path / "effect_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\ntools: [{{python: 'effect_tools:mark'}}]\n"
    )
    return path


def test_sigterm_during_a_model_call_suspends_at_once_and_resume_completes(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.text("never delivered", delay=SLOW))
    command = [*CLI, "run", "-c", str(agent), "--checkpoint", "--name", "s1"]
    proc = subprocess.Popen(
        [*command, "--state-dir", str(state), "go"],
        env={**os.environ, "ANTHROPIC_API_KEY": "test"},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + STALL
    while not api.requests:  # the model call is in flight
        assert time.monotonic() < deadline and proc.poll() is None, "no request came"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=STALL)
    assert proc.returncode == 0, err
    assert "suspending at the next loop boundary (signal again to abort)" in err
    assert "suspended; resume with: fisk-sm run" in err and "--resume s1" in err
    assert kinds(FileStore(state).load("s1")) == ["Meta", "Terminal"]

    api.add(Reply.text("second answer"))
    resumed = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "s1")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "second answer\n"
    assert len(api.requests) == 2

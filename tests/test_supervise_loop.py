"""`fisk-sm supervise` runs its runs on uvloop when it is installed (`--loop auto`, the default),
on asyncio's loop with `--loop asyncio` or FISK_SM_LOOP=asyncio, and refuses a loop it cannot
have in one line; after start-up the collector is settled (frozen, spaced-out thresholds). A tool
reads all this from inside a run, and the test reads the tool's answer in the journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from ctlkit import CLI, DEADLINE, http, start_supervise, wait_until

from fisk_sm.supervisor.host.eventloop import THRESHOLDS
from fisk_sm.testing import FakeMessagesAPI, Reply

TOOLS = '''
import asyncio, gc

async def loop_kind() -> str:
    """The module of the running event loop's class, the collector's thresholds and whether
    start-up's objects were frozen."""
    frozen = gc.get_freeze_count() > 0
    return f"{type(asyncio.get_running_loop()).__module__} {gc.get_threshold()} {frozen}"
'''


def _supervise(tmp_path: Path, api: FakeMessagesAPI, *extra: str, env: dict[str, str]) -> str:
    """Start supervise, run one prompt that calls `loop_kind`, stop it; the tool's answer."""
    (tmp_path / "loop_tools.py").write_text(TOOLS)
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "tools: [{python: 'loop_tools:loop_kind'}]\n"
    )
    state = tmp_path / "state"
    argv = [*CLI, "supervise", "-c", str(agent), "--listen", "127.0.0.1:0"]
    argv += ["--state-dir", str(state), *extra]
    process, stderr, url = start_supervise(argv, env, tmp_path)
    try:
        status, run = http("POST", url + "/api/runs", {"prompt": "which loop?"})
        assert status == 201, run

        def ended() -> bool:
            return http("GET", f"{url}/api/runs/{run['run_id']}")[1]["status"] == "completed"

        wait_until(ended, "the run completed")
        journal = (state / f"{run['run_id']}.json").read_text().splitlines()
        results = [json.loads(line) for line in journal if '"tool_result"' in line]
        assert len(results) == 1, journal
        return str(results[0]["result"]["content"])
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0, stderr


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    return {**env, "ANTHROPIC_API_KEY": "test", **more}


def _script() -> list[Reply]:
    return [Reply.tool_use("loop_kind", {}), Reply.text("done")]


def test_runs_are_driven_on_uvloop_by_default_with_the_collector_settled(tmp_path: Path) -> None:
    with FakeMessagesAPI(_script()) as api:
        assert _supervise(tmp_path, api, env=_env()) == f"uvloop {THRESHOLDS} True"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_standard_loop_when_asked(tmp_path: Path, how: str) -> None:
    extra = ("--loop", "asyncio") if how == "flag" else ()
    env = _env(FISK_SM_LOOP="asyncio") if how == "env" else _env()
    with FakeMessagesAPI(_script()) as api:
        assert _supervise(tmp_path, api, *extra, env=env).split()[0] == "asyncio.unix_events"


def test_a_bad_loop_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\n")
    argv = [*CLI, "supervise", "-c", str(agent), "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        argv, env=_env(FISK_SM_LOOP="tokio"), capture_output=True, text=True, timeout=DEADLINE
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fisk-sm: FISK_SM_LOOP: must be one of auto, uvloop, asyncio, not 'tokio'"
    ], done.stderr

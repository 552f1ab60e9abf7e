"""Python tools have a timeout, like exec tools: `@tool(timeout=...)` or `timeout:` on the tool's
agent.yaml entry. An async tool is cancelled; a sync one runs on a daemon thread of its own and
is left running, detached, so that neither the run nor the process waits for it. The timeout is
an is_error result, journaled like any other. An MCP server's calls have its `timeout`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import pytest
from conftest import make_run
from test_mcp import DEMO

from fisk_sm.config.mcp import McpServer
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import ToolBox, tool
from fisk_sm.tools.mcp import McpServers

#: A guard against a hang, far above what any machine needs; never a time limit on the test.
GUARD = 30.0


def results(journal_records: list[object]) -> list[ToolResult]:
    return [r for r in journal_records if isinstance(r, ToolResult)]


async def test_an_async_tool_is_cancelled_at_its_timeout(api: FakeMessagesAPI) -> None:
    cancelled = asyncio.Event()

    @tool(timeout=0.2)
    async def stall() -> str:
        """Wait forever."""
        try:
            await asyncio.sleep(GUARD)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    api.add(Reply.tool_use("stall", {}, id="toolu_s"), Reply.text("gave up"))
    run, _, journal = make_run(api, [stall])
    async with run:
        assert await run.run() == "completed"
    assert cancelled.is_set()
    [record] = results(journal.records)
    assert record.is_error and record.result["is_error"] is True
    assert record.result["content"] == "tool 'stall' timed out after 0.2s"
    fed = api.requests[1]["messages"][-1]["content"][0]
    assert fed["content"] == "tool 'stall' timed out after 0.2s" and fed["is_error"] is True


async def test_a_sync_tool_is_left_running_on_a_daemon_thread(api: FakeMessagesAPI) -> None:
    release, threads = threading.Event(), []

    @tool(timeout=0.2)
    def hang() -> str:
        """Block until released."""
        threads.append(threading.current_thread())
        release.wait(GUARD)
        return "late"

    api.add(Reply.tool_use("hang", {}, id="toolu_h"), Reply.text("gave up"))
    run, _, journal = make_run(api, [hang])
    try:
        async with run:
            assert await run.run() == "completed"
        [record] = results(journal.records)
        assert record.is_error and record.result["content"] == "tool 'hang' timed out after 0.2s"
        [thread] = threads
        # Still working, and nothing will wait for it: not the loop's executor, not exit.
        assert thread.is_alive() and thread.daemon and thread is not threading.main_thread()
    finally:
        release.set()


async def test_without_a_timeout_a_slow_tool_is_waited_for() -> None:
    @tool
    def slow() -> str:
        """Return at once."""
        return "done"

    outcome = await ToolBox.of([slow]).invoke("slow", {})
    assert (outcome.content, outcome.is_error) == ("done", False)
    assert slow.timeout is None


def test_a_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout must be a positive duration"):
        tool(lambda: "x", name="x", timeout=0)


TOOLS = '''
import asyncio
import time


def sync_hang() -> str:
    """Sleep for ever."""
    time.sleep(10**6)
    return "never"


async def async_hang() -> str:
    """Sleep for ever, asynchronously."""
    await asyncio.sleep(10**6)
    return "never"
'''


def test_fisk_sm_run_exits_while_a_timed_out_sync_tool_still_hangs(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    (tmp_path / "hangtools.py").write_text(TOOLS)
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "tools:\n"
        "  - {python: 'hangtools:sync_hang', timeout: 1s}\n"
        "  - {python: 'hangtools:async_hang', timeout: 500ms}\n"
    )
    api.add_conversation(
        "go",
        Reply.tool_use("sync_hang", {}, id="t1"),
        Reply.tool_use("async_hang", {}, id="t2"),
        Reply.text("gave up"),
    )
    state = tmp_path / "runs"
    command = [sys.executable, "-m", "fisk_sm.cli", "run", "-c", str(agent)]
    command += ["--checkpoint", "--name", "hung", "--state-dir", str(state), "go"]
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("fisk-sm run did not exit on its own while a sync tool hung")
    assert proc.returncode == 0, stderr.decode()
    assert stdout == b"gave up\n"
    records = results(FileStore(state).load("hung"))
    assert [(r.tool_use_id, r.is_error, r.result["content"]) for r in records] == [
        ("t1", True, "tool 'sync_hang' timed out after 1s"),
        ("t2", True, "tool 'async_hang' timed out after 0.5s"),
    ]


def test_a_bad_timeout_in_agent_yaml_is_one_line(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\ntools:\n  - {python: 'mod:fn', timeout: soon}\n")
    done = subprocess.run(
        [sys.executable, "-m", "fisk_sm.cli", "run", "-c", str(agent), "go"],
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"fisk-sm: {agent}: tools[0].timeout: must be a positive duration such as '30s', got 'soon'"
    ]


async def test_an_mcp_call_that_outlasts_the_servers_timeout_is_an_error(tmp_path: Path) -> None:
    release = tmp_path / "release"  # never created: the call hangs on the server
    declared = McpServer("demo", command=(sys.executable, str(DEMO)), confirm=False)
    servers = await McpServers.open([declared], taken=(), work_dir=tmp_path)
    try:
        # `timeout` also bounds the server's start, which may take seconds on a loaded
        # machine: the call's allowance is cut short once it has started.
        [connection] = servers.connections
        connection.server = attrs.evolve(declared, timeout=1)
        box = ToolBox.of(servers.tools)
        hung = await box.invoke("wait_for", {"path": str(release)})
        added = await box.invoke("add", {"a": 1, "b": 2})
    finally:
        await servers.aclose()
    assert hung.is_error and hung.content.endswith("failed: no answer within 1s")
    assert (tmp_path / "release.started").exists()  # it was running on the server
    assert (added.content, added.is_error) == ("1 + 2 = 3", False)  # the server goes on

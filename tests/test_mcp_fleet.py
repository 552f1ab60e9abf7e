"""`fisk-sm mcp-serve --supervisor URL`: a real `fisk-sm supervise` (tests/ctlkit.py, its agent
calling the gated `deploy`) driven through MCP with the SDK's own client over stdio: submit,
wait until parked, approve once through `approve`, wait until done, and read the run's resource
(transcript and path); a `subscriptions/listen` on the resource gets its updates. Over stdio,
and over streamable HTTP (`--listen`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from crashkit import Lines
from ctlkit import Supervisor
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from fisk_sm.testing import FakeMessagesAPI, Reply


@pytest.fixture
def sup(api: FakeMessagesAPI, tmp_path: Path) -> Iterator[Supervisor]:
    with Supervisor(tmp_path, api, args=("--workers", "0")) as supervisor:
        yield supervisor


@asynccontextmanager
async def fleet(sup: Supervisor, transport: str) -> AsyncIterator[Client]:
    """A client of `fisk-sm mcp-serve --supervisor URL`, on stdio or streamable HTTP."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    argv = [sys.executable, "-m", "fisk_sm.cli", "mcp-serve", "--supervisor", sup.url]
    if transport == "stdio":
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        async with Client(params) as client:
            yield client
        return
    process, url = listening([*argv, "--listen", "127.0.0.1:0"], env)
    try:
        async with Client(url) as client:
            yield client
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


def listening(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """Start `argv` (an `mcp-serve --listen`); the process and the MCP URL it says."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    line = Lines(process.stderr).wait_for("listening on", 60)
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", line)
    assert found, line
    return process, found.group(1)


def data(result: object) -> dict[str, object]:
    assert not getattr(result, "is_error", False), result
    (content,) = getattr(result, "content", [])
    assert isinstance(content, TextContent)
    found = json.loads(content.text)
    assert isinstance(found, dict)
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_submit_wait_approve_and_read_the_run(
    sup: Supervisor, api: FakeMessagesAPI, transport: str
) -> None:
    api.add_conversation(
        "mcp: deploy to prod", Reply.tool_use("deploy", {"target": "prod"}), Reply.text("live")
    )
    async with fleet(sup, transport) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "submit",
            "list_runs",
            "show_run",
            "approvals",
            "approve",
            "suspend",
            "resume",
            "abort",
            "wait",
        }
        for name in ("list_runs", "show_run", "approvals", "wait"):
            assert tools[name].annotations.read_only_hint is True, name
        for name in ("approve", "abort"):
            assert tools[name].annotations.destructive_hint is True, name
        run = data(await client.call_tool("submit", {"prompt": "mcp: deploy to prod"}))
        run_id = str(run["run_id"])
        uri = f"fisk-sm://runs/{run_id}"
        updates: list[str] = []
        async with client.listen(resource_subscriptions=[uri]) as listening:

            async def collect() -> None:
                async for event in listening:
                    updates.append(str(getattr(event, "uri", "")))

            async with anyio.create_task_group() as group:
                group.start_soon(collect)
                parked = data(await client.call_tool("wait", {"run_id": run_id, "until": "parked"}))
                assert parked["status"] == "parked"
                (waiting,) = data_list(await client.call_tool("approvals", {}))
                assert waiting["tool"] == "deploy" and waiting["input"] == {"target": "prod"}
                assert sup.effects_lines() == []
                args = {"run_id": run_id, "tool_use_id": waiting["tool_use_id"], "answer": "once"}
                data(await client.call_tool("approve", args))
                done = data(await client.call_tool("wait", {"run_id": run_id}))
                assert done["status"] == "completed" and done["answer"] == "live"
                for _ in range(100):
                    if updates:
                        break
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()
        assert updates and set(updates) == {uri}
        read = await client.read_resource(uri)
        shown = json.loads(read.contents[0].text)
        assert shown["status"] == "completed" and shown["path"][-1] == "completed"
        assert shown["transcript"][-1]["text"] == "live"
    assert sup.effects_lines() == ["prod"]


def data_list(result: object) -> list[dict[str, object]]:
    (content,) = getattr(result, "content", [])
    found = json.loads(content.text)
    assert isinstance(found, list)
    return found

"""MCP servers as a tool source: a real stdio server (tests/mcp_server_demo.py, written with the
`mcp` SDK) behind runs that talk to the fake Messages API through the real SDK."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types
import pytest
from prockit import alive

from fisk_sm import MemoryJournal, Recorder, Run, parse_config
from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.mcp import McpServer
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult
from fisk_sm.loop.fingerprint import ResumeRefused
from fisk_sm.loop.harness import Harness, NoModel, RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import ToolError
from fisk_sm.tools.mcp import McpError, McpServers, content_blocks

DEMO = Path(__file__).with_name("mcp_server_demo.py")
DOT_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
#: A guard against a hang, far above what any machine needs.
DEADLINE = 60.0


def demo_server(*extra: str, **declaration: Any) -> dict[str, Any]:
    """The declaration of the demo server (agent.yaml's shape)."""
    return {"alias": "demo", "command": [sys.executable, str(DEMO), *extra], **declaration}


def config_for(api: FakeMessagesAPI, *servers: dict[str, Any], **top: Any) -> AgentConfig:
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    return parse_config({"llm": llm, "mcp_servers": list(servers), **top}, env={})


def wait_dead(pid: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        time.sleep(0.02)


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


async def run_once(config: AgentConfig, api: FakeMessagesAPI, *turns: Reply) -> Run:
    api.add_conversation("go", *turns)
    events, journal = Recorder(), MemoryJournal()
    run = Run.create(config, "go", RunOptions(events=events, journal=journal), run_id="mcp")
    try:
        await run.run()
    finally:
        await run.aclose()
    return run


async def test_the_model_calls_an_mcp_tool(api: FakeMessagesAPI, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    config = config_for(api, demo_server("--pid-file", str(pid_file), confirm=False))
    run = await run_once(
        config, api, Reply.tool_use("add", {"a": 2, "b": 3}, id="t1"), Reply.text("five")
    )
    assert run.state == "completed"
    first, second = api.requests_for("go")
    offered = {t["name"]: t for t in first["tools"]}
    assert offered["add"]["input_schema"]["properties"]["a"]["type"] == "integer"
    assert offered["add"]["input_schema"]["required"] == ["a", "b"]
    assert offered["add"]["description"].startswith("Add two integers.")
    [result] = tool_results(second)
    assert result == {"type": "tool_result", "tool_use_id": "t1", "content": "2 + 3 = 5"}
    records = [r for r in run.harness.journal.records if isinstance(r, ToolResult)]
    assert [(r.result["content"], r.kind, r.is_error) for r in records] == [
        ("2 + 3 = 5", "mcp", False)
    ]
    [pid] = pids(pid_file)
    assert not alive(pid)  # closing the run stopped its server


async def test_a_gated_mcp_tool_is_refused_without_an_operator(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    release.write_text("")
    config = config_for(api, demo_server())  # gated: no `confirm: false`
    run = await run_once(
        config,
        api,
        Reply.tool_use("wait_for", {"path": str(release)}, id="t1"),
        Reply.text("ok"),
    )
    [result] = tool_results(api.requests_for("go")[1])
    assert json.loads(result["content"])["allowed"] is False
    assert not (tmp_path / "release.started").exists()  # the server never ran it
    assert run.state == "completed"


async def test_is_error_and_images(api: FakeMessagesAPI) -> None:
    config = config_for(api, demo_server(confirm=False))
    await run_once(
        config,
        api,
        Reply.tool_use("fail", {"reason": "because"}, id="t1"),
        Reply.tool_use("dot", {}, id="t2"),
        Reply.text("ok"),
    )
    [failed] = tool_results(api.requests_for("go")[1])
    assert failed["is_error"] is True
    assert "failed on purpose: because" in failed["content"]
    image = tool_results(api.requests_for("go")[2])[-1]
    [block] = image["content"]
    assert block["type"] == "image" and block["source"]["media_type"] == "image/png"
    assert base64.b64decode(block["source"]["data"]) == DOT_PNG


def test_content_blocks_map_images_the_api_takes() -> None:
    result = mcp.types.CallToolResult(
        content=[
            mcp.types.TextContent(type="text", text="look"),
            mcp.types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
            mcp.types.ImageContent(type="image", data="AAAA", mime_type="image/tiff"),
        ]
    )
    assert content_blocks(result) == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "text", "text": "[image/tiff content left out]"},
    ]


def server(**declaration: Any) -> McpServer:
    decl = demo_server(**declaration)
    return McpServer(decl["alias"], command=tuple(decl["command"]), **declaration)


async def test_the_environment_is_scrubbed_like_exec_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEMO_TOKEN", "secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("PLAIN_SETTING", "1")
    for pass_env, token in (((), "unset"), (("DEMO_TOKEN",), "set")):
        servers = await McpServers.open([server(pass_env=pass_env)], taken=(), work_dir=tmp_path)
        try:
            [connection] = servers.connections
            seen = [
                await connection.call("env", {"name": n})
                for n in ("DEMO_TOKEN", "ANTHROPIC_API_KEY", "PLAIN_SETTING")
            ]
        finally:
            await servers.aclose()
        assert seen == [token, "unset", "set"]


async def test_names_collide_as_for_remote_tools(tmp_path: Path) -> None:
    two = [server(), McpServer("other", command=server().command)]
    servers = await McpServers.open(two, taken={"env"}, work_dir=tmp_path)
    try:
        names = [t.name for t in servers.tools]
        call = next(t for t in servers.tools if t.name == "other_add").fn
        assert await call(a=1, b=1) == "1 + 1 = 2"
    finally:
        await servers.aclose()
    # Both offer every tool, and `env` is a local tool's: every name is prefixed.
    assert sorted(names) == sorted(
        f"{alias}_{n}"
        for alias in ("demo", "other")
        for n in ("add", "fail", "dot", "env", "wait_for")
    )
    assert {t.kind for t in servers.tools} == {"mcp"}
    assert all("ai:confirm" in t.tags for t in servers.tools)


async def test_the_server_group_dies_with_the_run(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    servers = await McpServers.open(
        [
            server(pass_env=()),
            McpServer("kid", command=(*server().command, "--pid-file", str(pid_file), "--child")),
        ],
        taken=(),
        work_dir=tmp_path,
    )
    leader, child = pids(pid_file)
    assert alive(leader) and alive(child)
    await servers.aclose()
    assert not alive(leader)
    wait_dead(child)  # killed with the group (the reaper of an orphan is init: it may lag)


async def test_a_server_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    broken = McpServer("broken", command=(sys.executable, "-c", "import sys; sys.exit('no')"))
    with pytest.raises(McpError) as caught:
        await McpServers.open([broken], taken=(), work_dir=tmp_path)
    assert "'broken'" in str(caught.value) and "\n" not in str(caught.value)
    missing = McpServer("missing", command=(str(tmp_path / "nope"),))
    with pytest.raises(McpError, match="No such file"):
        await McpServers.open([missing], taken=(), work_dir=tmp_path)


async def test_a_call_to_a_dead_server_is_an_error_result(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    decl = server(pass_env=())
    decl = McpServer("demo", command=(*decl.command, "--pid-file", str(pid_file)), timeout=10)
    servers = await McpServers.open([decl], taken=(), work_dir=tmp_path)
    try:
        [pid] = pids(pid_file)
        os.kill(pid, 9)
        wait_dead(pid)
        with pytest.raises(ToolError, match="MCP tool 'add'"):
            await servers.connections[0].call("add", {"a": 1, "b": 2})
    finally:
        await servers.aclose()


async def test_a_server_that_changed_its_tools_is_drift(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    first = config_for(api, demo_server(confirm=False))
    api.add_conversation("go", Reply.text("never asked"))
    options = RunOptions(should_suspend=lambda: True)
    run = await start_session(first, "go", store, options, run_id="drift")
    try:
        assert await run.run() == "suspended"
    finally:
        await run.aclose()
    changed = config_for(api, demo_server("--variant", "2", confirm=False))
    with pytest.raises(ResumeRefused, match="tool set: changed"):
        await resume_session(changed, "drift", store)
    resumed = await resume_session(first, "drift", store)  # the same server: no drift
    await resumed.aclose()


async def test_info_lists_mcp_tools_with_their_server(api: FakeMessagesAPI) -> None:
    harness = Harness.build(
        config_for(api, demo_server(tags=["demo"])), RunOptions(model=NoModel())
    )
    assert harness.mcp_pending and "add" not in harness.tools.tools
    await harness.start_mcp_servers()
    await harness.aclose()
    tool = harness.tools.tools["add"]
    assert (tool.kind, tool.agent, tool.tags) == ("mcp", "demo", ("demo", "ai:confirm"))
    assert any(w[0] == "confirm_no_terminal" and "add" in w[1] for w in harness.warnings)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_demo() -> Iterator[str]:
    """The demo server over streamable HTTP on a loopback port: its URL."""
    port = free_port()
    host = subprocess.Popen(
        [sys.executable, str(DEMO), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + DEADLINE
        while True:  # until it listens
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and host.poll() is None, "no HTTP server"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        host.terminate()
        host.wait()


async def test_a_streamable_http_server(http_demo: str, tmp_path: Path) -> None:
    remote = McpServer("web", url=http_demo, confirm=False)
    servers = await McpServers.open([remote], taken=(), work_dir=tmp_path)
    try:
        add = next(t for t in servers.tools if t.name == "add")
        assert (add.kind, add.agent, add.tags) == ("mcp", "web", ())
        assert await add.fn(a=20, b=22) == "20 + 22 = 42"
    finally:
        await servers.aclose()

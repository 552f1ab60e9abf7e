"""`fisk-sm mcp-serve --listen`: the agent's MCP server on streamable HTTP, with the SDK's own
client: a two-tool run with progress in order, a gated tool answered through the input request,
a closed response stream (the 2026-07-28 cancellation) that suspends the run with its tool
finished and journaled once; and the control API's rules: a Host allow-list (421), an exact
Origin (403 for another loopback port), JSON only (415), a token off loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentkit import effects
from crashkit import Lines
from mcp import Client
from test_mcp_serve import approve_once, cancelled_mid_tool, journal, text, write_agent

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]


@pytest.fixture
def served(tmp_path: Path, api: FakeMessagesAPI) -> Iterator[str]:
    """`fisk-sm mcp-serve --listen 127.0.0.1:0` on the test's agent; its MCP URL."""
    agent = write_agent(tmp_path, api)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env["ANTHROPIC_API_KEY"] = "test"
    argv = [*CLI, "mcp-serve", "-c", str(agent), "--state-dir", str(tmp_path / "state")]
    process = subprocess.Popen(
        [*argv, "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert process.stderr is not None
    line = Lines(process.stderr).wait_for("listening on", 60)
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", line)
    assert found, line
    yield found.group(1)
    process.terminate()
    assert process.wait(timeout=30) == 0
    assert process.stdout is not None and process.stdout.read() == ""  # HTTP: stdout unused


def post(url: str, body: bytes, **headers: str) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    for name, value in {"Accept": "application/json, text/event-stream", **headers}.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(120)
async def test_ask_over_http_with_progress_and_an_approval(
    served: str, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="t1"),
        Reply.tool_use("deploy", {"target": "prod"}, id="t2"),
        Reply.text("five, and prod is live"),
    )
    told: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        told.append(message or "")

    async with Client(served, elicitation_callback=approve_once) as client:
        assert client.protocol_version == "2026-07-28"
        done = await client.call_tool("ask", {"prompt": "add, ship"}, progress_callback=on_progress)
    session = done.structured_content["session"]
    assert text(done) == "five, and prod is live"
    # each call's first progress names the session: the first call's, and the retry's that
    # carried the answer to the input request
    assert told[0] == f"session {session}: call (iteration 1)"
    steps = [m.removeprefix(f"session {session}: ") for m in told]
    assert steps == [
        "call (iteration 1)",
        "execute: add",
        "call (iteration 2)",
        "execute: deploy",
        "call (iteration 3)",
    ]
    assert effects(tmp_path) == ["deployed prod"]
    (answered,) = [
        r for r in journal(tmp_path / "state", session) if r.get("type") == "approval_answered"
    ]
    assert answered["by"] == "mcp" and answered["answer"] == "once"


@pytest.mark.timeout(120)
async def test_a_closed_stream_suspends_the_run_and_ask_resumes_it(
    served: str, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("slow", {"seconds": 1.5}, id="t1"), Reply.text("rested"))
    async with Client(served) as client:
        # on 2026-07-28 HTTP: the response stream closes
        session, records = await cancelled_mid_tool(client, tmp_path / "state")
        assert records[-1]["reason"] == "suspended" and effects(tmp_path) == ["started", "done"]
        resumed = await client.call_tool("ask", {"session": session})
    assert text(resumed) == "rested" and effects(tmp_path) == ["started", "done"]
    types = [r.get("type") for r in journal(tmp_path / "state", session)]
    assert types.count("tool_started") == 1 and types.count("tool_result") == 1


def test_the_control_api_rules_guard_the_endpoint(served: str) -> None:
    port = served.split(":")[2].split("/")[0]
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}'
    json_type = {"Content_Type": "application/json"}
    assert post(served, body, Host=f"evil.example:{port}", **json_type) == 421
    assert post(served, body, Host=f"127.0.0.1:{int(port) + 1}", **json_type) == 421
    assert post(served, body, Origin=f"http://127.0.0.1:{int(port) + 1}", **json_type) == 403
    assert post(served, body, Origin=f"http://localhost:{port}", **json_type) == 403
    assert post(served, body, Content_Type="text/plain") == 415
    # the listener's own origin passes the guards (the SDK then answers the request itself)
    own = post(served, body, Origin=f"http://127.0.0.1:{port}", **json_type)
    assert own not in (403, 415, 421) and own < 500


def test_a_non_loopback_listen_needs_a_token(tmp_path: Path, api: FakeMessagesAPI) -> None:
    agent = write_agent(tmp_path, api)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    argv = [*CLI, "mcp-serve", "-c", str(agent), "--listen", "0.0.0.0:0"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().endswith(
        "is not a loopback address; a token is required (--token-file FILE or $FISK_SM_TOKEN)"
    )

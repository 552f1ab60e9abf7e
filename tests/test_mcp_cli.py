"""MCP servers through the command line: a SIGKILLed checkpointed run leaves no server behind once
resumed and finished, `fisk-sm info` lists the tools by server, bad declarations are one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_mcp import DEADLINE, DEMO, alive, pids, tool_results, wait_dead

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
ENV = {**os.environ, "ANTHROPIC_API_KEY": "test"}


def write_agent(path: Path, api: FakeMessagesAPI, server: str) -> Path:
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        f"mcp_servers:\n{server}"
    )
    return path


def demo(*args: str, extra: str = "confirm: false") -> str:
    argv = ", ".join(f"'{a}'" for a in (sys.executable, str(DEMO), *args))
    return f"  - {{alias: demo, command: [{argv}], {extra}}}\n"


def wait_file(path: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_sigkill_mid_run_leaves_no_server_once_resumed(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    pid_file, release, state = tmp_path / "pids", tmp_path / "release", tmp_path / "runs"
    agent = write_agent(tmp_path / "agent.yaml", api, demo("--pid-file", str(pid_file)))
    api.add_conversation(
        "go", Reply.tool_use("wait_for", {"path": str(release)}, id="t1"), Reply.text("done")
    )
    command = [*CLI, "run", "-c", str(agent), "--state-dir", str(state)]
    run = subprocess.Popen(
        [*command, "--checkpoint", "--name", "killed", "go"],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_file(Path(f"{release}.started"))  # the server is in the middle of the call
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    [orphan] = pids(pid_file)
    release.write_text("")
    resumed = subprocess.run(
        [*command, "--resume", "killed"], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "done"
    first, second = pids(pid_file)
    assert first == orphan and second != orphan  # the resumed run started its own
    assert not alive(second)
    wait_dead(orphan)  # its stdin ended with the killed run: it exits on its own
    journal = FileStore(state).open("killed")  # the retried call's result is journaled
    try:
        results = [r for r in journal.records if isinstance(r, ToolResult)]
    finally:
        journal.close_sync()
    assert [r.result["content"] for r in results] == [f"{release} is there"]
    [result] = tool_results(api.requests_for("go")[-1])
    assert result["content"] == f"{release} is there"


def test_info_lists_mcp_tools_with_their_server(api: FakeMessagesAPI, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent.yaml", api, demo(extra="tags: [math]"))
    info = subprocess.run(
        [*CLI, "info", "-c", str(agent)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert info.returncode == 0, info.stderr
    rows = {line.split()[0]: line for line in info.stdout.splitlines() if "mcp (demo)" in line}
    assert set(rows) == {"add", "fail", "dot", "env", "wait_for"}
    assert "math, ai:confirm" in rows["add"] and "yes (ai:confirm)" in rows["add"]
    assert f"demo  stdio: {sys.executable} {DEMO}  (5 tools, gated)" in info.stdout


@pytest.mark.parametrize(
    ("server", "field"),
    [
        (
            "  - {alias: demo, command: 'npx demo-server --flag'}\n",
            "mcp_servers[0].command: expected a list (an argv; no shell runs it)",
        ),
        ("  - {alias: demo, url: 'http://example.com/mcp'}\n", "mcp_servers[0].url"),
        ("  - {alias: demo, command: [demo], shell: true}\n", "mcp_servers[0].shell"),
        (
            "  - {alias: demo, command: [demo], url: 'https://x.example/mcp'}\n",
            "mcp_servers[0].command",
        ),
    ],
)
def test_bad_declarations_are_one_line(
    api: FakeMessagesAPI, tmp_path: Path, server: str, field: str
) -> None:
    agent = write_agent(tmp_path / "agent.yaml", api, server)
    for args in (["info", "-c", str(agent)], ["run", "-c", str(agent), "go"]):
        done = subprocess.run([*CLI, *args], env=ENV, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        [line] = done.stderr.strip().splitlines()
        assert f"agent.yaml: {field}" in line
    assert api.requests == []


def test_a_server_that_does_not_start_is_exit_2(api: FakeMessagesAPI, tmp_path: Path) -> None:
    server = "  - {alias: gone, command: ['/nonexistent/mcp-server']}\n"
    agent = write_agent(tmp_path / "agent.yaml", api, server)
    done = subprocess.run(
        [*CLI, "run", "-c", str(agent), "go"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "MCP server 'gone'" in line and "No such file" in line
    assert api.requests == []

"""`fisk-sm tool-host` as a real subprocess on a real loopback nats-server: agents call its
Python and exec tools as remote tools (journaled with kind "remote"), SIGTERM drains it, and a
SIGKILL mid-call gives the caller an is_error result within call_timeout, not a hang."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import natskit
import pytest
from crashkit import Lines
from ctlkit import wait_until

from fisk_sm import parse_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import start_session
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.remote import connect_remote_tools

FISK_SM = [sys.executable, "-m", "fisk_sm.cli"]
SUBJECT = "tools.lab"

HOST_TOOLS = '''
import time
from pathlib import Path


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def nap(marker: str) -> str:
    """Mark that it started, then sleep for an hour."""
    Path(marker).write_text("started")
    time.sleep(3600)
    return "woke"


def hold(marker: str, go: str) -> str:
    """Mark that it started, then wait for the file `go`."""
    Path(marker).write_text("started")
    while not Path(go).exists():
        time.sleep(0.02)
    return "released"
'''

TOOLS_YAML = """\
identity: lab
tools:
  - python: hosttools:add
  - python: hosttools:nap
  - python: hosttools:hold
  - name: shout
    description: Echo a word.
    command: [echo, "{word}!"]
    arguments: [{name: word, type: string, required: true}]
"""


class Host:
    """A `fisk-sm tool-host` child process with its stderr read line by line."""

    def __init__(self, folder: Path, nats_url: str, *extra: str) -> None:
        (folder / "hosttools.py").write_text(HOST_TOOLS)
        (folder / "tools.yaml").write_text(TOOLS_YAML)
        argv = [*FISK_SM, "tool-host", "-c", str(folder / "tools.yaml"), "--nats", nats_url]
        self.process = subprocess.Popen(
            [*argv, "--subject", SUBJECT, *extra],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        self.lines = Lines(self.process.stderr)

    def ready(self) -> str:
        return self.lines.wait_for("fisk-sm tool-host: serving")

    def wait(self) -> int:
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def host(tmp_path: Path, nats_url: str) -> Iterator[Host]:
    folder = tmp_path / "host"
    folder.mkdir()
    started = Host(folder, nats_url)
    yield started
    started.kill()


def agent(api: FakeMessagesAPI, nats_url: str, call_timeout: str = "60s") -> Any:
    data = {
        "llm": {"model": "m", "base_url": api.base_url, "budget": {"call_timeout": call_timeout}},
        "remote_tools": [{"alias": "lab", "subject": SUBJECT}],
        "nats": {"url": nats_url},
    }
    return parse_config(data, env={})


async def checkpointed(config: Any, store: FileStore, run_id: str) -> str:
    """Run `config` as a session in `store` with its remote tools; the final state."""
    tools, close = await connect_remote_tools(config, taken=())
    try:
        run = await start_session(config, "go", store, RunOptions(tools=tools), run_id=run_id)
        async with run:
            return await run.run()
    finally:
        await close()


def results(store: FileStore, run_id: str) -> list[ToolResult]:
    return [r for r in store.load(run_id) if isinstance(r, ToolResult)]


async def test_remote_calls_through_tool_host_are_journaled_as_remote(
    api: FakeMessagesAPI, nats_url: str, host: Host, tmp_path: Path
) -> None:
    ready = host.ready()
    assert "serving 4 tools (add, nap, hold, shout) as 'lab' on tools.lab" in ready
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 40}),
        Reply.tool_use("shout", {"word": "hey"}),
        Reply.text("done"),
    )
    store = FileStore(tmp_path / "runs")
    assert await checkpointed(agent(api, nats_url), store, "r1") == "completed"
    added, shouted = results(store, "r1")
    assert (added.kind, added.is_error, added.result["content"]) == ("remote", False, "42")
    assert shouted.kind == "remote" and not shouted.is_error
    assert json.loads(shouted.result["content"])["output"] == "hey!\n"
    tools = {t["name"] for t in api.requests[0]["tools"]}
    assert {"add", "nap", "hold", "shout"} <= tools
    host.process.send_signal(signal.SIGTERM)
    assert host.wait() == 0
    text = host.lines.text()
    assert "stopping (0 calls in flight)" in text and "stopped (0 calls cancelled)" in text


async def test_a_tool_host_killed_mid_call_gives_is_error_within_call_timeout(
    api: FakeMessagesAPI, nats_url: str, host: Host, tmp_path: Path
) -> None:
    host.ready()
    marker = tmp_path / "nap.started"
    api.add(Reply.tool_use("nap", {"marker": str(marker)}), Reply.text("it failed"))
    store = FileStore(tmp_path / "runs")
    run = asyncio.ensure_future(checkpointed(agent(api, nats_url, "3s"), store, "r2"))
    await asyncio.to_thread(wait_until, marker.exists, "the remote tool to start")
    host.process.send_signal(signal.SIGKILL)
    assert host.wait() == -signal.SIGKILL
    assert await run == "completed"
    (napped,) = results(store, "r2")
    assert napped.kind == "remote" and napped.is_error
    assert "remote tool 'nap' on host 'lab' (tools.lab) did not answer" in napped.result["content"]
    fed_back = api.requests[1]["messages"][-1]["content"][0]
    assert fed_back["is_error"] is True and "did not answer" in fed_back["content"]


async def test_sigterm_lets_a_call_in_flight_finish_and_answer(
    api: FakeMessagesAPI, nats_url: str, host: Host, tmp_path: Path
) -> None:
    host.ready()
    marker, go = tmp_path / "hold.started", tmp_path / "go"
    api.add(Reply.tool_use("hold", {"marker": str(marker), "go": str(go)}), Reply.text("ok"))
    store = FileStore(tmp_path / "runs")
    run = asyncio.ensure_future(checkpointed(agent(api, nats_url), store, "r3"))
    await asyncio.to_thread(wait_until, marker.exists, "the remote tool to start")
    host.process.send_signal(signal.SIGTERM)
    await asyncio.to_thread(host.lines.wait_for, "stopping (1 calls in flight)")
    go.write_text("go")  # released only once the host has stopped taking calls
    assert await run == "completed"
    (held,) = results(store, "r3")
    assert (held.kind, held.is_error, held.result["content"]) == ("remote", False, "released")
    assert await asyncio.to_thread(host.wait) == 0
    assert "stopped (0 calls cancelled)" in host.lines.text()


def test_a_call_still_running_after_the_grace_is_cancelled_and_the_host_exits_0(
    tmp_path: Path, nats_url: str
) -> None:
    host = Host(tmp_path, nats_url, "--grace", "0")
    try:
        host.ready()
        marker = tmp_path / "nap.started"
        asker = subprocess.Popen(
            [sys.executable, "-c", ASK, nats_url, f"{SUBJECT}.call.nap", str(marker)],
            stdout=subprocess.PIPE,
            text=True,
        )
        wait_until(marker.exists, "the remote tool to start")
        host.process.send_signal(signal.SIGTERM)
        assert host.wait() == 0
        text = host.lines.text()
        assert "stopping (1 calls in flight)" in text and "stopped (1 calls cancelled)" in text
        out, _ = asker.communicate(timeout=60)
        assert json.loads(out)["error"]  # the caller hears of it, or times out: never hangs
    finally:
        host.kill()


ASK = """
import asyncio, json, sys
import nats
async def main():
    nc = await nats.connect(sys.argv[1])
    try:
        # The host cancels the call without a reply: the caller's own timeout ends the wait.
        msg = await nc.request(sys.argv[2], json.dumps({"marker": sys.argv[3]}).encode(), 5)
        print(msg.data.decode())
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}))
    await nc.close()
asyncio.run(main())
"""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FISK_SM, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = run_cli("tool-host", "-c", "nope.yaml", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr == "fisk-sm: nope.yaml: (file): No such file or directory\n"
    (tmp_path / "bad.yaml").write_text("tools:\n  - python: nosuchmodule:fn\n")
    bad = run_cli("tool-host", "-c", "bad.yaml", "--nats", "nats://127.0.0.1:1", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "bad.yaml: tools[0].python: cannot import 'nosuchmodule'" in bad.stderr
    (tmp_path / "empty.yaml").write_text("identity: x\n")
    empty = run_cli("tool-host", "-c", "empty.yaml", cwd=tmp_path)
    assert (empty.returncode, empty.stderr) == (
        2,
        "fisk-sm: empty.yaml: tools: no tools to serve\n",
    )
    (tmp_path / "ok.yaml").write_text("tools: [{name: hi, command: [echo, hi]}]\n")
    subject = run_cli("tool-host", "-c", "ok.yaml", "--subject", "a.*", cwd=tmp_path)
    assert subject.returncode == 2 and "--subject 'a.*': not a NATS subject" in subject.stderr
    port = natskit.free_port()
    url = f"nats://127.0.0.1:{port}"
    down = run_cli("tool-host", "-c", "ok.yaml", "--nats", url, cwd=tmp_path)
    assert down.returncode == 69
    assert down.stderr.startswith(f"fisk-sm tool-host: cannot reach the NATS server at {url}")
    assert down.stderr.count("\n") == 1


def test_help_explains_the_command(tmp_path: Path) -> None:
    shown = run_cli("tool-host", "--help", cwd=tmp_path)
    assert shown.returncode == 0
    for text in ("SUBJECT.list", "remote_tools", "SIGTERM", "--grace", "--queue", "NATS_URL"):
        assert text in shown.stdout, text

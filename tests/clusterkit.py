"""Several real `fisk-sm supervise --nats` processes on one loopback nats-server.

Every member runs the same agent: one ungated tool, `note(mark)`, that appends
`"<owner> <mark>"` to the shared effects file (one line per real execution) and answers
`"noted <mark> by <owner>"`, so each journaled tool result names the supervisor that ran it.
The owner is the member's `--owner`, passed to the tool as $NOTE_OWNER; $NOTE_SLEEP makes the
tool take that long. The fake Messages API (in the test's process) scripts each run by its
prompt: `turns` calls of `note` (marks `<prompt>-<k>`, ids `toolu_<prompt>_<k>`), then the
answer `<prompt> done`.

`journals(url)` reads every session back from the JetStream store; `owner_segments` splits a
journal at its takeover records and checks that each part's tool results come from one owner,
the one the takeover records name.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctlkit import start_supervise

from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.journal.jetstream_stream import init_stream
from fisk_sm.journal.records import Assistant, Record, Terminal, ToolResult
from fisk_sm.testing import Reply

__all__ = [
    "CLI",
    "PREFIX",
    "STREAM",
    "TAKEOVER",
    "Member",
    "journals",
    "make_stream",
    "owner_segments",
    "script",
]

CLI = [sys.executable, "-m", "fisk_sm.cli"]
STREAM = "FISK_SM_SESSIONS"
PREFIX = "fisk-sm.sessions"
DEADLINE = 240.0
TAKEOVER = re.compile(r"taken over by (\S+): the lease of (\S+) expired")
TOOLS = '''
import os, time

def note(mark: str) -> str:
    """Note a mark in the effects file."""
    owner = os.environ["NOTE_OWNER"]
    time.sleep(float(os.environ.get("NOTE_SLEEP", "0")))
    fd = os.open({effects!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (owner + " " + mark + "\\n").encode())
    finally:
        os.close(fd)
    return "noted " + mark + " by " + owner
'''


def script(prompt: str, turns: int = 1, delay: float = 0.02) -> list[Reply]:
    """`turns` calls of `note`, then the answer."""
    calls = [
        Reply.tool_use("note", {"mark": f"{prompt}-{k}"}, id=f"toolu_{prompt}_{k}", delay=delay)
        for k in range(turns)
    ]
    return [*calls, Reply.text(f"{prompt} done", delay=delay)]


def make_stream(url: str) -> None:
    """Create the session stream (as `fisk-sm session init-stream` does)."""
    asyncio.run(init_stream(url, stream=STREAM, prefix=PREFIX))


def write_agent(root: Path, base_url: str) -> Path:
    """The agent.yaml and its tool module in `root`; the effects file is `root/effects.txt`."""
    (root / "note_tools.py").write_text(TOOLS.format(effects=str(root / "effects.txt")))
    agent = root / "agent.yaml"
    agent.write_text(
        f"llm: {{model: m, base_url: '{base_url}', no_prompt_cache: true,"
        " budget: {call_timeout: 120}}\ntools: [{python: 'note_tools:note'}]\n"
        f"harness: {{sessions: {{backend: jetstream, options: {{stream: {STREAM},"
        f" prefix: {PREFIX}}}}}}}\n"
    )
    return agent


class Member:
    """One `fisk-sm supervise --nats` process."""

    def __init__(
        self,
        root: Path,
        name: str,
        nats_url: str,
        *,
        concurrency: int = 20,
        ttl: float = 2.0,
        heartbeat: float = 0.5,
        tool_sleep: float = 0.0,
    ) -> None:
        self.root, self.name, self.nats_url = root, name, nats_url
        self.argv = [
            *CLI, "supervise", "-c", str(root / "agent.yaml"), "--listen", "127.0.0.1:0",
            "--nats", nats_url, "--owner", name, "--concurrency", str(concurrency),
            "--lease-ttl", str(ttl), "--heartbeat", str(heartbeat),
        ]  # fmt: skip
        self.tool_sleep = tool_sleep
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> Member:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        env.update(ANTHROPIC_API_KEY="test", NOTE_OWNER=self.name)
        env["NOTE_SLEEP"] = str(self.tool_sleep)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")])
        self.process, self.stderr, self.url = start_supervise(self.argv, env, self.root, DEADLINE)
        return self

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def submit(self, prompt: str) -> str:
        status, run = self.api("POST", "/api/runs", {"prompt": prompt})
        assert status == 201, (status, run)
        return str(run["run_id"])

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> int:
        """SIGCONT (should it be stopped) and SIGTERM; the exit code."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"{self.name} did not exit on SIGTERM") from None

    def lines(self) -> str:
        return self.stderr.text(DEADLINE)


async def _journals(url: str) -> dict[str, list[Record]]:
    store = await JetStreamStore.connect(url, stream=STREAM, prefix=PREFIX)
    try:
        infos = await store.list_async()
        loaded = await asyncio.gather(*(store.load_async(i.run_id) for i in infos))
        return {info.run_id: records for info, records in zip(infos, loaded, strict=True)}
    finally:
        await store.close()


def journals(url: str) -> dict[str, list[Record]]:
    """Every session in the store: run id -> its records."""
    return asyncio.run(_journals(url))


def result_owner(record: ToolResult) -> str:
    """Who ran the tool of a journaled result ("noted <mark> by <owner>")."""
    content = record.result.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    found = re.search(r"noted \S+ by (\S+)", text)
    return found.group(1) if found else ""


def owner_segments(records: Sequence[Record]) -> list[tuple[str, str, list[str]]]:
    """The journal cut at its takeover records: (old owner, new owner, [owners of the tool
    results in the part after it]); the first part has no takeover ("", "")."""
    parts: list[tuple[str, str, list[str]]] = [("", "", [])]
    for record in records:
        if isinstance(record, Terminal) and record.message:
            found = TAKEOVER.search(record.message)
            if found:
                parts.append((found.group(2), found.group(1), []))
                continue
        if isinstance(record, ToolResult):
            parts[-1][2].append(result_owner(record))
    return parts


def check_single_owner(run_id: str, records: Sequence[Record]) -> list[str]:
    """What is wrong with the ownership of one journal (empty: nothing). Each part's results
    come from one owner; after a takeover, from the taker; before it, from the one it names."""
    problems = []
    parts = owner_segments(records)
    for i, (_, taker, owners) in enumerate(parts):
        expected = {taker} if taker else set()
        if i + 1 < len(parts):
            expected.add(parts[i + 1][0])  # the next takeover names this part's owner
        if len(set(owners)) > 1 or (owners and expected and not set(owners) <= expected):
            problems.append(f"{run_id} part {i}: results by {owners}, expected {expected}")
    seen_takeover = False
    for record in records:  # after a takeover: only takeovers and the final outcome end it
        if isinstance(record, Terminal):
            takeover = bool(record.message and TAKEOVER.search(record.message))
            if seen_takeover and not takeover and record is not records[-1]:
                problems.append(f"{run_id}: a {record.reason} record after a takeover")
            seen_takeover = seen_takeover or takeover
    return problems


def tool_uses(records: Sequence[Record]) -> list[str]:
    """The ids of every tool call the journal's assistant turns made."""
    return [
        str(block["id"])
        for record in records
        if isinstance(record, Assistant)
        for block in record.message.get("content", [])
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]

"""`fisk-sm supervise --workers N` as a real process, for the tests of the workers: the real SDK
against the fake API, HTTP to the control API, tools that note their worker's pid."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
from pathlib import Path
from typing import Any

from ctlkit import CLI, DEADLINE, Supervisor, wait_until

from fisk_sm.testing import FakeMessagesAPI, Reply

__all__ = ["EventReader", "Workers", "effects", "note_turns"]

TOOLS = '''
import os, time

EFFECTS = {effects!r}


def _line(text: str) -> None:
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (text + "\\n").encode())
    finally:
        os.close(fd)


def note(mark: str) -> str:
    """Note a mark (it takes a while)."""
    _line(f"start {{mark}} {{os.getpid()}}")
    time.sleep({sleep!r} * (10 if "slow" in mark else 1))
    _line(f"end {{mark}}")
    return "noted " + mark


def deploy(target: str) -> str:
    """Deploy to a target."""
    _line(f"deploy {{target}} {{os.getpid()}}")
    return "deployed to " + target
'''


def note_turns(prompt: str, turns: int = 1) -> list[Any]:
    """`turns` calls of the `note` tool (marks `<prompt>-<k>`), then the answer."""
    calls = [
        Reply.tool_use("note", {"mark": f"{prompt}-{k}"}, id=f"toolu_{prompt}_{k}", delay=0.02)
        for k in range(turns)
    ]
    return [*calls, Reply.text(f"{prompt} done", delay=0.02)]


def effects(path: Path) -> list[list[str]]:
    """The effects file's lines, split."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


class Workers(Supervisor):
    """`fisk-sm supervise --workers N` on a free loopback port; tools `note` (ungated, sleeps
    `sleep` s between its start and end lines, ten times that for a mark with "slow" in it)
    and `deploy` (gated)."""

    def __init__(
        self,
        root: Path,
        api: FakeMessagesAPI,
        workers: int = 2,
        sleep: float = 0.05,
        concurrency: int = 16,
    ) -> None:
        flags = ("--concurrency", str(concurrency), "--workers", str(workers))
        super().__init__(root, api, args=flags)
        self.workers = workers
        (root / "worker_tools.py").write_text(TOOLS.format(effects=str(self.effects), sleep=sleep))
        self.agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
            "tools:\n"
            "  - {python: 'worker_tools:note'}\n"
            "  - {python: 'worker_tools:deploy', tags: ['ai:confirm']}\n"
        )
        self.pids: dict[int, int] = {}

    def argv(self) -> list[str]:
        argv = [*CLI, "supervise", "-c", str(self.agent), "--listen", "127.0.0.1:0"]
        return [*argv, "--state-dir", str(self.state), *self.args]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        return {**env, "ANTHROPIC_API_KEY": "test"}

    def start(self) -> Workers:
        super().start()
        for index in range(self.workers):
            self.pids[index] = self.worker_pid(index)
        return self

    def worker_pid(self, index: int, besides: frozenset[int] = frozenset()) -> int:
        """The pid of worker `index` (its latest start whose pid is not in `besides`)."""

        def found() -> int | None:
            pattern = re.compile(rf"worker {index} \(pid (\d+)\) started")
            lines = list(self.stderr._lines)
            pids = [int(m.group(1)) for line in lines if (m := pattern.search(line))]
            fresh = [pid for pid in pids if pid not in besides]
            return fresh[-1] if fresh else None

        return wait_until(found, f"worker {index} to start")

    def runs(self) -> list[dict[str, Any]]:
        status, body = self.api("GET", "/api/runs")
        assert status == 200, (status, body)
        return list(body["runs"])

    def wait_all(self, count: int, status: str = "completed") -> list[dict[str, Any]]:
        def done() -> list[dict[str, Any]] | None:
            runs = self.runs()
            return runs if [r["status"] for r in runs].count(status) == count else None

        return wait_until(done, f"{count} runs to be {status}")

    def submit(self, prompt: str, name: str | None = None, chat: bool = False) -> str:
        if not chat:
            return super().submit(prompt, name)
        status, run = self.api("POST", "/api/runs", {"prompt": prompt, "chat": True})
        assert status == 201, (status, run)
        return str(run["run_id"])

    def __enter__(self) -> Workers:
        return self.start()


class EventReader:
    """`GET /api/events` read on a thread: (id, event, data) triples so far."""

    def __init__(self, url: str) -> None:
        self.items: list[tuple[str, str, dict[str, Any]]] = []
        self._response = urllib.request.urlopen(url + "/api/events", timeout=DEADLINE)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event_id = name = ""
        try:
            for raw in self._response:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:") and name:
                    self.items.append((event_id, name, json.loads(line[5:].strip())))
        except (OSError, ValueError):
            pass

    def of(self, name: str) -> list[dict[str, Any]]:
        return [data for _, kind, data in self.items if kind == name]

"""`fisk-sm supervise` as a real process: 200 runs, SIGTERM and SIGKILL mid-flight, restarts,
and approvals end to end (the real SDK against the fake API; HTTP to the control API)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
from crashkit import Lines
from ctlkit import CLI, DEADLINE, http, wait_until
from ctlkit import Supervisor as Gated

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Assistant
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.testing.conversations import first_user_text, turn_of
from fisk_sm.tools.gate import DECLINED

RUNS = 200
#: A reply that would hold a shutdown visibly (call_timeout is 120 s): a progress check.
SLOW = 30.0
TOOLS = """
import os, time

def note(mark: str) -> str:
    '''Note a mark in the effects file.'''
    time.sleep(0.01)
    fd = os.open({effects!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (mark + "\\n").encode())
    finally:
        os.close(fd)
    return "noted " + mark
"""


def script(prompt: str, slow: bool = False) -> list[Any]:
    """Two tool turns, then the answer; with `slow`, the first attempt at turn 1 waits SLOW s
    (a resumed run asks again and is answered at once)."""
    first = Reply.tool_use("note", {"mark": f"{prompt}-0"}, id=f"toolu_{prompt}_0", delay=0.02)
    again = Reply.tool_use("note", {"mark": f"{prompt}-1"}, id=f"toolu_{prompt}_1", delay=0.02)
    second: Any = (attrs.evolve(again, delay=SLOW), again) if slow else again
    return [first, second, Reply.text(f"{prompt} done", delay=0.02)]


class Supervise:
    """`fisk-sm supervise` on 127.0.0.1:0 with the ungated `note` tool."""

    def __init__(self, root: Path, api: FakeMessagesAPI, concurrency: int = 50) -> None:
        self.root, self.state, self.effects = root, root / "state", root / "effects.txt"
        (root / "note_tools.py").write_text(TOOLS.format(effects=str(self.effects)))
        self.agent = root / "agent.yaml"
        self.agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true,"
            " budget: {call_timeout: 120}}\ntools: [{python: 'note_tools:note'}]\n"
        )
        self.concurrency = concurrency
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> Supervise:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        argv = [*CLI, "supervise", "-c", str(self.agent), "--listen", "127.0.0.1:0"]
        argv += ["--state-dir", str(self.state), "--concurrency", str(self.concurrency)]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "ANTHROPIC_API_KEY": "test"},
            cwd=self.root,
        )
        assert self.process.stderr is not None
        self.stderr = Lines(self.process.stderr)
        self.stderr.wait_for("listening on", DEADLINE)
        self.url = (self.state / "supervisor.url").read_text().strip()
        return self

    def runs(self) -> list[dict[str, Any]]:
        status, body = http("GET", self.url + "/api/runs")
        assert status == 200, body
        return list(body["runs"])

    def submit_all(self, prompts: list[str]) -> list[str]:
        def one(prompt: str) -> str:
            status, run = http("POST", self.url + "/api/runs", {"prompt": prompt})
            assert status == 201, run
            return str(run["run_id"])

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, prompts))

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = DEADLINE) -> int:
        assert self.process is not None
        return self.process.wait(timeout)


def marks(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_200_runs_complete_and_the_listing_shows_them_in_progress(tmp_path: Path) -> None:
    prompts = [f"r{i:03d}" for i in range(RUNS)]
    with FakeMessagesAPI(conversations={p: script(p) for p in prompts}) as api:
        sup = Supervise(tmp_path, api).start()
        try:
            sup.submit_all(prompts)
            seen: collections.Counter[str] = collections.Counter()

            def all_done() -> bool:
                statuses = [r["status"] for r in sup.runs()]
                if len(statuses) == RUNS and statuses.count("completed") < RUNS:
                    seen.update(set(statuses))
                return statuses.count("completed") == RUNS

            wait_until(all_done, "all 200 runs to complete")
        finally:
            sup.signal(signal.SIGTERM)
            assert sup.wait() == 0
    assert seen["running"] or seen["queued"], seen  # the listing showed them under way
    assert sorted(marks(sup.effects)) == sorted(f"{p}-{k}" for p in prompts for k in (0, 1))
    assert len(api.requests) == 3 * RUNS


def test_sigterm_with_200_runs_in_flight_suspends_them_and_a_restart_completes_all(
    tmp_path: Path,
) -> None:
    prompts = [f"s{i:03d}" for i in range(RUNS)]
    conversations = {p: script(p, slow=i % 2 == 0) for i, p in enumerate(prompts)}
    with FakeMessagesAPI(conversations=conversations) as api:
        sup = Supervise(tmp_path, api, concurrency=2 * RUNS).start()
        ids = sup.submit_all(prompts)
        # Every run has reached its second call (half of them now hang for SLOW s).
        wait_until(lambda: sum(turn_of(r) == 1 for r in api.requests) >= RUNS, "200 turn-1 calls")
        started = time.monotonic()
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=SLOW - 5) == 0  # never waits out a reply (or call_timeout)
        assert time.monotonic() - started < SLOW
        store = FileStore(sup.state)
        for run_id in ids:  # every journal folds, suspended
            assert store.snapshot(run_id).status in ("suspended", "completed", "open"), run_id

        again = Supervise(tmp_path, api, concurrency=2 * RUNS).start()
        try:
            wait_until(
                lambda: [r["status"] for r in again.runs()].count("completed") == RUNS,
                "all 200 runs to complete after the restart",
            )
        finally:
            again.signal(signal.SIGTERM)
            assert again.wait() == 0
    # Zero repeated tool executions.
    effects = marks(sup.effects)
    assert sorted(effects) == sorted(f"{p}-{k}" for p in prompts for k in (0, 1))
    # Only cancelled calls were made again: each turn at most twice, and once in its journal.
    asked = collections.Counter((first_user_text(r), turn_of(r)) for r in api.requests)
    repeated = {key for key, n in asked.items() if n > 1}
    assert all(n <= 2 for n in asked.values())
    assert repeated >= {(p, 1) for i, p in enumerate(prompts) if i % 2 == 0}  # the slow ones
    for run_id in ids:
        turns = [r for r in store.load(run_id) if isinstance(r, Assistant)]
        assert [t.iteration for t in turns] == [1, 2, 3], run_id


class Events:
    """`GET /api/events` read on a thread: the (event, data) pairs so far."""

    def __init__(self, url: str) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self._response = urllib.request.urlopen(url + "/api/events", timeout=DEADLINE)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name = ""
        try:
            for raw in self._response:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:") and name:
                    self.items.append((name, json.loads(line[5:].strip())))
        except (OSError, ValueError):
            pass

    def of(self, name: str) -> list[dict[str, Any]]:
        return [data for kind, data in self.items if kind == name]


def test_a_parked_run_survives_sigterm_and_sigkill_and_answers_complete_it(
    tmp_path: Path,
) -> None:
    conversations = {
        f"deploy {t}": [
            Reply.tool_use("deploy", {"target": t}, id=f"toolu_{t[0]}"),
            Reply.text(f"{t} done"),
        ]
        for t in ("prod", "test")
    }
    with FakeMessagesAPI(conversations=conversations) as api:
        sup = Gated(tmp_path, api).start()
        events = Events(sup.url)
        prod, test = sup.submit("deploy prod"), sup.submit("deploy test")
        for run_id in (prod, test):
            assert sup.wait_status(run_id, "parked")["approval"]["tool"] == "deploy"
        wait_until(lambda: len(events.of("RunParked")) >= 2, "RunParked events")
        assert {e["tool_use_id"] for e in events.of("ApprovalAsked")} == {"toolu_p", "toolu_t"}
        assert sup.stop() == 0  # SIGTERM: parked, not denied

        sup.start()
        for run_id in (prod, test):  # listed, not resumed
            assert sup.run(run_id)["status"] == "parked"
        assert sup.process is not None
        sup.process.kill()  # SIGKILL
        sup.process.wait()

        sup.start()
        events = Events(sup.url)
        status, pending = sup.api("GET", "/api/approvals")
        assert status == 200
        assert sorted(a["tool_use_id"] for a in pending["approvals"]) == ["toolu_p", "toolu_t"]
        assert sup.effects_lines() == []
        status, _ = sup.api("POST", f"/api/runs/{prod}/approvals/toolu_p", {"answer": "once"})
        assert status == 200
        assert sup.wait_status(prod, "completed")["answer"] == "prod done"
        status, _ = sup.api("POST", f"/api/runs/{test}/approvals/toolu_t", {"answer": "deny"})
        assert status == 200
        assert sup.wait_status(test, "completed")["answer"] == "test done"
        wait_until(lambda: events.of("ApprovalDenied"), "the denial event")
        assert sup.stop() == 0
    assert sup.effects_lines() == ["prod"]
    granted = events.of("ApprovalGranted")
    assert [(e["tool_use_id"], e["answer"]) for e in granted] == [("toolu_p", "once")]
    assert [e["tool_use_id"] for e in events.of("ApprovalDenied")] == ["toolu_t"]
    assert {e["tool_use_id"] for e in events.of("ToolFinished")} == {"toolu_p"}
    last = next(r for r in reversed(api.requests) if first_user_text(r) == "deploy test")
    result = last["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_t"
    assert json.loads(result["content"]) == {"allowed": False, "reason": DECLINED}

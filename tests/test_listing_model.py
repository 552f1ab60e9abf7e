"""One read model for every listing, on one supervisor: a real `fisk-sm supervise` stopped with
SIGTERM and started again on the same state directory shows each run as before (name, answer,
status, pending approval); a park is announced by exactly one `RunParked`; the shutdown summary
counts the runs that resume, the parked ones and the suspended ones apart.

Real parts only: the process, its stderr, HTTP to its API and its event stream, the real SDK
against the fake Messages API in this process (conversations keyed by each run's prompt).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from ctlkit import DEADLINE, wait_until
from ctlkit import Supervisor as Process

from fisk_sm.testing import FakeMessagesAPI, Reply

#: A model call that is still in flight when the test suspends it or stops the process.
SLOW = 60.0
SUMMARY = re.compile(
    r"stopped; (\d+) run\(s\) will resume on the next start, (\d+) parked for an approval,"
    r" (\d+) suspended by an operator"
)


def conversations() -> dict[str, list[Reply]]:
    return {
        "look": [Reply.tool_use("look", {"what": "sky"}), Reply.text("the sky is blue")],
        "deploy": [
            Reply.tool_use("deploy", {"target": "prod"}, id="toolu_prod"),
            Reply.text("deployed it"),
        ],
        "slow-suspended": [Reply.text("never seen", delay=SLOW)],
        "slow-resuming": [Reply.text("never seen", delay=SLOW)],
    }


class Events:
    """`GET /api/events` of a supervisor, read in a thread: (event name, data) as they come."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=DEADLINE)
        self.connection.request("GET", "/api/events", headers={"Accept": "text/event-stream"})
        response = self.connection.getresponse()
        assert response.status == 200, response.status
        self.response = response
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        name = ""
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:") and name:
                    self.seen.append((name, json.loads(line[5:])))
                    name = ""
        except (OSError, ValueError):  # closed by `close`
            return

    def of(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(n, d) for n, d in list(self.seen) if d.get("run_id") == run_id]

    def close(self) -> None:
        sock = self.connection.sock
        assert sock is not None
        sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread up (a close would not)
        self._thread.join(DEADLINE)
        self.connection.close()


def rows(sup: Process) -> dict[str, dict[str, Any]]:
    status, body = sup.api("GET", "/api/runs")
    assert status == 200, (status, body)
    return {run["name"]: run for run in body["runs"]}


def summary(sup: Process) -> tuple[int, int, int]:
    """(resuming, parked, suspended) as the stopped process said on stderr."""
    found = SUMMARY.search(sup.stderr.text(DEADLINE))
    assert found, sup.stderr.text(DEADLINE)
    resuming, parked, suspended = found.groups()
    return int(resuming), int(parked), int(suspended)


def test_a_restart_shows_every_run_as_before_and_the_summary_counts_apart(
    tmp_path: Path,
) -> None:
    with FakeMessagesAPI(conversations=conversations()) as api:
        sup = Process(tmp_path, api).start()
        try:
            ids = {name: sup.submit(name, name=f"the {name}") for name in conversations()}
            sup.wait_status(ids["look"], "completed")
            sup.wait_status(ids["deploy"], "parked")
            wait_until(lambda: len(api.requests_for("slow-suspended")) == 1, "the slow call")
            wait_until(lambda: len(api.requests_for("slow-resuming")) == 1, "the slow call")
            status, _ = sup.api("POST", f"/api/runs/{ids['slow-suspended']}/suspend", {})
            assert status == 202
            sup.wait_status(ids["slow-suspended"], "suspended")
            before = rows(sup)
        finally:
            assert sup.stop() == 0
        # the slow-resuming run was running: the next start resumes it; the parked run waits
        # for its answer; the one an operator suspended stays suspended
        assert summary(sup) == (1, 1, 1)

        sup = Process(tmp_path, api).start()
        try:
            after = rows(sup)
            status, approvals = sup.api("GET", "/api/approvals")
            assert status == 200
            wait_until(lambda: len(api.requests_for("slow-resuming")) == 2, "the resumed call")
            status, _ = sup.api("POST", f"/api/runs/{ids['deploy']}/approvals/toolu_prod", {
                "answer": "once"
            })  # fmt: skip
            assert status == 200
            sup.wait_status(ids["deploy"], "completed")
            done = rows(sup)
        finally:
            assert sup.stop() == 0
        assert summary(sup) == (1, 0, 1)

    assert set(after) == {f"the {name}" for name in conversations()}
    for name in ("the look", "the deploy", "the slow-suspended"):
        shown, then = after[name], before[name]
        assert (shown["run_id"], shown["status"], shown["state"]) == (
            then["run_id"],
            then["status"],
            then["state"],
        ), name
        assert (shown["answer"], shown["approval"], shown["iteration"]) == (
            then["answer"],
            then["approval"],
            then["iteration"],
        ), name
    assert after["the look"]["answer"] == "the sky is blue"
    assert after["the look"]["status"] == "completed"
    assert after["the deploy"]["status"] == "parked"
    assert after["the deploy"]["approval"]["tool_use_id"] == "toolu_prod"
    assert [a["tool_use_id"] for a in approvals["approvals"]] == ["toolu_prod"]
    assert after["the slow-suspended"]["status"] == "suspended"
    assert after["the slow-resuming"]["status"] in ("queued", "running")
    assert done["the deploy"]["answer"] == "deployed it"


def test_each_park_is_announced_by_one_run_parked(tmp_path: Path) -> None:
    twice = [
        Reply.tool_use("deploy", {"target": "staging"}, id="toolu_1"),
        Reply.tool_use("deploy", {"target": "prod"}, id="toolu_2"),
        Reply.text("deployed twice"),
    ]
    with FakeMessagesAPI(conversations={"twice": twice}) as api, Process(tmp_path, api) as sup:
        events = Events(sup.url)
        try:
            run_id = sup.submit("twice", name="two parks")
            for tool_use_id in ("toolu_1", "toolu_2"):
                sup.wait_status(run_id, "parked")
                wait_until(
                    lambda t=tool_use_id: (
                        (sup.run(run_id)["approval"] or {}).get("tool_use_id") == t
                    ),
                    f"the park at {tool_use_id}",
                )
                path = f"/api/runs/{run_id}/approvals/{tool_use_id}"
                assert sup.api("POST", path, {"answer": "once"})[0] == 200
            sup.wait_status(run_id, "completed")
            # the stream has caught up once it shows the run completed
            wait_until(
                lambda: any(
                    n == "RunUpdated" and d["status"] == "completed" for n, d in events.of(run_id)
                ),
                "the completed run's RunUpdated",
            )
        finally:
            events.close()
    parks = [d["approval"]["tool_use_id"] for n, d in events.of(run_id) if n == "RunParked"]
    assert parks == ["toolu_1", "toolu_2"]
    sent = [d for n, d in events.of(run_id) if n in ("RunSubmitted", "RunUpdated", "RunParked")]
    assert sent and all(d["name"] == "two parks" for d in sent)

"""One answer per approval: the first answer journaled wins, every later one is refused (409)
naming the answer that was recorded, and a `deny` is never followed by the tool running.

Real parts only: `fisk-sm supervise` processes (one on a state directory, or two sharing a real
nats-server), the fake Messages API scripting each run by its prompt (a call of a gated tool,
then an answer), and the tool's effects file. Each race is two threads, each with its own
`http.client` connection, released together by a barrier: one answers `once`, the other
`deny`. Afterwards the journals are read back and checked against what the clients were told.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import natskit
import pytest
from clusterkit import Member, journals, make_stream, write_agent
from ctlkit import Supervisor, wait_until

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import (
    ApprovalAnswered,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
)
from fisk_sm.testing import FakeMessagesAPI, Reply

ROUNDS = 50
#: What the journal records for each of the API's answers.
JOURNALED = {"once": "once", "always": "always", "deny": "no"}


def use_id(k: int) -> str:
    return f"toolu_race_{k:02d}"


def conversations(tool: str, arg: str, count: int) -> dict[str, list[Reply]]:
    """Run `race-k` calls the gated `tool` once (id `toolu_race_k`), then answers."""
    return {
        f"race-{k}": [
            Reply.tool_use(tool, {arg: f"race-{k}"}, id=use_id(k)),
            Reply.text(f"race-{k} done"),
        ]
        for k in range(count)
    }


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    """One POST over its own `http.client` connection: (status, parsed body)."""
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        data = json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def race(urls: tuple[str, str], run_id: str, tool_use_id: str) -> dict[str, tuple[int, Any]]:
    """Answer `once` at `urls[0]` and `deny` at `urls[1]` at the same moment (in a random
    order of starting): each answer's (status, body)."""
    path = f"/api/runs/{run_id}/approvals/{tool_use_id}"
    barrier = threading.Barrier(2)
    told: dict[str, tuple[int, Any]] = {}

    def answer(url: str, given: str) -> None:
        barrier.wait()
        told[given] = post(url, path, {"answer": given})

    threads = [
        threading.Thread(target=answer, args=(urls[0], "once")),
        threading.Thread(target=answer, args=(urls[1], "deny")),
    ]
    random.shuffle(threads)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return told


def winner_of(run_id: str, tool_use_id: str, told: dict[str, tuple[int, Any]]) -> str:
    """The answer that got 200; fails unless exactly one did and the other got 409 naming it."""
    statuses = {given: status for given, (status, _) in told.items()}
    assert sorted(statuses.values()) == [200, 409], (run_id, told)
    won = next(given for given, status in statuses.items() if status == 200)
    lost = next(given for given, status in statuses.items() if status == 409)
    error = told[lost][1]["error"]
    assert error == f"approval {tool_use_id} of run {run_id} was already answered: {won}", told
    return won


def check_journal(records: list[Record], tool_use_id: str, won: str) -> None:
    """The journal holds exactly one answer, the winner's; a deny never ran the tool."""
    answers = [r for r in records if isinstance(r, ApprovalAnswered)]
    assert [(a.tool_use_id, a.answer) for a in answers] == [(tool_use_id, JOURNALED[won])]
    started = [r for r in records if isinstance(r, ToolStarted)]
    results = [r for r in records if isinstance(r, ToolResult)]
    assert len(results) == 1 and results[0].tool_use_id == tool_use_id
    content = json.dumps(results[0].result.get("content"))
    if won == "deny":
        assert not started and '\\"allowed\\": false' in content, records
    else:
        assert [s.tool_use_id for s in started] == [tool_use_id] and "allowed" not in content
    last = records[-1]
    assert isinstance(last, Terminal) and last.reason == "completed", last


# -- one supervisor ---------------------------------------------------------------------------


def journal(sup: Supervisor, run_id: str) -> list[Record]:
    return FileStore(sup.state).load(run_id)


def park(sup: Supervisor, count: int) -> list[str]:
    """Submit runs `race-0`... `race-<count-1>` and wait until each waits for its approval."""
    with ThreadPoolExecutor(8) as pool:
        run_ids = list(pool.map(sup.submit, [f"race-{k}" for k in range(count)]))
    wait_until(
        lambda: len(sup.api("GET", "/api/approvals")[1]["approvals"]) == count,
        f"{count} runs to park",
    )
    return run_ids


def check_rounds(sup: Supervisor, run_ids: list[str], winners: dict[int, str]) -> None:
    """Every raced run completes (resumed once: a second resume would fail it) with the
    winner's answer journaled; the tool ran for exactly the runs whose winner was `once`."""
    for k in winners:
        ended = sup.wait_status(run_ids[k], "completed", "failed", "suspended", "aborted")
        assert ended["status"] == "completed", ended
        records = wait_until(  # the status may show before the terminal record is written
            lambda r=run_ids[k]: (
                (found := journal(sup, r)) and isinstance(found[-1], Terminal) and found
            ),
            f"run {run_ids[k]}'s journal to end",
        )
        check_journal(records, use_id(k), winners[k])
    deployed = sorted(sup.effects_lines())
    allowed = sorted(f"race-{k}" for k, won in winners.items() if won == "once")
    ran_after_deny = [target for target in deployed if target not in allowed]
    assert ran_after_deny == []
    assert deployed == allowed  # and each allowed call ran once


def test_a_live_parked_approval_takes_one_answer_and_refuses_a_repeat(tmp_path: Path) -> None:
    live = 10
    with FakeMessagesAPI(conversations=conversations("deploy", "target", live + 1)) as api:
        sup = Supervisor(tmp_path, api).start()
        try:
            run_ids = park(sup, live + 1)
            winners = {}
            for k in range(live):  # each run waits at the desk of a supervisor that never stopped
                told = race((sup.url, sup.url), run_ids[k], use_id(k))
                winners[k] = winner_of(run_ids[k], use_id(k), told)
            path = f"/api/runs/{run_ids[live]}/approvals/{use_id(live)}"
            assert post(sup.url, path, {"answer": "once"})[0] == 200
            status, body = post(sup.url, path, {"answer": "once"})  # the same answer again
            expected = f"approval {use_id(live)} of run {run_ids[live]} was already answered: once"
            assert (status, body) == (409, {"error": expected})
            winners[live] = "once"
            check_rounds(sup, run_ids, winners)
            status, body = post(sup.url, path, {"answer": "deny"})  # the run ended: its journal
            assert (status, body) == (409, {"error": expected})
            never = f"/api/runs/{run_ids[live]}/approvals/toolu_never_asked"
            assert post(sup.url, never, {"answer": "once"})[0] == 404
        finally:
            assert sup.stop() == 0


def test_racing_answers_right_after_a_restart_resume_a_parked_run_once(tmp_path: Path) -> None:
    with FakeMessagesAPI(conversations=conversations("deploy", "target", ROUNDS)) as api:
        sup = Supervisor(tmp_path, api).start()
        try:
            run_ids = park(sup, ROUNDS)
            assert sup.stop() == 0
            sup.start()  # every run is parked in its journal, none loaded
            listed = sup.api("GET", "/api/runs")[1]["runs"]
            assert sorted(r["status"] for r in listed) == ["parked"] * ROUNDS
            winners = {}
            for k, run_id in enumerate(run_ids):
                told = race((sup.url, sup.url), run_id, use_id(k))
                winners[k] = winner_of(run_id, use_id(k), told)
            check_rounds(sup, run_ids, winners)
        finally:
            assert sup.stop() == 0
        sup.start()  # and after another restart, the journal has the answers
        try:
            for k in (0, ROUNDS - 1):
                path = f"/api/runs/{run_ids[k]}/approvals/{use_id(k)}"
                status, body = post(sup.url, path, {"answer": "always"})
                assert status == 409 and body["error"].endswith(f"answered: {winners[k]}"), body
        finally:
            assert sup.stop() == 0


# -- two supervisors on NATS ------------------------------------------------------------------


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    with natskit.nats_server(tmp_path) as url:
        make_stream(url)
        yield url


def listed_approvals(member: Member) -> int:
    return len(member.api("GET", "/api/approvals")[1]["approvals"])


def test_racing_answers_at_two_supervisors_on_nats_record_one(
    tmp_path: Path, nats_url: str
) -> None:
    """Half the runs wait at their live owner's desk; the other half were parked by a
    supervisor that stopped and started again (nobody drives them: the winner resumes them)."""
    with FakeMessagesAPI(conversations=conversations("note", "mark", ROUNDS)) as api:
        agent = write_agent(tmp_path, api.base_url)
        gated = "note_tools:note', tags: ['ai:confirm']"
        agent.write_text(agent.read_text().replace("note_tools:note'", gated))
        a, b = members = [Member(tmp_path, name, nats_url, concurrency=ROUNDS) for name in "ab"]
        try:
            a.start()
            b.start()
            with ThreadPoolExecutor(8) as pool:
                run_ids = list(
                    pool.map(lambda k: members[k % 2].submit(f"race-{k}"), range(ROUNDS))
                )
            wait_until(lambda: listed_approvals(a) == ROUNDS, f"{ROUNDS} runs to park")
            owners = {r["run_id"]: r["owner"] for r in b.api("GET", "/api/runs")[1]["runs"]}
            assert a.stop() == 0  # its parked runs are held "parked": nobody drives them
            a.start()
            for member in members:
                wait_until(lambda m=member: listed_approvals(m) == ROUNDS, f"{member.name} to list")
            winners = {}
            for k, run_id in enumerate(run_ids):
                urls = (members[k % 2].url, members[1 - k % 2].url)
                winners[k] = winner_of(run_id, use_id(k), race(urls, run_id, use_id(k)))
            every = wait_until(
                lambda: (
                    (found := journals(nats_url))
                    and len(found) == ROUNDS
                    and all(isinstance(r[-1], Terminal) for r in found.values())
                    and found
                ),
                "every run to end",
            )
            for k, won in winners.items():
                check_journal(every[run_ids[k]], use_id(k), won)
            for k in (0, 1):  # the runs ended: their keys are gone, their journals answer
                path = f"/api/runs/{run_ids[k]}/approvals/{use_id(k)}"
                status, body = members[1 - k].api("POST", path, {"answer": "always"})
                assert status == 409 and body["error"].endswith(f"answered: {winners[k]}"), body
        finally:
            for member in members:
                member.stop()
    assert len(owners) == ROUNDS and set(owners.values()) == {"a", "b"}  # both kinds raced
    effects = tmp_path / "effects.txt"
    marks = (
        sorted(line.split()[1] for line in effects.read_text().splitlines())
        if effects.exists()
        else []
    )
    assert marks == sorted(f"race-{k}" for k, won in winners.items() if won == "once")

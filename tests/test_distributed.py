"""Several `fisk-sm supervise --nats` processes sharing one real nats-server (JetStream).

Real parts only: the supervisors are child processes, the fake Messages API serves every run
by its prompt (`clusterkit.script`), the tool appends one line per real execution to a shared
effects file, and the journals are read back from the JetStream stream. Waits poll for
progress with generous deadlines; nothing asserts a duration.
"""

from __future__ import annotations

import collections
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import ctlkit
import natskit
import pytest
from clusterkit import (
    CLI,
    Member,
    check_single_owner,
    journals,
    make_stream,
    owner_segments,
    script,
    tool_uses,
    write_agent,
)

from fisk_sm.journal.records import Record, Terminal, ToolResult
from fisk_sm.testing import FakeMessagesAPI, Reply

DEADLINE = 240.0
T = TypeVar("T")


def wait_until(probe: Callable[[], T | None], what: str, deadline: float = DEADLINE) -> T:
    """`ctlkit.wait_until`, with this file's longer deadline."""
    return ctlkit.wait_until(probe, what, deadline)


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    with natskit.nats_server(tmp_path) as url:
        make_stream(url)
        yield url


def effects(root: Path) -> list[tuple[str, str]]:
    """(owner, mark) per real execution of the tool."""
    path = root / "effects.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(line.split(" ", 1)[0], line.split(" ", 1)[1]) for line in lines if " " in line]


def completed(url: str, count: int = 1) -> dict[str, list[Record]] | None:
    """Every journal, once there are `count` and all of them are completed."""
    every = journals(url)
    ended = [r for r in every.values() if isinstance(r[-1], Terminal)]
    done = [r for r in ended if r[-1].reason == "completed"]  # type: ignore[attr-defined]
    return every if len(done) == len(every) == count else None


def gate(agent: Path) -> None:
    """Tag the agent's tool `ai:confirm`: every call parks its run for an answer."""
    gated = "note_tools:note', tags: ['ai:confirm']"
    agent.write_text(agent.read_text().replace("note_tools:note'", gated))


def takeovers(records: list[Record]) -> list[tuple[str, str]]:
    """(old owner, new owner) of each takeover record."""
    return [(old, new) for old, new, _ in owner_segments(records)[1:]]


def submit_all(members: list[Member], prompts: list[str]) -> list[str]:
    with ThreadPoolExecutor(12) as pool:
        return list(pool.map(lambda ip: members[ip[0] % len(members)].submit(ip[1]),
                             enumerate(prompts)))  # fmt: skip


def check_journals(every: dict[str, list[Record]], prompts: list[str], turns: int) -> None:
    """Every run completed with its answer, every call has its result, ownership is clean."""
    problems: list[str] = []
    for run_id, records in every.items():
        assert [r.seq for r in records] == list(range(1, len(records) + 1)), run_id
        uses = tool_uses(records)
        answered = {r.tool_use_id for r in records if isinstance(r, ToolResult)}
        assert len(uses) == turns and set(uses) <= answered, (run_id, uses, answered)
        problems += check_single_owner(run_id, records)
    assert problems == []
    assert len(every) == len(prompts)


def test_300_runs_on_three_supervisors_survive_a_sigkill(tmp_path: Path, nats_url: str) -> None:
    prompts = [f"r{i:03d}" for i in range(300)]
    turns = 2
    with FakeMessagesAPI(conversations={p: script(p, turns) for p in prompts}) as api:
        write_agent(tmp_path, api.base_url)
        members = [
            Member(tmp_path, name, nats_url, concurrency=20, tool_sleep=1.0).start()
            for name in ("sup-a", "sup-b", "sup-c")
        ]
        victim = members[2]
        try:
            submit_all(members, prompts)
            # SIGKILL sup-c while it drives runs (it has run tools, and runs remain to do).
            wait_until(
                lambda: sum(1 for o, _ in effects(tmp_path) if o == victim.name) >= 30,
                "sup-c to run tools",
            )
            victim.process.kill()  # type: ignore[union-attr]
            victim.process.wait()  # type: ignore[union-attr]
            every = wait_until(lambda: completed(nats_url, 300), "all 300 runs to complete")
            status, listing = members[0].api("GET", "/api/runs")
        finally:
            for member in members:
                member.stop()
        # Every run asked the fake API for every turn of its script.
        asked = {p: len(api.requests_for(p)) for p in prompts}
    assert {p: n for p, n in asked.items() if n < turns + 1} == {}

    check_journals(every, prompts, turns)
    moved = {run_id: takeovers(records) for run_id, records in every.items()}
    moved = {run_id: found for run_id, found in moved.items() if found}
    # Only the killed supervisor's runs were taken over (no live lease was broken), once each.
    assert moved, "sup-c was killed mid-flight: some of its runs must have been taken over"
    assert all(len(found) == 1 and found[0][0] == victim.name for found in moved.values()), moved
    assert all(new != victim.name for found in moved.values() for _, new in found)
    # Every call ran; a call ran twice only in a run that sup-c had in flight, once at most.
    runs = collections.Counter(mark for _, mark in effects(tmp_path))
    assert set(runs) == {f"{p}-{k}" for p in prompts for k in range(turns)}
    repeated = {mark: n for mark, n in runs.items() if n > 1}
    prompt_of = {run_id: every[run_id][0].prompt for run_id in every}  # type: ignore[attr-defined]
    taken = {prompt_of[run_id] for run_id in moved}
    assert all(n == 2 and mark.rsplit("-", 1)[0] in taken for mark, n in repeated.items())
    assert len(repeated) <= len(moved)
    # Any supervisor's API lists every run, whoever drove it.
    assert status == 200
    assert len(listing["runs"]) == 300
    assert {run["status"] for run in listing["runs"]} == {"completed"}


def test_a_stopped_supervisor_cannot_append_to_runs_taken_over(
    tmp_path: Path, nats_url: str
) -> None:
    prompts = [f"s{i:02d}" for i in range(12)]
    turns = 2
    with FakeMessagesAPI(conversations={p: script(p, turns) for p in prompts}) as api:
        write_agent(tmp_path, api.base_url)
        stalled = Member(tmp_path, "sup-a", nats_url, tool_sleep=1.5).start()
        taker = Member(tmp_path, "sup-b", nats_url, tool_sleep=1.5)
        try:
            submit_all([stalled], prompts)
            # sup-a is inside its tools (it has started some and not journaled them yet).
            wait_until(lambda: any(o == "sup-a" for o, _ in effects(tmp_path)) or None,
                       "sup-a to finish a first tool")  # fmt: skip
            stalled.signal(signal.SIGSTOP)
            taker.start()  # after the stop: every run it drives is one it took over
            every = wait_until(lambda: completed(nats_url, 12), "sup-b to complete every run")
            stalled.signal(signal.SIGCONT)
            moved = [run_id for run_id, records in every.items() if takeovers(records)]
            assert moved
            for run_id in moved:
                stalled.stderr.wait_for(f"lost run {run_id}", DEADLINE)
            after = journals(nats_url)
        finally:
            stalled.stop()
            taker.stop()
        lost = [line for line in stalled.lines().splitlines() if "lost run" in line]

    # sup-a's next appends were refused by the fence, and it said so, run by run.
    assert any("fenced out" in line for line in lost), lost
    assert {line.split("lost run ", 1)[1].split(":")[0] for line in lost} == set(moved)
    # The journals did not change after sup-a woke up: nothing of sup-a's went in.
    assert after == every
    check_journals(after, prompts, turns)
    for run_id in moved:
        assert takeovers(after[run_id]) == [("sup-a", "sup-b")]
        owners = owner_segments(after[run_id])[1][2]
        assert set(owners) <= {"sup-b"}


def test_any_supervisor_answers_an_approval_parked_at_another(
    tmp_path: Path, nats_url: str
) -> None:
    prompt = "gated"
    reply = Reply.tool_use("note", {"mark": "gated-0"}, id="toolu_gated_0")
    with FakeMessagesAPI(conversations={prompt: [reply, Reply.text("gated done")]}) as api:
        write_agent(tmp_path, api.base_url)
        agent = tmp_path / "agent.yaml"
        agent.write_text(
            agent.read_text().replace("note_tools:note'", "note_tools:note', tags: ['ai:confirm']")
        )
        owner = Member(tmp_path, "sup-a", nats_url).start()
        other = Member(tmp_path, "sup-b", nats_url)
        try:
            run_id = owner.submit(prompt)  # sup-b is not up: sup-a takes it
            refused, body = owner.api("POST", "/api/runs", {"prompt": "hi", "chat": True})
            assert refused == 409 and "without --nats" in body["error"]
            wait_until(lambda: owner.api("GET", "/api/approvals")[1]["approvals"],
                       "the run to park")  # fmt: skip
            other.start()
            pending = wait_until(lambda: other.api("GET", "/api/approvals")[1]["approvals"],
                                 "sup-b to list the approval")  # fmt: skip
            assert pending[0]["run_id"] == run_id and pending[0]["tool"] == "note"
            status, _ = other.api("POST", f"/api/runs/{run_id}/approvals/toolu_gated_0",
                                  {"answer": "once"})  # fmt: skip
            assert status == 200
            again, body = owner.api("POST", f"/api/runs/{run_id}/approvals/toolu_gated_0",
                                    {"answer": "deny"})  # fmt: skip
            assert again in (404, 409), body
            every = wait_until(lambda: completed(nats_url), "the run to complete")
            shown = wait_until(lambda: (r := other.api("GET", f"/api/runs/{run_id}")[1])
                               ["status"] == "completed" and r, "sup-b to show it")  # fmt: skip
        finally:
            owner.stop()
            other.stop()
    assert effects(tmp_path) == [("sup-a", "gated-0")]  # its owner ran it, once
    assert [r.seq for r in every[run_id]] == list(range(1, len(every[run_id]) + 1))
    assert shown["answer"] == "gated done"  # shown by sup-b, driven by sup-a


def test_a_parked_run_of_a_stopped_supervisor_is_resumed_by_the_one_that_answers(
    tmp_path: Path, nats_url: str
) -> None:
    prompt = "parked"
    reply = Reply.tool_use("note", {"mark": "parked-0"}, id="toolu_parked_0")
    with FakeMessagesAPI(conversations={prompt: [reply, Reply.text("parked done")]}) as api:
        write_agent(tmp_path, api.base_url)
        agent = tmp_path / "agent.yaml"
        agent.write_text(
            agent.read_text().replace("note_tools:note'", "note_tools:note', tags: ['ai:confirm']")
        )
        first = Member(tmp_path, "sup-a", nats_url).start()
        run_id = first.submit(prompt)
        wait_until(lambda: first.api("GET", "/api/approvals")[1]["approvals"], "the run to park")
        assert first.stop() == 0  # a clean shutdown: the parked run is held "parked"
        second = Member(tmp_path, "sup-b", nats_url).start()
        try:
            listed = second.api("GET", f"/api/runs/{run_id}")[1]
            assert listed["status"] == "parked" and listed["owner"] == ""
            status, body = second.api("POST", f"/api/runs/{run_id}/approvals/toolu_parked_0",
                                      {"answer": "once"})  # fmt: skip
            assert status == 200, body
            every = wait_until(lambda: completed(nats_url), "the run to complete")
        finally:
            second.stop()
    assert effects(tmp_path) == [("sup-b", "parked-0")]
    assert not takeovers(every[run_id])  # released cleanly: nobody was fenced out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nats", "http://x"], "--nats: must be a NATS URL"),
        (["--nats", "nats://127.0.0.1:1", "--heartbeat", "3", "--lease-ttl", "2"], "--heartbeat"),
        (["--nats", "nats://127.0.0.1:1", "--owner", "a b"], "--owner"),
        (["--nats", "nats://127.0.0.1:1", "--lease-ttl", "0"], "--lease-ttl"),
    ],
)
def test_bad_cluster_flags_are_refused_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    write_agent(tmp_path, "http://127.0.0.1:9")
    done = subprocess.run(
        [*CLI, "supervise", "-c", str(tmp_path / "agent.yaml"), "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_missing_session_stream_is_named(tmp_path: Path) -> None:
    with natskit.nats_server(tmp_path) as url:
        write_agent(tmp_path, "http://127.0.0.1:9")
        done = subprocess.run(
            [*CLI, "supervise", "-c", str(tmp_path / "agent.yaml"), "--listen", "127.0.0.1:0",
             "--nats", url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "FISK_SM_SESSIONS" in done.stderr and "init-stream" in done.stderr
    assert "Traceback" not in done.stderr

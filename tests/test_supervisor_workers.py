"""`fisk-sm supervise --workers 2` as a real process (the real SDK against the fake API, HTTP to
the control API): runs placed on both workers and listed as one, every action reaching the
worker that owns the run, one event stream, one supervisor per directory, and a worker killed
with SIGKILL in the middle of a tool whose runs finish on the other by the crash rules."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest
from ctlkit import CLI, DEADLINE, http, start_supervise, wait_until
from prockit import alive
from test_otel_cli import Receiver, agent, env_for, receiver  # noqa: F401 - a fixture
from test_supervise_loop import _env as loop_env
from test_supervise_loop import _script as loop_script
from test_supervise_loop import _supervise as supervise_loop
from workerkit import EventReader, Workers, effects, note_turns

from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor.host.eventloop import THRESHOLDS
from fisk_sm.supervisor.host.workers.front import Front, Settings
from fisk_sm.supervisor.host.workers.pool import RESPAWNS
from fisk_sm.supervisor.interface import SubmitRequest
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.testing.conversations import first_user_text, turn_of

SLOW = 30.0


def starts(path: Path) -> list[tuple[str, int]]:
    """(mark, pid) of every `start` line of the `note` tool."""
    return [(line[1], int(line[2])) for line in effects(path) if line[0] == "start"]


def test_runs_are_placed_on_both_workers_and_listed_as_one(tmp_path: Path) -> None:
    prompts = [f"p{i:02d}" for i in range(12)]
    with (
        FakeMessagesAPI(conversations={p: note_turns(p) for p in prompts}) as api,
        Workers(tmp_path, api) as sup,
    ):
        ids = [sup.submit(p, name=f"name-{p}") for p in prompts]
        runs = sup.wait_all(len(prompts))
        second = subprocess.run(
            sup.argv(), env=sup.env(), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
    assert sup.process is not None and sup.process.returncode == 0
    assert [r["run_id"] for r in runs] == ids[::-1]  # one listing, newest first
    assert [r["name"] for r in runs] == [f"name-{p}" for p in prompts[::-1]]
    assert [r["answer"] for r in runs] == [f"{p} done" for p in prompts[::-1]]
    ran = dict(starts(sup.effects))
    assert sorted(ran) == sorted(f"{p}-0" for p in prompts)
    assert set(ran.values()) == set(sup.pids.values())  # both workers drove runs
    assert len(set(sup.pids.values())) == 2
    # the front holds the directory: a second supervise of it is refused (exit 2)
    assert second.returncode == 2, second.stderr
    assert "another fisk-sm supervise" in second.stderr


def test_approve_say_end_suspend_abort_reach_the_owning_worker(tmp_path: Path) -> None:
    gated = {
        f"g{i}": [
            Reply.tool_use("deploy", {"target": f"g{i}"}, id=f"toolu_g{i}", delay=0.02),
            Reply.text(f"g{i} done", delay=0.02),
        ]
        for i in range(4)
    }
    slow = Reply.text("s0 done", delay=0.02)
    conversations: dict[str, Any] = {
        **gated,
        "s0": [(attrs.evolve(slow, delay=SLOW), slow)],  # the resumed call is answered at once
        "c0": [Reply.text("first", delay=0.02), Reply.text("second", delay=0.02)],
    }
    with FakeMessagesAPI(conversations=conversations) as api, Workers(tmp_path, api) as sup:
        ids = {p: sup.submit(p) for p in gated}
        for run_id in ids.values():
            sup.wait_status(run_id, "parked")
        status, body = sup.api("GET", "/api/approvals")
        assert status == 200
        assert sorted(a["run_id"] for a in body["approvals"]) == sorted(ids.values())
        for prompt, answer in (("g0", "once"), ("g1", "always"), ("g3", "deny")):
            status, _ = sup.api(
                "POST", f"/api/runs/{ids[prompt]}/approvals/toolu_{prompt}", {"answer": answer}
            )
            assert status == 200, prompt
        status, again = sup.api(
            "POST", f"/api/runs/{ids['g0']}/approvals/toolu_g0", {"answer": "deny"}
        )
        assert status in (404, 409), again  # answered once: it is the worker's desk that says
        status, _ = sup.api("POST", f"/api/runs/{ids['g2']}/abort")
        assert status == 202
        assert sup.wait_status(ids["g2"], "aborted")["status"] == "aborted"
        for prompt in ("g0", "g1", "g3"):
            assert sup.wait_status(ids[prompt], "completed")["answer"] == f"{prompt} done"

        s0 = sup.submit("s0")
        wait_until(lambda: any(first_user_text(r) == "s0" for r in api.requests), "s0's call")
        assert sup.api("POST", f"/api/runs/{s0}/suspend")[0] == 202
        sup.wait_status(s0, "suspended")
        assert sup.api("POST", f"/api/runs/{s0}/resume")[0] == 202
        assert sup.wait_status(s0, "completed")["answer"] == "s0 done"

        c0 = sup.submit("c0", chat=True)
        sup.wait_status(c0, "waiting")
        assert sup.api("POST", f"/api/runs/{c0}/say", {"text": "more"})[0] == 202
        wait_until(
            lambda: len([r for r in api.requests if first_user_text(r) == "c0"]) == 2,
            "the chat's second call",
        )
        wait_until(lambda: sup.run(c0)["state"] == "awaiting_input", "the chat to wait again")
        assert sup.api("POST", f"/api/runs/{c0}/end")[0] == 202
        assert sup.wait_status(c0, "completed")["answer"] == "second"
    assert sup.process is not None and sup.process.returncode == 0
    deployed = {line[1]: int(line[2]) for line in effects(sup.effects) if line[0] == "deploy"}
    assert sorted(deployed) == ["g0", "g1"]  # g3 denied, g2 aborted
    assert deployed["g0"] != deployed["g1"]  # the first two runs went to the two workers
    assert set(deployed.values()) == set(sup.pids.values())


def test_one_event_stream_with_increasing_ids(tmp_path: Path) -> None:
    prompts = [f"e{i}" for i in range(6)]
    with (
        FakeMessagesAPI(conversations={p: note_turns(p) for p in prompts}) as api,
        Workers(tmp_path, api) as sup,
    ):
        reader = EventReader(sup.url)
        ids = [sup.submit(p) for p in prompts]
        sup.wait_all(len(prompts))
        wait_until(
            lambda: (
                {d["run_id"] for d in reader.of("RunUpdated") if d["status"] == "completed"}
                >= set(ids)
            ),
            "every run's completion on the stream",
        )
    event_ids = [event_id for event_id, _, _ in reader.items]
    boots = {event_id.split("-")[0] for event_id in event_ids}
    seqs = [int(event_id.split("-")[1]) for event_id in event_ids]
    assert len(boots) == 1
    assert seqs == sorted(set(seqs))  # strictly increasing, one numbering for both workers
    assert sorted(d["run_id"] for d in reader.of("RunSubmitted")) == sorted(ids)
    entered = {d["run_id"] for d in reader.of("StateEntered")}
    assert entered == set(ids)  # every run's own events, from whichever worker
    assert {pid for _, pid in starts(sup.effects)} == set(sup.pids.values())


def test_a_replay_from_before_anyone_read_is_a_gap_not_a_wait(tmp_path: Path) -> None:
    """The workers send events up only once someone reads: a reader resuming from an id of
    before that is told to reload (EventsGap), where a lone supervisor replays its buffer."""
    from fisk_sm.client import Client
    from fisk_sm.client.records import EventsGap

    with (
        FakeMessagesAPI(conversations={"q0": note_turns("q0")}) as api,
        Workers(tmp_path, api) as sup,
    ):
        run_id = sup.submit("q0")
        sup.wait_all(1)
        with Client(sup.url) as client:
            stream = client.events(last_event_id="0-0")
            other_boot = next(stream)
            stream.close()
            assert isinstance(other_boot, EventsGap) and other_boot.id
            boot = other_boot.id.split("-")[0]
            stream = client.events(run=run_id, last_event_id=f"{boot}-0")
            first = next(stream)
            stream.close()
    assert isinstance(first, EventsGap), first
    assert first.reason == "events from before anyone read the stream were not kept: reload"


def test_a_worker_killed_mid_tool_has_its_runs_finished_by_the_other(tmp_path: Path) -> None:
    prompts = [f"k{i:02d}" for i in range(20)]
    with (
        FakeMessagesAPI(conversations={p: note_turns(p, turns=2) for p in prompts}) as api,
        Workers(tmp_path, api, sleep=0.3) as sup,
    ):
        reader = EventReader(sup.url)
        for prompt in prompts:
            sup.submit(prompt, name=f"name-{prompt}")
        victim = sup.pids[1]

        def open_on_victim() -> set[str] | None:
            lines = effects(sup.effects)
            ended = {line[1] for line in lines if line[0] == "end"}
            return {
                line[1]
                for line in lines
                if line[0] == "start" and int(line[2]) == victim and line[1] not in ended
            } or None

        wait_until(lambda: open_marks(sup.effects, victim), "a tool under way on worker 1")
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not alive(victim), "worker 1 to die")
        kill = len(effects(sup.effects))  # where the kill is in the effects file
        sup.stderr.wait_for(f"worker 1 (pid {victim}) died", DEADLINE)
        runs = sup.wait_all(len(prompts))
    assert sup.process is not None and sup.process.returncode == 0
    assert sorted(r["name"] for r in runs) == sorted(f"name-{p}" for p in prompts)
    assert sorted(r["answer"] for r in runs) == sorted(f"{p} done" for p in prompts)
    assert_one_repeat_per_killed_run(sup.effects, [kill], prompts)
    after = {int(line[2]) for line in effects(sup.effects)[kill:] if line[0] == "start"}
    assert after == {sup.pids[0]}  # the dead worker's runs went on on the other one
    event_ids = [int(event_id.split("-")[1]) for event_id, _, _ in reader.items]
    assert event_ids == sorted(set(event_ids))  # one numbering across the worker's death
    assert not reader.of("EventsGap")


async def test_no_event_frame_crosses_while_nobody_watches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    prompts = [f"w{i}" for i in range(6)]
    with FakeMessagesAPI(conversations={p: note_turns(p) for p in prompts}) as api:
        sup = Workers(tmp_path, api)  # its files only: the front runs here, the workers below
        config = load_config(sup.agent)
        front = Front(Settings(config, FileStore(sup.state), workers=2, concurrency=8))
        await front.start()

        async def done(count: int) -> None:
            while [r.status for r in await front.listing()].count("completed") < count:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # polling the listing, as a client does

        def events() -> int:
            return sum(w.channel.received.get("Events", 0) for w in front.workers.values())

        try:
            for prompt in prompts[:3]:
                await front.submit(SubmitRequest(prompt))
            await asyncio.wait_for(done(3), DEADLINE)
            assert events() == 0  # nobody subscribed: not one event crossed a pipe
            reader = front.events.subscribe()
            ids = [(await front.submit(SubmitRequest(p))).run_id for p in prompts[3:]]
            await asyncio.wait_for(done(6), DEADLINE)
            assert events() > 0
        finally:
            summary = await front.shutdown()
    assert summary.marked == ()
    got = []
    async for _, name, text in reader.events():  # what it got until the hub closed
        got.append((name, json.loads(text).get("run_id")))
    assert {run_id for name, run_id in got if name == "RunSubmitted"} == set(ids)


KILLED = 300


@pytest.mark.slow
def test_300_runs_on_two_workers_survive_a_worker_kill_and_a_supervisor_kill(
    tmp_path: Path,
) -> None:
    # the last runs' tools take 2 s: the front is killed while one is under way, however fast
    # or slow the machine ran the first half
    prompts = [f"kill-{i}" for i in range(KILLED - 16)] + [f"kill-slow-{i}" for i in range(16)]
    with FakeMessagesAPI(conversations={p: note_turns(p, turns=2) for p in prompts}) as api:
        sup = Workers(tmp_path, api, sleep=0.2, concurrency=16).start()
        try:
            reader = EventReader(sup.url)
            pool = ThreadPoolExecutor(8)  # submitting while the worker dies: some are resent
            submitted = pool.map(lambda p: sup.submit(p, name=f"name-{p}"), prompts)
            victim = sup.pids[1]
            wait_until(lambda: open_marks(sup.effects, victim), "a tool under way on worker 1")
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: not alive(victim), "worker 1 to die")
            kills = [len(effects(sup.effects))]  # where each kill is in the effects file
            sup.stderr.wait_for(f"worker 1 (pid {victim}) died", DEADLINE)
            assert len(set(submitted)) == KILLED
            pool.shutdown()
            seen: list[object] = []

            def half_done_and_a_tool_open() -> set[str] | None:
                statuses = collections.Counter(r["status"] for r in sup.runs())
                seen[:] = [dict(statuses), sup.stderr._lines[-4:]]
                if statuses["completed"] >= KILLED // 2:
                    return open_marks(sup.effects) or None
                return None

            try:
                wait_until(half_done_and_a_tool_open, "half the runs completed, a tool under way")
            except AssertionError:
                raise AssertionError(f"runs and stderr when it gave up: {seen}") from None
            assert sup.process is not None
            workers = [sup.worker_pid(0), sup.worker_pid(1, besides=frozenset({victim}))]
            sup.process.kill()  # the whole supervisor, mid-run: its workers die with it
            sup.process.wait()
            wait_until(lambda: not any(alive(pid) for pid in workers), "the workers to die")
            kills.append(len(effects(sup.effects)))
        finally:
            sup.stop()
        event_ids = [int(event_id.split("-")[1]) for event_id, _, _ in reader.items]
        again = Workers(tmp_path, api, sleep=0.2, concurrency=16).start()
        try:
            runs = again.wait_all(KILLED)
        finally:
            assert again.stop() == 0
    assert sorted(r["name"] for r in runs) == sorted(f"name-{p}" for p in prompts)
    assert sorted(r["answer"] for r in runs) == sorted(f"{p} done" for p in prompts)
    assert_one_repeat_per_killed_run(sup.effects, kills, prompts)
    assert event_ids == sorted(set(event_ids))  # across the worker's death: one numbering
    assert not reader.of("EventsGap")


def assert_one_repeat_per_killed_run(path: Path, kills: list[int], prompts: list[str]) -> None:
    """Every tool ran, at most twice; a repeat's first run started before a kill and its second
    after it (the tool was in flight as the journal says: started, its result not journaled);
    and each run repeated at most one tool per kill."""
    lines = [(i, line[1]) for i, line in enumerate(effects(path)) if line[0] == "start"]
    runs: dict[str, list[int]] = collections.defaultdict(list)
    for i, mark in lines:
        runs[mark].append(i)
    assert set(runs) == {f"{p}-{k}" for p in prompts for k in (0, 1)}
    assert all(len(at) <= 2 for at in runs.values()), runs
    per_kill: collections.Counter[tuple[str, int]] = collections.Counter()
    for mark, at in runs.items():
        if len(at) == 2:
            kill = next((k for k, where in enumerate(kills) if at[0] < where <= at[1]), None)
            assert kill is not None, (mark, at, kills)  # no repeat without a kill between
            per_kill[mark.rsplit("-", 1)[0], kill] += 1
    assert all(n == 1 for n in per_kill.values()), per_kill


def open_marks(path: Path, pid: int | None = None) -> set[str]:
    """The marks whose `note` started (on `pid`, if given) and has not ended."""
    lines = effects(path)
    ended = {line[1] for line in lines if line[0] == "end"}
    return {
        line[1]
        for line in lines
        if line[0] == "start" and line[1] not in ended and pid in (None, int(line[2]))
    }


def test_sigterm_suspends_the_runs_of_every_worker_and_a_restart_completes_them(
    tmp_path: Path,
) -> None:
    prompts = [f"t{i:02d}" for i in range(40)]
    final = {p: Reply.text(f"{p} done", delay=0.02) for p in prompts}
    conversations: dict[str, Any] = {
        p: [note_turns(p)[0], (attrs.evolve(final[p], delay=SLOW), final[p])] for p in prompts
    }
    with FakeMessagesAPI(conversations=conversations) as api:
        sup = Workers(tmp_path, api, concurrency=80).start()
        for prompt in prompts:
            sup.submit(prompt)
        wait_until(
            lambda: sum(turn_of(r) == 1 for r in api.requests) >= len(prompts),
            "every run's second call (each now waits SLOW s)",
        )
        assert sup.process is not None
        sup.process.send_signal(signal.SIGTERM)
        assert sup.process.wait(SLOW - 5) == 0  # never waits out a reply
        stopped = sup.stderr.wait_for("stopped;", DEADLINE)
        assert f"stopped; {len(prompts)} run(s) will resume on the next start" in stopped
        again = Workers(tmp_path, api).start()
        try:
            again.stderr.wait_for(f"resumed {len(prompts)} run(s)", DEADLINE)
            runs = again.wait_all(len(prompts))
        finally:
            assert again.stop() == 0
    assert sorted(r["answer"] for r in runs) == sorted(f"{p} done" for p in prompts)
    marks = collections.Counter(mark for mark, _ in starts(sup.effects))
    assert marks == {f"{p}-0": 1 for p in prompts}  # a shutdown repeats no tool


def test_a_worker_dying_too_often_stays_dead_and_with_none_left_the_front_exits_1(
    tmp_path: Path,
) -> None:
    with FakeMessagesAPI(conversations={"x": note_turns("x")}) as api:
        sup = Workers(tmp_path, api).start()
        try:
            for index in (0, 1):
                dead: set[int] = set()
                for _ in range(RESPAWNS + 1):  # the first start, then RESPAWNS restarts
                    pid = sup.worker_pid(index, besides=frozenset(dead))
                    os.kill(pid, signal.SIGKILL)
                    dead.add(pid)
                    sup.stderr.wait_for(f"worker {index} (pid {pid}) died", DEADLINE)
                sup.stderr.wait_for(f"worker {index} died too often", DEADLINE)
                if index == 0:  # the other one still serves
                    sup.submit("x")
                    assert sup.wait_all(1)[0]["answer"] == "x done"
            assert sup.process is not None
            assert sup.process.wait(DEADLINE) == 1
        finally:
            sup.stop()
    sup.stderr.wait_for("no worker is left", DEADLINE)


def test_a_worker_killed_while_a_run_is_parked_keeps_it_parked_and_an_answer_completes_it(
    tmp_path: Path,
) -> None:
    gated = {
        f"g{i}": [
            Reply.tool_use("deploy", {"target": f"g{i}"}, id=f"toolu_g{i}", delay=0.02),
            Reply.text(f"g{i} done", delay=0.02),
        ]
        for i in range(2)
    }
    with FakeMessagesAPI(conversations=gated) as api, Workers(tmp_path, api) as sup:
        ids = [sup.submit(p) for p in gated]  # g0 on worker 0, g1 on worker 1
        for run_id in ids:
            sup.wait_status(run_id, "parked")
        victim = sup.pids[1]
        os.kill(victim, signal.SIGKILL)
        sup.stderr.wait_for(f"worker 1 (pid {victim}) died", DEADLINE)
        assert [r["status"] for r in sup.runs()] == ["parked", "parked"]
        status, body = sup.api("GET", "/api/approvals")
        assert sorted(a["tool_use_id"] for a in body["approvals"]) == ["toolu_g0", "toolu_g1"]
        status, _ = sup.api("POST", f"/api/runs/{ids[1]}/approvals/toolu_g1", {"answer": "once"})
        assert status == 200
        assert sup.wait_status(ids[1], "completed")["answer"] == "g1 done"
    deployed = [line for line in effects(sup.effects) if line[0] == "deploy"]
    assert deployed == [["deploy", "g1", str(sup.pids[0])]]  # once, on the other worker


def test_with_otel_each_worker_exports_its_runs_span_trees(
    api: FakeMessagesAPI,
    receiver: Receiver,  # noqa: F811 - test_otel_cli's fixture
    tmp_path: Path,
) -> None:
    jobs = ("first job", "second job")
    for job in jobs:
        api.add_conversation(job, Reply.tool_use("show", {"text": job}), Reply.text(f"{job} done"))
    argv = [*CLI, "supervise", "-c", str(agent(tmp_path)), "--listen", "127.0.0.1:0"]
    argv += ["--otel", "--workers", "2", "--state-dir", str(tmp_path / "state")]
    process, _, url = start_supervise(argv, env_for(api, receiver), tmp_path)
    try:
        ids = [http("POST", url + "/api/runs", {"prompt": p})[1]["run_id"] for p in jobs]
        wait_until(
            lambda: all(
                http("GET", f"{url}/api/runs/{r}")[1]["status"] == "completed" for r in ids
            ),
            "both runs to complete",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0
    roots = {
        s["attributes"]["gen_ai.conversation.id"].string_value
        for s in receiver.spans()
        if s["name"] == "invoke_agent teller"
    }
    assert roots == set(ids)  # exported by the two workers before they exited


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_the_workers_drive_their_runs_on_the_supervisors_loop_settled(
    tmp_path: Path, loop: str
) -> None:
    module = "uvloop" if loop == "uvloop" else "asyncio.unix_events"
    with FakeMessagesAPI(loop_script()) as api:
        found = supervise_loop(tmp_path, api, "--workers", "2", "--loop", loop, env=loop_env())
    assert found == f"{module} {THRESHOLDS} True"  # a tool's view from inside a worker

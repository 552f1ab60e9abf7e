"""Pay only for what is watched: the supervisor's events are built and encoded only when someone
may read them, each at most once, and what a reader that left can still resume to is kept as
it was when it happened (real supervisor, real SDK against the fake API, real journals).

The encoders are counted by wrappers this test puts in place of the hub's `encode` (an event's
JSON text), of `event_json` (a typed event's object) and of `Tracked.row` (a run's row, what
`RunSubmitted`/`RunUpdated`/`RunParked` and every listing show).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from fisk_sm import parse_config
from fisk_sm.events.types import MessageReceived, StateEntered
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.supervisor import Supervisor, Tracked
from fisk_sm.supervisor.api import build_app
from fisk_sm.supervisor.view import hub
from fisk_sm.supervisor.view.hub import EventHub, Item, Subscriber
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import tool

RUNS = 3


@tool
async def look(what: str) -> str:
    """Look at something."""
    return f"looked at {what}"


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    looks = [Reply.tool_use("look", {"what": str(n)}) for n in range(3)]
    with FakeMessagesAPI(conversations={"look": [*looks, Reply.text("seen")]}) as fake:
        yield fake


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each encoder ran (wrappers around the real ones)."""
    counted: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            counted[name] += 1
            return real(*args)

        return wrapper

    monkeypatch.setattr(hub, "encode", counting("encode", hub.encode))
    monkeypatch.setattr(hub, "event_json", counting("event_json", hub.event_json))
    monkeypatch.setattr(Tracked, "row", counting("row", Tracked.row))
    return counted


def supervisor(tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    llm = {"model": "m", "base_url": api.base_url, "no_prompt_cache": True}
    config = parse_config({"llm": llm}, env={})
    return Supervisor(config, FileStore(tmp_path / "state"), options=RunOptions(tools=[look]))


async def run_all(sup: Supervisor, runs: int = RUNS) -> list[Tracked]:
    """Submit `runs` runs and wait for them all to end."""
    submitted = [await sup.submit("look", name=f"r{n}") for n in range(runs)]
    await asyncio.gather(*(t.task for t in submitted if t.task is not None))
    assert [t.status for t in submitted] == ["completed"] * runs
    return submitted


async def drain(subscriber: Subscriber) -> list[Item]:
    """What a subscriber got, to the end of its stream (the hub closed)."""
    return [item async for item in subscriber.items()]


ROWS = ("RunSubmitted", "RunUpdated", "RunParked")


async def listing(sup: Supervisor) -> list[dict[str, Any]]:
    """`GET /api/runs` of the supervisor's control API."""
    transport = httpx2.ASGITransport(app=build_app(sup))
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8") as client:
        runs: list[dict[str, Any]] = (await client.get("/api/runs")).json()["runs"]
    return runs


def assert_rows_as_they_were(items: list[Item]) -> None:
    """Each run's row in the stream shows the state its run had just entered."""
    entered: dict[str, str] = {}
    for _, name, data in items:
        shown = json.loads(data)
        if name == "StateEntered":
            entered[shown["run_id"]] = shown["state"]
        elif name == "RunUpdated" and shown["status"] != "completed":
            assert shown["state"] == entered[shown["run_id"]], items
        elif name == "RunUpdated":  # the end of its task: the journal's last word
            assert shown["state"] == entered[shown["run_id"]] == "completed"


async def test_with_nobody_subscribed_events_are_held_not_encoded(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    sup = supervisor(tmp_path, api, monkeypatch)
    await sup.start()
    await run_all(sup)
    held = sup.hub.seq
    assert held > 20 * RUNS and len(sup.hub.held) == held  # every event numbered and held ...
    assert calls["encode"] == calls["event_json"] == 0  # ... with no JSON built for any
    rows = calls["row"]  # a row is taken for each of the runs' RunSubmitted/RunUpdated
    shown = await listing(sup)  # the listing builds each row when it is read
    assert {r["status"] for r in shown} == {"completed"} and len(shown) == RUNS
    assert calls["row"] == rows + RUNS and calls["encode"] == 0
    late = sup.hub.subscribe(after=sup.hub.event_id(0))  # a reader replaying from the first
    assert [seq for seq, _, _ in late.replay] == list(range(1, held + 1))
    assert calls["encode"] == held  # each encoded once, as the replay asked for it
    assert calls["row"] == rows + RUNS  # the rows as they were taken, not taken again
    assert Counter(name for _, name, _ in late.replay)["RunUpdated"] == rows - RUNS
    assert_rows_as_they_were(late.replay)
    await sup.shutdown()


async def test_with_no_buffer_and_nobody_subscribed_nothing_is_done_per_state(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    sup = supervisor(tmp_path, api, monkeypatch)
    sup.hub.resize(0)  # `supervise --event-buffer 0`
    await sup.start()
    runs = await run_all(sup)
    assert calls == Counter()  # not one row, event object or JSON text for ~70 states
    assert sup.hub.seq == 0 and not sup.hub.held
    assert runs[0].sink.wants(StateEntered) and not runs[0].sink.wants(MessageReceived)
    path = ["suspend_check", "call", "journal", "decide", "budget_check", "gate"]
    assert [t.sink.states[:6] for t in runs] == [path] * RUNS  # the path is still noted
    assert all(t.sink.states[-1] == "completed" for t in runs)
    shown = await listing(sup)  # the listing builds each row when it is read, once
    assert sorted(r["name"] for r in shown) == ["r0", "r1", "r2"]
    assert {(r["status"], r["answer"]) for r in shown} == {("completed", "seen")}
    assert calls == Counter(row=RUNS)
    await sup.shutdown()


async def test_two_subscribers_get_each_event_encoded_once(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    sup = supervisor(tmp_path, api, monkeypatch)
    await sup.start()
    first, second = sup.hub.subscribe(), sup.hub.subscribe()
    await run_all(sup)
    await sup.shutdown()  # closes the hub: the streams end
    got, other = await drain(first), await drain(second)
    assert [seq for seq, _, _ in got] == list(range(1, sup.hub.seq + 1))  # all, in order
    assert other == got and all(a[2] is b[2] for a, b in zip(got, other, strict=True))
    assert calls["encode"] == len(got)  # each event once, whatever the subscribers
    names = Counter(name for _, name, _ in got)
    assert calls["event_json"] == len(got) - names["RunSubmitted"] - names["RunUpdated"]
    assert calls["row"] == names["RunSubmitted"] + names["RunUpdated"]
    assert names["RunSubmitted"] == RUNS and names["StateEntered"] == names["RunUpdated"] - RUNS
    assert names["MessageReceived"] == 4 * RUNS  # built for the stream, now that it is read
    assert_rows_as_they_were(got)


async def test_a_reader_of_one_run_costs_nothing_for_the_others(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    sup = supervisor(tmp_path, api, monkeypatch)
    await sup.start()
    sup.hub.resize(0)  # nothing held for a resume: only the reader's run is paid for
    watched = await sup.submit("look", name="watched")
    reader = sup.hub.subscribe(watched.entry.run_id)
    await run_all(sup, 2)
    assert watched.task is not None
    await watched.task
    await sup.shutdown()
    got = await drain(reader)
    assert {json.loads(data)["run_id"] for _, _, data in got} == {watched.entry.run_id}
    assert calls["encode"] == len(got) and got[-1][1] == "RunUpdated"
    assert json.loads(got[-1][2])["status"] == "completed"
    rows = sum(name in ROWS for _, name, _ in got)
    assert calls["row"] == rows and calls["event_json"] == len(got) - rows  # its own only


async def test_a_reader_that_comes_back_gets_what_it_missed_as_it_was(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    sup = supervisor(tmp_path, api, monkeypatch)
    await sup.start()
    gone = sup.hub.subscribe()
    tracked = await sup.submit("look", name="missed")
    sup.hub.unsubscribe(gone)  # it read up to RunSubmitted, then its connection dropped
    *_, (last, name, _) = await drain_queued(gone)
    assert name == "RunSubmitted"
    encoded = calls["encode"]
    assert tracked.task is not None
    await tracked.task
    assert calls["encode"] == encoded  # held for a resume, not encoded while nobody reads
    back = sup.hub.subscribe(after=sup.hub.event_id(last))
    replay = back.replay
    assert [seq for seq, _, _ in replay] == list(range(last + 1, sup.hub.seq + 1))
    assert calls["encode"] == sup.hub.seq  # every event encoded once, the missed on demand
    assert_rows_as_they_were(replay)
    assert json.loads(replay[-1][2])["status"] == "completed"
    again = sup.hub.subscribe(after=sup.hub.event_id(last)).replay
    assert again == replay and calls["encode"] == sup.hub.seq  # a second resume: no new text
    await sup.shutdown()


async def drain_queued(subscriber: Subscriber) -> list[Item]:
    """What is queued for a subscriber that left."""
    queued = []
    while not subscriber.queue.empty():
        item = subscriber.queue.get_nowait()
        assert item is not None
        queued.append(item)
    return queued


async def test_an_event_given_as_json_text_is_sent_as_is(calls: Counter[str]) -> None:
    """A worker process encodes its events; the front's hub hands the text on untouched, with
    its own id, to a reader and to a resume alike (and encodes nothing itself)."""
    hub = EventHub()
    reader = hub.subscribe()
    text = '{"type": "StateEntered", "run_id": "r1", "state": "call"}'
    hub.publish("StateEntered", "r1", text)
    hub.close()
    got = await drain(reader)
    assert got == [(1, "StateEntered", text)]
    assert hub.subscribe(after=hub.event_id(0)).replay == got
    assert calls["encode"] == 0

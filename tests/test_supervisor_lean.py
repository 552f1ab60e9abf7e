"""What the host does per state while nobody watches: a free slot is taken without tasks, and a
run is stepped without the `Step` report nobody reads (real SDK against the fake API, real
journals)."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from pathlib import Path

import pytest
from conftest import make_config

from fisk_sm.journal.filestore import FileStore
from fisk_sm.machine.evaluator import LoopMachine, Step
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.host.slots import Slots
from fisk_sm.testing import FakeMessagesAPI, Reply


async def test_a_free_slot_is_taken_at_once_and_a_stop_still_ends_a_wait() -> None:
    slots, stopping = Slots(1), asyncio.Event()
    taking = slots.acquire(stopping)
    with pytest.raises(StopIteration) as taken:
        taking.send(None)  # done without once giving the loop a turn: no task, no wait
    assert taken.value.value is True
    waiting = asyncio.ensure_future(slots.acquire(stopping))  # none is free now
    await asyncio.sleep(0)
    assert not waiting.done()
    stopping.set()
    assert await waiting is False  # a suspend-now ends the wait, without a slot
    slots.release()
    assert await slots.acquire(asyncio.Event()) is True  # the slot was given back


async def test_the_host_steps_its_runs_without_building_a_step(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unread(*_: object) -> Step:
        raise AssertionError("a Step was built for the host")

    monkeypatch.setattr(LoopMachine, "describe", unread)
    os.environ.setdefault("ANTHROPIC_API_KEY", "test")
    api.add(Reply.text("done"))
    sup = Supervisor(make_config(api), FileStore(tmp_path / "state"))
    await sup.start()
    try:
        tracked = await sup.submit("do it")
        assert tracked.task is not None
        await tracked.task
        assert (tracked.status, tracked.error) == ("completed", None)
        assert tracked.row().answer == "done"
        assert sup.store.snapshot(tracked.entry.run_id).status == "completed"
    finally:
        await sup.shutdown()


async def test_a_run_that_ended_is_let_go_and_its_row_stays_the_same(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    os.environ.setdefault("ANTHROPIC_API_KEY", "test")
    api.add(Reply.tool_use("look", {"what": "x"}, id="toolu_a"), Reply.text("done"))  # no such tool
    sup = Supervisor(make_config(api), FileStore(tmp_path / "state"))
    await sup.start()
    try:
        tracked = await sup.submit("do it")
        assert tracked.run is not None and tracked.task is not None
        run = weakref.ref(tracked.run)
        await tracked.task
        live_row = tracked.row()  # the task is done: the row is the journal's fold already
        await asyncio.sleep(0)  # the task's done callbacks
        gc.collect()
        assert tracked.run is None and run() is None  # nothing of the host holds it
        row = tracked.row()
        assert row._replace(at=0) == live_row._replace(at=0)
        assert (row.status, row.answer, row.iteration) == ("completed", "done", 2)
        assert [m.role for m in tracked.messages()] == ["user", "assistant", "user", "assistant"]
    finally:
        await sup.shutdown()

"""A submit's two durable records, its registry line and its session, made at once
(`fisk_sm.supervisor.host.starting`), and what either one failing leaves behind; and a resume
in the gap between a run's journaled end and the end of the task that drove it
(`Tracked.driven`). The real SDK against the fake API, real journals and a real runs.jsonl.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from test_supervisor import agent, supervised, until

from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.run import Run
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.host.registry import Registry
from fisk_sm.supervisor.view.entry import RegistryEntry
from fisk_sm.supervisor.view.tracked import Tracked
from fisk_sm.testing import FakeMessagesAPI, Reply

#: How long a step that must not hang may take before the test fails instead of hanging.
SAFETY = 10.0


def lines_of(tmp_path: Path, run_id: str) -> list[str]:
    """The events runs.jsonl holds for `run_id`, in order."""
    raw = (tmp_path / "state" / "supervisor" / "runs.jsonl").read_text().splitlines()
    return [line["event"] for line in map(json.loads, raw) if line["run_id"] == run_id]


class AfterTheJournal(Registry):
    """The real registry, whose `submitted` writes its line only once the run's journal
    exists: a submit that made its session only after its registry line never ends."""

    def __init__(self, directory: Path, store: FileStore) -> None:
        super().__init__(directory)
        self.store = store

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry:
        await until(self.store.path(run_id).exists, "the run's journal")
        return await super().submitted(run_id, name, config)


class FailingDisk(Registry):
    """The real registry, whose disk fails for the `submitted` line of run `failing`."""

    def __init__(self, directory: Path, failing: str) -> None:
        super().__init__(directory)
        self.failing = failing

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry:
        if run_id == self.failing:
            raise OSError(errno.EIO, "Input/output error (a failing disk)")
        return await super().submitted(run_id, name, config)


async def test_the_registry_line_and_the_session_are_made_at_once(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "state")
    registry = AfterTheJournal(store.directory / "supervisor", store)
    with FakeMessagesAPI(conversations={"hello": [Reply.text("hi")]}) as api:

        async def body(sup: Supervisor) -> None:
            # the registry waits for the journal: made one after the other, never answered
            tracked = await asyncio.wait_for(sup.submit("hello", run_id="r-1"), SAFETY)
            await until(lambda: tracked.status == "completed", "the run to complete")
            assert tracked.row().answer == "hi"

        await supervised(tmp_path, api, body, registry=registry)
    assert lines_of(tmp_path, "r-1")[0] == "submitted"
    assert len(api.requests) == 1


async def test_a_run_whose_registry_line_fails_does_not_go_on(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "state")
    registry = FailingDisk(store.directory / "supervisor", "r-disk")
    conversations = {"doomed": [Reply.text("never")], "next": [Reply.text("ok")]}
    with FakeMessagesAPI(conversations=conversations) as api:

        async def body(sup: Supervisor) -> None:
            with pytest.raises(OSError, match="a failing disk"):
                await sup.submit("doomed", run_id="r-disk")
            assert "r-disk" not in sup.runs
            assert sup.listing() == []
            # its session was made meanwhile and is let go: its journal stays, unlisted
            assert not store.lock_held("r-disk")
            with store.open("r-disk") as journal:
                assert journal.last_seq == 1
            # a later run starts and ends; the failed one never asked the model anything
            other = await sup.submit("next")
            await until(lambda: other.status == "completed", "the next run to complete")
            assert [t.entry.run_id for t in sup.listing()] == [other.entry.run_id]

        await supervised(tmp_path, api, body, registry=registry)
    assert api.requests_for("doomed") == []
    assert len(api.requests) == 1


async def test_a_run_whose_session_fails_is_marked_aborted(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "state")
    store.ensure_directory()
    store.lock_path("r-planted").mkdir()  # the session's lock cannot be taken: a JournalError
    with FakeMessagesAPI(conversations={"planted": [Reply.text("never")]}) as api:

        async def body(sup: Supervisor) -> None:
            with pytest.raises(JournalError, match=r"r-planted\.lock"):
                await sup.submit("planted", run_id="r-planted")
            assert "r-planted" not in sup.runs

        await supervised(tmp_path, api, body)
    assert lines_of(tmp_path, "r-planted") == ["submitted", "aborted"]
    assert not store.path("r-planted").exists()
    assert api.requests == []


class HeldHost(Supervisor):
    """A host whose first driving task to end is held in its last step (`_stopped`, after the
    run's end is journaled and its journal closed) until the test releases it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def _stopped(self, tracked: Tracked, run: Run) -> None:
        self.entered.set()
        await self.release.wait()
        await super()._stopped(tracked, run)


async def test_resume_waits_for_the_task_of_a_run_whose_end_is_journaled(
    tmp_path: Path,
) -> None:
    attempts = (Reply.text("late", delay=60.0), Reply.text("slow done"))  # the first is cut
    with FakeMessagesAPI(conversations={"slow": [attempts]}) as api:
        sup = HeldHost(agent(tmp_path, api), FileStore(tmp_path / "state"))
        await sup.start()
        try:
            tracked = await sup.submit("slow", run_id="r-held")
            await until(lambda: len(api.requests) == 1, "the model call")
            await sup.suspend("r-held")
            await asyncio.wait_for(sup.entered.wait(), SAFETY)
            assert tracked.live and tracked.status == "suspended"  # ended, its task not
            # the resume's first step: the old code answers Conflict in it, at once; the new
            # one waits there for the held task (a lone host's refresh never suspends)
            resume = sup.resume("r-held")
            resuming = asyncio.ensure_future(resume)
            await until(
                lambda: inspect.getcoroutinestate(resume) != inspect.CORO_CREATED,
                "the resume to begin",
            )
            sup.release.set()
            resumed = await asyncio.wait_for(resuming, SAFETY)  # not Conflict 'already running'
            await until(lambda: resumed.status == "completed", "the resumed run to complete")
            assert resumed.row().answer == "slow done"
        finally:
            sup.release.set()
            await sup.shutdown()
    assert lines_of(tmp_path, "r-held") == ["submitted", "operator_suspended", "resumed"]
    assert len(api.requests) == 2

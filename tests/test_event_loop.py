"""Many runs on one event loop: nothing blocks the loop (DESIGN, "Many runs on one loop").

No wall-clock thresholds: each test runs many runs at once and checks where the blocking work
happened. Every fsync, every store open and create, every JSON Lines write and every SDK client
build must happen on some other thread than the loop's; and each journal record must be durable
(its fsync returned) before the run moves on.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config

from fisk_sm import AgentConfig, JsonLinesEvents, Recorder, Run, Tool, tool
from fisk_sm.events import Fanout, WarningRaised
from fisk_sm.journal.aiosync import LoopSync
from fisk_sm.journal.decode import decode
from fisk_sm.journal.filestore import FileJournal, FileStore
from fisk_sm.journal.records import Assistant, ToolStarted
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model import clients
from fisk_sm.model.anthropic import AnthropicModel
from fisk_sm.testing import FakeMessagesAPI, Reply

RUNS = 20
CALLS = 2
KERNEL = -1  # the "thread" of an fsync the kernel did for a lone run (`LoopSync`)


class FsyncSpy:
    """Wraps os.fsync and the kernel's fsync of a lone run (`LoopSync.fsync`): records the
    calling thread (KERNEL for the latter) and, once the real fsync has returned, the
    file's size, i.e. how much of it is durable. Each fsync is slowed down, so that a run that
    moved on before its fsync returned would be caught reading a file not yet durable."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[int] = []
        self.durable: dict[int, int] = {}  # inode -> bytes known durable
        self._lock = threading.Lock()
        real = os.fsync

        def fsync(fd: int) -> None:
            time.sleep(0.005)
            real(fd)
            info = os.fstat(fd)
            with self._lock:
                self.threads.append(threading.get_ident())
                self.durable[info.st_ino] = max(self.durable.get(info.st_ino, 0), info.st_size)

        monkeypatch.setattr(os, "fsync", fsync)
        kernel_fsync = LoopSync.fsync

        def direct(sync: LoopSync, fd: int) -> asyncio.Future[None]:
            """A lone run's fsync, by the kernel (no thread: recorded as KERNEL), slowed down
            as the others are: its future resolves 5 ms after the kernel's."""
            size, loop = os.fstat(fd), asyncio.get_running_loop()
            slowed: asyncio.Future[None] = loop.create_future()

            def done(real: asyncio.Future[None]) -> None:
                if real.exception() is not None:
                    slowed.set_exception(real.exception())  # type: ignore[arg-type]
                    return
                with self._lock:
                    self.threads.append(KERNEL)
                    known = self.durable.get(size.st_ino, 0)
                    self.durable[size.st_ino] = max(known, size.st_size)
                slowed.set_result(None)

            real = kernel_fsync(sync, fd)
            real.add_done_callback(lambda f: loop.call_later(0.005, done, f))
            return slowed

        monkeypatch.setattr(LoopSync, "fsync", direct)

    def durable_bytes(self, path: Path) -> int:
        with self._lock:
            return self.durable.get(path.stat().st_ino, 0)


def assistant_end(path: Path) -> int:
    """The byte offset where the journal's last assistant record ends."""
    end = offset = 0
    for line in path.read_bytes().splitlines(keepends=True):
        offset += len(line)
        if isinstance(decode(line), Assistant):
            end = offset
    return end


def probe_for(path: Path, spy: FsyncSpy, seen: list[tuple[int, int]]) -> Tool:
    """A run's tool: when it runs, the assistant turn that called it must be durable."""

    @tool(name="probe")
    async def probe(n: int) -> str:
        """Check the journal."""
        seen.append((assistant_end(path), spy.durable_bytes(path)))
        return "ok"

    return probe


def tool_calls(api: FakeMessagesAPI, runs: int) -> None:
    # Every reply calls the probe; the iteration cap ends each run after CALLS calls, so the
    # replies fit any interleaving of the runs.
    api.add(*(Reply.tool_use("probe", {"n": i}) for i in range(runs * CALLS)))


def capped(api: FakeMessagesAPI) -> AgentConfig:
    return make_config(api, max_iterations=CALLS)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> FsyncSpy:
    return FsyncSpy(monkeypatch)


async def test_runs_fsync_off_the_loop_and_move_on_only_once_durable(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    loop_thread = threading.get_ident()
    store, config = FileStore(tmp_path), capped(api)
    tool_calls(api, RUNS)
    seen: list[tuple[int, int]] = []
    runs = [
        await start_session(
            config, "go", store, RunOptions(tools=[probe_for(store.path(f"r{i}"), spy, seen)]),
            run_id=f"r{i}",
        )
        for i in range(RUNS)
    ]  # fmt: skip
    states = await asyncio.gather(*(run.run() for run in runs))
    assert states == ["iterations_exhausted"] * RUNS
    assert len(seen) == RUNS * CALLS
    # When each tool ran, the turn that called it (and so every record before it) was durable.
    assert all(0 < end <= durable for end, durable in seen), seen
    for run in runs:  # and the terminal record too, once run() returned
        path = run.harness.journal.path  # type: ignore[attr-defined]
        assert spy.durable_bytes(path) == path.stat().st_size
        await run.aclose()
    assert spy.threads and loop_thread not in spy.threads


async def test_a_retry_tools_intent_shares_the_fsync_of_its_result(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    store, config = FileStore(tmp_path), capped(api)
    tool_calls(api, 1)
    seen: list[tuple[int, int]] = []
    run = await start_session(
        config, "go", store, RunOptions(tools=[probe_for(store.path("one"), spy, seen)]),
        run_id="one",
    )  # fmt: skip
    async with run:
        assert await run.run() == "iterations_exhausted"
    # meta + its directory, then per iteration the assistant turn and the tool result (the
    # intent record rides on the result's fsync), then the terminal record.
    assert len(spy.threads) == 2 + 2 * CALLS + 1
    assert sum(isinstance(r, ToolStarted) for r in store.load("one")) == CALLS


async def test_store_open_and_create_run_off_the_loop(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[str, int]] = []

    def spied(name: str) -> Callable[..., FileJournal]:
        real = getattr(FileStore, name)

        def call(self: FileStore, arg: Any) -> FileJournal:
            calls.append((name, threading.get_ident()))
            journal: FileJournal = real(self, arg)
            return journal

        return call

    for name in ("open", "create"):
        monkeypatch.setattr(FileStore, name, spied(name))
    store, config = FileStore(tmp_path), capped(api)
    ids = [f"s{i}" for i in range(RUNS)]
    started = await asyncio.gather(
        *(start_session(config, "go", store, run_id=run_id) for run_id in ids)
    )
    await asyncio.gather(*(run.aclose() for run in started))
    resumed = await asyncio.gather(*(resume_session(config, run_id, store) for run_id in ids))
    await asyncio.gather(*(run.aclose() for run in resumed))
    assert sorted(name for name, _ in calls) == ["create"] * RUNS + ["open"] * RUNS
    assert all(thread != loop_thread for _, thread in calls)


class SpyStream(io.StringIO):
    """A text stream that records the threads that write to it and flush it."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def write(self, text: str) -> int:
        self.threads.append(threading.get_ident())
        return super().write(text)

    def flush(self) -> None:
        self.threads.append(threading.get_ident())
        super().flush()


async def test_json_lines_are_written_off_the_loop_in_order(api: FakeMessagesAPI) -> None:
    loop_thread = threading.get_ident()
    stream, recorder = SpyStream(), Recorder()
    lines = JsonLinesEvents(stream)
    tool_calls(api, RUNS)

    @tool(name="probe")
    def probe(n: int) -> str:
        """Do nothing."""
        return "ok"

    options = RunOptions(tools=[probe], events=Fanout((recorder, lines)))
    runs = [Run.create(capped(api), "go", options, run_id=f"j{i}") for i in range(RUNS)]
    await asyncio.gather(*(run.run() for run in runs))
    await lines.aclose()
    written = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(w["event"], w["run_id"]) for w in written] == [
        (e.kind, e.run_id) for e in recorder.events
    ]
    assert stream.threads and loop_thread not in stream.threads
    await asyncio.gather(*(run.aclose() for run in runs))


def test_a_failed_json_lines_write_is_raised_by_close() -> None:
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    lines = JsonLinesEvents(Full())
    lines.emit(WarningRaised("r", "kind", "name", "detail"))  # returns at once
    with pytest.raises(OSError, match="No space left"):
        lines.close()


@pytest.fixture
def new_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The threads on which SDK clients were built."""
    threads: list[int] = []
    real = clients._new_client

    def spied(key: clients.ClientKey) -> Any:
        threads.append(threading.get_ident())
        return real(key)

    monkeypatch.setattr(clients, "_new_client", spied)
    yield threads


async def test_runs_on_a_loop_share_one_sdk_client_built_off_the_loop(
    api: FakeMessagesAPI, tmp_path: Path, new_clients: list[int]
) -> None:
    loop_thread = threading.get_ident()
    store, config = FileStore(tmp_path), capped(api)
    runs = await asyncio.gather(
        *(start_session(config, "go", store, run_id=f"c{i}") for i in range(RUNS))
    )
    assert len(new_clients) == 1 and new_clients[0] != loop_thread
    models = [run.harness.model for run in runs]
    assert all(isinstance(m, AnthropicModel) and m.client is models[0].client for m in models)
    client = models[0].client  # type: ignore[attr-defined]
    for run in runs[:-1]:
        await run.aclose()
        assert not client.is_closed()  # others still use it
    await runs[-1].aclose()
    assert client.is_closed()  # the last user closed it
    await runs[-1].aclose()  # idempotent


def test_a_run_built_outside_a_loop_has_a_client_of_its_own(
    api: FakeMessagesAPI, new_clients: list[int]
) -> None:
    # A pooled connection cannot move between event loops: no sharing without a loop.
    first, second = (Run.create(capped(api), "go") for _ in range(2))
    assert len(new_clients) == 2
    assert first.harness.model.client is not second.harness.model.client  # type: ignore[attr-defined]


async def test_a_session_run_is_an_async_context_manager(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    store = FileStore(tmp_path)
    api.add(Reply.text("done"))
    async with await start_session(make_config(api), "go", store, run_id="ctx") as run:
        assert await run.run() == "completed"
    with store.open("ctx") as journal:  # the lock was released on exit
        assert journal.last_seq == len(store.load("ctx"))


async def test_a_session_makes_its_own_journal(api: FakeMessagesAPI, tmp_path: Path) -> None:
    from fisk_sm import MemoryJournal

    options = RunOptions(journal=MemoryJournal())
    with pytest.raises(ValueError, match=r"options\.journal"):
        await start_session(make_config(api), "go", FileStore(tmp_path), options)

"""A run appending on its own: its line written on the loop's thread, fsynced by the kernel (AIO).

Real files under tmp_path and real kernel fsyncs (`fisk_sm.journal.aiosync`), on a writer of the
test's own (`filejournal.shared_writer` patched) so that its counters count this test's commits
only. pytest-asyncio gives each test a new event loop, hence a new `LoopSync` with its own count
of the fsyncs the kernel did. `os.fsync` is wrapped to count the fsyncs a thread did.

Where the kernel has to refuse or fail, a stand-in for the finished `caio` operation answers
`get_value` as the binding does (`SystemError` with the C library's strerror text); everything
else, the submission and the completion on the loop's eventfd included, is real.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import attrs
import caio.linux_aio
import pytest
from test_filestore import lines, meta, user

from fisk_sm import parse_config
from fisk_sm.journal import aiosync, filejournal
from fisk_sm.journal.aiosync import LoopSync, for_running_loop
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filejournal import FileJournal, JournalIOError
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import User
from fisk_sm.journal.writer import GroupCommitWriter
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import start_session
from fisk_sm.testing import FakeMessagesAPI, Reply

LOCK = threading.Lock()
pytestmark = pytest.mark.skipif(os.uname().sysname != "Linux", reason="kernel AIO fsync is Linux's")


class Fsyncs:
    """Wraps `os.fsync`: `count` is how many fsyncs (by a thread) have returned."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real, self.count = real, 0

    def __call__(self, fd: int) -> None:
        self.real(fd)
        with LOCK:
            self.count += 1


class Finished:
    """A stand-in for the finished `caio` operation it stands for (same hash, equal to it),
    whose `get_value` raises what the binding raises for a failed request."""

    def __init__(self, operation: object, strerror: str) -> None:
        self.operation, self.strerror = operation, strerror

    def __hash__(self) -> int:
        return hash(self.operation)

    def __eq__(self, other: object) -> bool:
        return other is self.operation or other is self

    def get_value(self) -> int:
        raise SystemError(self.strerror)


@attrs.define
class Kernel:
    """What `LoopSync.fsync` was asked: the requests in flight at each call, its futures."""

    in_flight_at_call: list[int] = attrs.field(factory=list)
    futures: list[asyncio.Future[None]] = attrs.field(factory=list)

    async def ended(self) -> None:
        """Wait until every fsync asked of the kernel has ended (and the journal was told)."""
        await asyncio.wait(self.futures)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    spy, real = Kernel(), LoopSync.fsync

    def fsync(direct: LoopSync, fd: int) -> asyncio.Future[None]:
        spy.in_flight_at_call.append(direct.in_flight)
        spy.futures.append(future := real(direct, fd))
        return future

    monkeypatch.setattr(LoopSync, "fsync", fsync)
    return spy


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Fsyncs:
    spy = Fsyncs(os.fsync)
    monkeypatch.setattr(os, "fsync", spy)
    return spy


def the_kernel_answers(monkeypatch: pytest.MonkeyPatch, strerror: str) -> None:
    """From now on, every kernel fsync of this loop ends (really) and then reads as failed with
    `strerror`."""
    real = LoopSync._done

    def done(direct: LoopSync, operation: object, fd: int, result: object) -> None:
        real(direct, Finished(operation, strerror), fd, result)  # type: ignore[arg-type]

    monkeypatch.setattr(LoopSync, "_done", done)


def big_user(seq: int) -> User:
    return User(seq=seq, message={"role": "user", "content": "x" * (70 * 1024)})


async def created(store: FileStore, run_id: str = "abc") -> FileJournal:
    journal = await store.create_async(meta(run_id))
    loop_sync()
    return journal


def loop_sync() -> LoopSync:
    direct = for_running_loop()
    assert direct is not None, "this machine has no kernel AIO fsync"
    return direct


async def test_a_lone_journal_is_fsynced_by_the_kernel_not_the_writer_thread(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        direct = loop_sync()
        threads_before = fsyncs.count
        for seq in range(2, 6):
            await journal.append(user(seq))
            assert journal.last_seq == seq
            assert direct.synced == seq - 1  # one kernel fsync per synced append
            assert direct.in_flight == 0
        assert fsyncs.count == threads_before  # no thread fsynced anything
        await journal.close()
    assert (writer.stats.direct, writer.stats.lone, writer.stats.batches) == (4, 0, 0)
    assert store.path("abc").read_bytes() == lines(meta(), *(user(s) for s in range(2, 6)))


async def test_appends_of_two_journals_at_once_share_the_writer(
    tmp_path: Path, writer: GroupCommitWriter, kernel: Kernel
) -> None:
    store, in_flight_at_call = FileStore(tmp_path), kernel.in_flight_at_call

    async def appends(journal: FileJournal) -> None:
        for seq in range(2, 8):
            await journal.append(user(seq))

    async with asyncio.timeout(20):
        first, second = await created(store, "one"), await created(store, "two")
        await asyncio.gather(appends(first), appends(second))
        assert (first.last_seq, second.last_seq) == (7, 7)
        await first.close()
        await second.close()
    direct = loop_sync()
    assert in_flight_at_call and set(in_flight_at_call) == {0}  # never two in flight at once
    assert direct.synced == len(in_flight_at_call) >= 1  # the first append went direct
    assert writer.stats.lone + writer.stats.batched == 12 - direct.synced  # the writer the rest
    for run_id in ("one", "two"):
        assert store.path(run_id).read_bytes() == lines(meta(run_id), *map(user, range(2, 8)))


async def test_a_long_line_goes_to_the_writer(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        direct = loop_sync()
        await journal.append(user(2))  # a short line: direct
        assert (direct.synced, writer.stats.lone) == (1, 0)
        threads_before = fsyncs.count
        await journal.append(big_user(3))
        assert len(lines(big_user(3))) > filejournal.DIRECT_MAX
        assert (direct.synced, writer.stats.lone, writer.stats.direct) == (1, 1, 1)
        assert fsyncs.count == threads_before + 1  # the writer's thread fsynced it
        assert journal.last_seq == 3
        await journal.close()
    assert store.path("abc").read_bytes() == lines(meta(), user(2), big_user(3))


@pytest.mark.parametrize("error", [SystemError, OSError])  # the binding's, and the brief's
async def test_without_an_aio_context_the_writer_serves(
    tmp_path: Path,
    writer: GroupCommitWriter,
    fsyncs: Fsyncs,
    monkeypatch: pytest.MonkeyPatch,
    error: type[Exception],
) -> None:
    """The kernel's aio-max-nr is used up: no context for this (new) loop."""
    assert asyncio.get_running_loop() not in aiosync._CONTEXTS  # a loop of this test's own

    def no_context(*args: object, **kwargs: object) -> object:
        raise error(errno.EAGAIN, os.strerror(errno.EAGAIN))

    monkeypatch.setattr(caio.linux_aio, "Context", no_context)
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await store.create_async(meta())
        threads_before = fsyncs.count
        await journal.append(user(2))
        await journal.append(user(3))
        assert for_running_loop() is None
        assert journal.last_seq == 3
        assert fsyncs.count == threads_before + 2
        await journal.close()
    assert (writer.stats.lone, writer.stats.direct) == (2, 0)
    assert store.path("abc").read_bytes() == lines(meta(), user(2), user(3))


async def test_an_fsync_the_file_system_refuses_is_done_by_a_thread_and_the_loop_stops_asking(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        direct = loop_sync()
        the_kernel_answers(monkeypatch, os.strerror(errno.EINVAL))  # "Invalid argument"
        threads_before = fsyncs.count
        await journal.append(user(2))
        assert journal.last_seq == 2
        assert fsyncs.count == threads_before + 1  # a thread fsynced it instead
        assert (writer.stats.direct, writer.stats.lone) == (1, 0)  # written here, not queued
        assert direct.usable is False and for_running_loop() is None
        await journal.append(user(3))  # the loop asks the kernel no more: the writer serves
        assert (writer.stats.direct, writer.stats.lone) == (1, 1)
        assert fsyncs.count == threads_before + 2
        assert (journal.last_seq, direct.synced) == (3, 0)
        await journal.close()
    assert store.path("abc").read_bytes() == lines(meta(), user(2), user(3))


async def test_a_failed_kernel_fsync_breaks_the_journal(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        await journal.append(user(2))
        the_kernel_answers(monkeypatch, os.strerror(errno.EIO))
        threads_before = fsyncs.count
        with pytest.raises(JournalIOError, match="append of seq 3 failed: Input/output error"):
            await journal.append(user(3))
        assert journal.last_seq == 2
        assert fsyncs.count == threads_before  # a failed fsync is not retried by a thread
        with pytest.raises(JournalError, match="broken"):
            await journal.append(user(3))
        await journal.close()
    assert writer.stats.lone == 0


async def test_a_cancelled_append_still_lands_and_the_journal_learns_it(
    tmp_path: Path, writer: GroupCommitWriter, kernel: Kernel
) -> None:
    """As tests/test_filestore.py::test_a_cancelled_append_still_lands_once, on the direct
    path: cancelling the wait leaves the kernel's fsync running, and its end still advances
    `last_seq`, so that the replay of the seq writes nothing."""
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        direct = loop_sync()
        task = asyncio.ensure_future(journal.append(user(2)))
        await asyncio.sleep(0)  # the line is written and its fsync asked of the kernel
        assert writer.stats.direct == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await journal.append(user(2))  # the replay: waits for that fsync, writes nothing
        assert journal.last_seq == 2
        await kernel.ended()  # the replay may have returned before the loop saw the end
        assert (direct.synced, writer.stats.direct) == (1, 1)
        await journal.append(user(3))
        assert journal.last_seq == 3
        assert (direct.synced, writer.stats.direct, writer.stats.lone) == (2, 2, 0)
        await journal.close()
    assert store.path("abc").read_bytes() == lines(meta(), user(2), user(3))


async def test_a_cancelled_append_whose_kernel_fsync_fails_breaks_the_journal(
    tmp_path: Path, writer: GroupCommitWriter, kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody awaits the failed fsync any more, yet the journal learns of it: the replay fails
    and the journal is broken, never taken for durable."""
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        the_kernel_answers(monkeypatch, os.strerror(errno.EIO))
        task = asyncio.ensure_future(journal.append(user(2)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await kernel.ended()
        assert journal.last_seq == 1
        with pytest.raises(JournalError, match="broken"):
            await journal.append(user(2))
        await journal.close()


async def test_a_run_on_its_own_has_every_record_fsynced_by_the_kernel(
    api: FakeMessagesAPI, tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """The real engine, over the real SDK: a run journals each record after the meta with a
    kernel fsync; no thread fsyncs any of them."""
    api.add(Reply.text("done"))
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    state = tmp_path / "state"
    async with asyncio.timeout(60):
        run = await start_session(
            parse_config({"llm": llm}, env={}), "go", FileStore(state), RunOptions(), run_id="r"
        )
        try:
            threads_before = fsyncs.count
            while not run.finished:
                await run.step()
            assert fsyncs.count == threads_before
        finally:
            await run.aclose()
    direct = loop_sync()
    written = FileStore(state).load("r")
    assert [type(record).__name__ for record in written] == ["Meta", "Assistant", "Terminal"]
    assert direct.synced == len(written) - 1
    assert (writer.stats.lone, writer.stats.batches) == (0, 0)
    assert (state / "r.json").read_bytes() == lines(*written)


async def test_an_fsync_the_kernel_will_not_take_goes_to_the_writer(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """io_submit refuses the request (EINVAL: the file's file system has no fsync operation; a
    pipe's descriptor is submitted to make the real kernel say so): the writer's thread
    fsyncs the line already written."""
    assert asyncio.get_running_loop() not in aiosync._CONTEXTS  # a loop of this test's own
    real, unsyncable = caio.linux_aio.Operation, os.pipe()

    class Operation:
        @staticmethod
        def fsync(fd: int) -> object:
            return real.fsync(unsyncable[0])

    monkeypatch.setattr(caio.linux_aio, "Operation", Operation)
    store = FileStore(tmp_path)
    try:
        async with asyncio.timeout(20):
            journal = await created(store)
            threads_before = fsyncs.count
            await journal.append(user(2))
            assert journal.last_seq == 2
            assert fsyncs.count == threads_before + 1
            assert (writer.stats.direct, writer.stats.lone) == (1, 1)
            await journal.append(user(3))
            assert journal.last_seq == 3
            await journal.close()
    finally:
        for fd in unsyncable:
            os.close(fd)
    assert store.path("abc").read_bytes() == lines(meta(), user(2), user(3))


async def test_closing_waits_for_the_kernel_fsync_of_a_cancelled_append(
    tmp_path: Path, writer: GroupCommitWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with the writer (close_sync: "If an append is still being committed (its run was
    cancelled), this waits for it"), the journal closes once the fsync in flight has ended."""
    real, arrived = LoopSync._done, asyncio.Event()
    held: list[tuple[object, ...]] = []

    def done(*call: object) -> None:  # the loop's handling of a kernel fsync's end waits
        held.append(call)
        arrived.set()

    monkeypatch.setattr(LoopSync, "_done", done)
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        journal = await created(store)
        task = asyncio.ensure_future(journal.append(user(2)))
        await asyncio.sleep(0)  # the line is written and its fsync asked of the kernel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await arrived.wait()  # the kernel's fsync ended; the loop has not handled it yet
        closing = asyncio.ensure_future(journal.close())
        await asyncio.sleep(0)  # close takes its first step
        closed_while_in_flight = closing.done()
        monkeypatch.setattr(LoopSync, "_done", real)
        for call in held:
            real(*call)  # type: ignore[arg-type]
        await closing
    assert not closed_while_in_flight
    assert journal.last_seq == 2  # the journal learnt the fsync's end before it closed

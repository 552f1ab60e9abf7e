"""The writer's fast path: a lone append is committed alone, durable before it returns, and a
batch still takes every append queued while a commit was going on.

Real files, real fsyncs, on a writer of the test's own (`filejournal.shared_writer` patched), so
that its counters count this test's commits only. A gate wrapped around `os.fsync` holds one
commit on the writer's thread while the test queues more appends or cancels one, so what is
queued when is decided by the test, not by timing. These are the writer thread's paths, so
no append here is fsynced by the kernel directly (`writer_only`; that path, a lone run's on
Linux, is tests/test_journal_direct.py's).
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fisk_sm.journal import filejournal
from fisk_sm.journal import writer as writer_module
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filejournal import FileJournal, JournalIOError
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    Meta,
    Record,
    ToolResult,
    ToolStarted,
    User,
    encode,
)
from fisk_sm.journal.writer import Channel, GroupCommitWriter

OUTPUT = "out “quoted” — " * 40  # a tool result of ~700 bytes, with non-ASCII text


def meta(run_id: str) -> Meta:
    return Meta(1, FORMAT_VERSION, run_id, "2025-01-01T00:00:00Z", {"model": "m"}, "go")


def records(run_id: str) -> list[Record]:
    """The meta, then a user message and two tool results."""
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": OUTPUT}
    text = {"role": "user", "content": [{"type": "text", "text": f"hello {run_id}"}]}
    return [
        meta(run_id),
        User(2, text),
        ToolResult(3, "tu_1", result),
        ToolResult(4, "tu_2", {**result, "tool_use_id": "tu_2"}),
    ]


def lines(written: list[Record]) -> bytes:
    return b"".join(encode(record).encode() + b"\n" for record in written)


class Fsyncs:
    """Wraps `os.fsync`. Once the real fsync has returned, it notes the calling thread and how
    many bytes of the file it covered (its size when the call began). `hold()` makes the next
    fsync wait, on its thread, until `release()`, and then raise `fail` if one is set."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self._lock = threading.Lock()
        self.durable: dict[int, int] = {}  # inode -> bytes known durable
        self.threads: list[int] = []
        self._held = False
        self.entered, self.go = threading.Event(), threading.Event()
        self.fail: OSError | None = None
        self.holder = 0  # the thread of the last held fsync

    def hold(self) -> None:
        self._held = True
        self.entered.clear()
        self.go.clear()

    def release(self) -> None:
        self.go.set()

    def __call__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        with self._lock:
            held, self._held = self._held, False
        if held:
            self.holder = threading.get_ident()
            self.entered.set()
            self.go.wait(30)
            if self.fail is not None:
                raise self.fail
        time.sleep(0.002)  # a slow disk: an append resolved before its fsync returned shows
        self.real(fd)
        with self._lock:
            ino = os.fstat(fd).st_ino
            self.durable[ino] = max(self.durable.get(ino, 0), size)
            self.threads.append(threading.get_ident())

    def durable_bytes(self, path: Path) -> int:
        with self._lock:
            return self.durable.get(path.stat().st_ino, 0)


@pytest.fixture(autouse=True)
def writer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filejournal, "DIRECT_MAX", -1)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Fsyncs:
    spy = Fsyncs(os.fsync)
    monkeypatch.setattr(os, "fsync", spy)
    return spy


async def held_until_entered(fsyncs: Fsyncs) -> None:
    """Wait (off the loop) until the held fsync has begun on the writer's thread."""
    assert await asyncio.to_thread(fsyncs.entered.wait, 30)


async def test_a_lone_append_is_committed_alone_durable_and_off_the_loop(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    store, written = FileStore(tmp_path), records("alone")
    async with asyncio.timeout(20):
        journal = await store.create_async(written[0])
        for record in written[1:]:
            await journal.append(record)
            # Returned: every byte of the file is durable (an fsync that covered it returned).
            assert fsyncs.durable_bytes(journal.path) == journal.path.stat().st_size
            assert journal.last_seq == record.seq
        await journal.close()
    assert (writer.stats.lone, writer.stats.batches, writer.stats.batched) == (3, 0, 0)
    assert threading.get_ident() not in fsyncs.threads
    assert journal.path.read_bytes() == lines(written)


async def test_appends_queued_during_a_commit_share_the_next_one(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """While one run's commit is in its fsync, ten runs append: one batch commits all ten, and
    each file holds the bytes the same records make when appended alone."""
    batched, alone = FileStore(tmp_path / "batched"), FileStore(tmp_path / "alone")
    ids = [f"r{i}" for i in range(10)]
    async with asyncio.timeout(20):
        first = await batched.create_async(meta("first"))
        journals = [await batched.create_async(meta(run_id)) for run_id in ids]
        fsyncs.hold()
        holding = asyncio.ensure_future(first.append(User(2, {"role": "user", "content": "x"})))
        await held_until_entered(fsyncs)  # the writer is in the lone commit of `first`
        appends = [asyncio.ensure_future(j.append(records(j.path.stem)[1])) for j in journals]
        await asyncio.sleep(0.05)  # every append is queued behind the held commit
        assert not any(task.done() for task in appends)
        fsyncs.release()
        await asyncio.gather(holding, *appends)
        assert (writer.stats.lone, writer.stats.batches, writer.stats.batched) == (1, 1, 10)
        for journal in journals:  # the rest, each run on its own: lone commits
            for record in records(journal.path.stem)[2:]:
                await journal.append(record)
            await journal.close()
        await first.close()
        for run_id in ids:  # the same records, appended by runs that never overlap
            journal = await alone.create_async(meta(run_id))
            for record in records(run_id)[1:]:
                await journal.append(record)
            await journal.close()
    for run_id in ids:
        assert batched.path(run_id).read_bytes() == alone.path(run_id).read_bytes()
        assert batched.path(run_id).read_bytes() == lines(records(run_id))
        assert fsyncs.durable_bytes(batched.path(run_id)) == batched.path(run_id).stat().st_size


async def queued_behind_a_cancelled_append(
    journal: FileJournal, fsyncs: Fsyncs, cancelled: Record, then: Record
) -> asyncio.Future[None]:
    """Append `cancelled` (seq 2), cancel it while its commit is held in its fsync, then append
    `then`: the append of `then`, waiting for that commit (held until `fsyncs.release()`)."""
    fsyncs.hold()
    task = asyncio.ensure_future(journal.append(cancelled))
    await held_until_entered(fsyncs)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert journal.last_seq == 1  # not durable yet
    queued = asyncio.ensure_future(journal.append(then))
    await asyncio.sleep(0.05)
    assert not queued.done()  # it waits for the commit in flight
    return queued


async def replaying(
    tmp_path: Path, fsyncs: Fsyncs, run_id: str
) -> tuple[list[Record], FileJournal, asyncio.Future[None]]:
    """`records(run_id)`, their journal, and a replay of seq 2 behind its cancelled append."""
    written = records(run_id)
    journal = await FileStore(tmp_path).create_async(written[0])
    replay = await queued_behind_a_cancelled_append(journal, fsyncs, written[1], written[1])
    return written, journal, replay


async def test_a_replay_waits_for_the_cancelled_append_still_in_flight(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    async with asyncio.timeout(20):
        written, journal, replay = await replaying(tmp_path, fsyncs, "replayed")
        fsyncs.release()  # the replay wrote nothing itself: the commit in flight covers it
        await replay
        assert journal.last_seq == 2
        assert fsyncs.durable_bytes(journal.path) == journal.path.stat().st_size
        for record in written[2:]:
            await journal.append(record)
        await journal.close()
    assert journal.path.read_bytes() == lines(written)  # the replayed seq once


async def test_a_replay_fails_with_the_cancelled_append_it_waited_for(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    async with asyncio.timeout(20):
        written, journal, replay = await replaying(tmp_path, fsyncs, "failed")
        fsyncs.fail = OSError(errno.EIO, "Input/output error")
        fsyncs.release()
        with pytest.raises(JournalIOError, match="append of seq 2 failed: Input/output error"):
            await replay
        assert journal.last_seq == 1
        with pytest.raises(JournalError, match="broken"):
            await journal.append(written[2])
        await journal.close()


async def test_a_deferred_intent_is_written_in_place_when_nothing_is_queued(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """A `retry` tool's intent (no fsync of its own) is in the file when its append returns,
    written without the writer's thread; the tool result's fsync then covers both."""
    store, run_id = FileStore(tmp_path), "deferred"
    started = ToolStarted(3, "tu_1", "echo")
    written = [meta(run_id), User(2, {"role": "user", "content": "x"}), started]
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": OUTPUT}
    written.append(ToolResult(4, "tu_1", result))
    async with asyncio.timeout(20):
        journal = await store.create_async(written[0])
        journal.deferred_intents = frozenset({"echo"})
        await journal.append(written[1])
        durable = journal.path.stat().st_size
        await journal.append(started)
        assert journal.path.read_bytes() == lines(written[:3])  # in the file, not fsynced
        assert fsyncs.durable_bytes(journal.path) == durable
        assert journal.last_seq == 3
        await journal.append(written[3])
        assert fsyncs.durable_bytes(journal.path) == journal.path.stat().st_size
        await journal.close()
    assert (writer.stats.direct, writer.stats.lone, writer.stats.batched) == (1, 2, 0)
    assert journal.path.read_bytes() == lines(written)


async def test_a_deferred_intent_goes_behind_a_commit_of_its_file(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """With an earlier append of the file still being committed (its append was cancelled), the
    intent is queued behind it, never written ahead of it."""
    store, run_id = FileStore(tmp_path), "behind"
    started = ToolStarted(3, "tu_1", "echo")
    written = [meta(run_id), User(2, {"role": "user", "content": "x"}), started]
    async with asyncio.timeout(20):
        journal = await store.create_async(written[0])
        journal.deferred_intents = frozenset({"echo"})
        intent = await queued_behind_a_cancelled_append(journal, fsyncs, written[1], started)
        fsyncs.release()
        await intent
        await journal.close()
    assert writer.stats.direct == 0
    assert journal.path.read_bytes() == lines(written)


async def test_a_deferred_intent_is_queued_while_the_writer_commits_another_file(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """Many runs: the writer is busy, so an intent goes through it (its write(2) stays off the
    loop's thread), and is in the file once its append returns."""
    store = FileStore(tmp_path)
    started = ToolStarted(2, "tu_1", "echo")
    async with asyncio.timeout(20):
        other, journal = (
            await store.create_async(meta("other")),
            await store.create_async(meta("mine")),
        )
        journal.deferred_intents = frozenset({"echo"})
        fsyncs.hold()
        holding = asyncio.ensure_future(other.append(User(2, {"role": "user", "content": "x"})))
        await held_until_entered(fsyncs)
        intent = asyncio.ensure_future(journal.append(started))
        await asyncio.sleep(0.05)
        assert not intent.done()  # queued behind the commit under way
        fsyncs.release()
        await asyncio.gather(holding, intent)
        assert journal.path.read_bytes() == lines([meta("mine"), started])
        await other.close()
        await journal.close()
    assert writer.stats.direct == 0


async def test_a_deferred_intent_that_cannot_be_written_breaks_the_journal(
    tmp_path: Path, writer: GroupCommitWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, run_id = FileStore(tmp_path), "full"
    async with asyncio.timeout(20):
        journal = await store.create_async(meta(run_id))
        journal.deferred_intents = frozenset({"echo"})

        def full(fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr(os, "write", full)
            with pytest.raises(JournalIOError, match="seq 2 failed: No space left on device"):
                await journal.append(ToolStarted(2, "tu_1", "echo"))
        with pytest.raises(JournalError, match="broken"):
            await journal.append(ToolStarted(2, "tu_1", "echo"))
        await journal.close()
    assert journal.path.read_bytes() == lines([meta(run_id)])


async def test_a_batch_fsyncs_its_files_on_helpers_and_on_the_writer_thread(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs
) -> None:
    """Appends of 12 files queued during a commit: one batch, 12 fsyncs, spread over the
    fsync helpers and the writer's own thread (which takes its share instead of waiting)."""
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        first = await store.create_async(meta("first"))
        journals = [await store.create_async(meta(f"r{i}")) for i in range(12)]
        fsyncs.hold()
        holding = asyncio.ensure_future(first.append(User(2, {"role": "user", "content": "x"})))
        await held_until_entered(fsyncs)
        writer_thread = fsyncs.holder
        appends = [asyncio.ensure_future(j.append(records(j.path.stem)[1])) for j in journals]
        await asyncio.sleep(0.05)
        before = len(fsyncs.threads)
        fsyncs.release()
        await asyncio.gather(holding, *appends)
        batch = fsyncs.threads[before + 1 :]  # after the held, lone commit's own fsync
        for journal in [first, *journals]:
            await journal.close()
    assert (writer.stats.lone, writer.stats.batches, writer.stats.batched) == (1, 1, 12)
    assert len(batch) == 12
    assert writer_thread in batch  # the writer took a share
    assert len(set(batch)) > 1  # and helpers took the rest, in parallel
    for journal in journals:
        assert fsyncs.durable_bytes(journal.path) == journal.path.stat().st_size


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_bug_in_a_batch_fsync_fails_the_batch_and_the_helpers_go_on(
    tmp_path: Path, writer: GroupCommitWriter, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (not an OSError) in a batch's fsync on a helper thread: every append of the batch
    fails with EIO (none is taken for durable), and later batches commit on new helpers."""
    store = FileStore(tmp_path)
    async with asyncio.timeout(20):
        first = await store.create_async(meta("first"))
        journals = [await store.create_async(meta(f"r{i}")) for i in range(6)]
        real = writer_module._fsync

        fsyncs.hold()
        holding = asyncio.ensure_future(first.append(User(2, {"role": "user", "content": "x"})))
        await held_until_entered(fsyncs)
        writer_thread = fsyncs.holder

        def buggy(channel: Channel) -> None:  # the writer's own share goes well (and slowly)
            if threading.get_ident() != writer_thread:
                raise RuntimeError("a bug in an fsync")
            real(channel)

        monkeypatch.setattr(writer_module, "_fsync", buggy)  # the lone commit is past it
        appends = [asyncio.ensure_future(j.append(records(j.path.stem)[1])) for j in journals]
        await asyncio.sleep(0.05)
        fsyncs.release()
        outcomes = await asyncio.gather(holding, *appends, return_exceptions=True)
        assert outcomes[0] is None
        for outcome in outcomes[1:]:
            assert isinstance(outcome, JournalIOError)
            assert "journal writer failed" in str(outcome)
        monkeypatch.setattr(writer_module, "_fsync", real)
        again = [await store.create_async(meta(f"s{i}")) for i in range(6)]
        fsyncs.hold()
        holding = asyncio.ensure_future(first.append(records("first")[2]))
        await held_until_entered(fsyncs)
        appends = [asyncio.ensure_future(j.append(records(j.path.stem)[1])) for j in again]
        await asyncio.sleep(0.05)
        before = len(fsyncs.threads) + 1  # the held commit's fsync is noted first
        fsyncs.release()
        await asyncio.gather(holding, *appends)
        assert len(set(fsyncs.threads[before:])) > 1  # new helpers took the dead ones' place
        for journal in [first, *journals, *again]:
            await journal.close()
    for journal in again:
        assert fsyncs.durable_bytes(journal.path) == journal.path.stat().st_size

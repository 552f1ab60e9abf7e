"""An open session journal: the append contract on a JSON Lines file, durable before it returns.

`await journal.append(record)` hands the line to the process's group-commit writer
(`fisk_sm.journal.writer`) and resolves once the writer has written and fsynced it, so the event
loop never waits for the disk while the run still moves on only with its record durable. A run
appending on its own takes the writer's fast path: one hand-off to its thread and one back. An
intent that needs no fsync (`deferred_intents`) is written by the appending thread itself when
nothing of the file is queued: no hand-off at all.
`append_sync` does the same write and fsync on the calling thread, for synchronous users (a
fork, a tool that builds a session by hand). The journal holds the session's lock until closed.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
from pathlib import Path

import attrs

from fisk_sm.config.errors import one_line
from fisk_sm.journal.aiosync import LoopSync, for_running_loop
from fisk_sm.journal.base import JournalError, check_append
from fisk_sm.journal.records import Record, ToolStarted, encode
from fisk_sm.journal.writer import Channel, Then, shared_writer

__all__ = ["FileJournal", "JournalIOError"]


class JournalIOError(JournalError):
    """The disk failed us (full, read-only, permissions): not bad input, and the journal is
    intact up to its last durable record."""


#: The longest line an append writes itself for a direct fsync (a longer one goes to the writer's
#: thread, so the loop never spends long in write(2)).
DIRECT_MAX = 64 * 1024


def _alone() -> LoopSync | None:
    """The loop's direct fsync, if it has one with nothing in flight: a second run appending at
    the same time goes to the writer, whose batches fold many runs' fsyncs."""
    direct = for_running_loop()
    return direct if direct is not None and not direct.in_flight else None


def _settled(then: Then, channel: Channel, future: asyncio.Future[None]) -> None:
    """A direct fsync ended: tell the journal, whatever became of the awaiting task. (Its
    future is shielded and `LoopSync` fails it with an OSError only; anything else is an
    outcome nobody knows, and counts as a failure.)"""
    failure: OSError | None = OSError(errno.EIO, "fsync outcome unknown")
    if not future.cancelled():
        raised = future.exception()
        failure = raised if raised is None or isinstance(raised, OSError) else failure
    if failure is not None:
        channel.failure = channel.failure or failure
    then(failure)


def _line(record: Record) -> bytes:
    return (encode(record) + "\n").encode()


@attrs.define(eq=False)
class FileJournal:
    """An open session journal: appends are durable (fsync) before they return.

    It holds the session lock until closed. `records` are the records the journal held when it
    was handed out (read at open, or the meta at create); appends do not extend it.

    `deferred_intents` names tools whose `tool_started` intent needs no fsync of its own (the
    `retry` tools: should a crash of the machine lose the intent, resume runs the tool again,
    which is what `retry` does anyway). Such an intent counts as written once it is in the file;
    the fsync of the tool's result, the next record, makes both durable.
    """

    path: Path
    _fd: int = attrs.field(repr=False)
    _lock_fd: int = attrs.field(repr=False)
    records: list[Record]
    _last_seq: int = 0
    deferred_intents: frozenset[str] = frozenset()
    _broken: bool = False
    _closed: bool = False
    #: The highest seq handed to the writer; ahead of `_last_seq` while an append is in flight.
    _queued_seq: int = attrs.field(init=False)
    #: Replays of a seq still in flight (its first append was cancelled), waiting for its commit.
    _replays: list[tuple[int, asyncio.Future[None]]] = attrs.field(factory=list, init=False)
    _direct: asyncio.Future[None] | None = attrs.field(default=None, init=False, repr=False)
    _channel: Channel = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._queued_seq = self._last_seq
        self._channel = Channel(self._fd)

    @property
    def last_seq(self) -> int:
        """The seq of the last record known durable (0 when empty)."""
        return self._last_seq

    def _check_usable(self) -> None:
        if self._closed or self._broken:
            why = "closed" if self._closed else "broken by a failed write; reopen it"
            raise JournalError(f"{self.path}: journal is {why}")

    def _must_write(self, last_seq: int, record: Record) -> bool:
        try:
            return check_append(last_seq, record)
        except JournalError as exc:
            raise JournalError(f"{self.path}: {exc}") from None

    def _failed(self, record: Record, exc: OSError) -> JournalIOError:
        self._broken = True
        why = one_line(exc.strerror or exc)
        return JournalIOError(f"{self.path}: append of seq {record.seq} failed: {why}")

    def append_sync(self, record: Record) -> None:
        """Append under the append contract: write one line, fsync, then advance `last_seq`.

        It blocks the calling thread for the fsync; an event loop uses `append`. After a failed
        write the journal refuses further appends (the file's tail is unknown); reopen the
        session, which truncates a torn line.
        """
        self._check_usable()
        if self._queued_seq != self._last_seq:
            raise JournalError(f"{self.path}: append_sync while an async append is in flight")
        if not self._must_write(self._last_seq, record):
            return
        view = memoryview(_line(record))
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            raise self._failed(record, exc) from exc
        self._last_seq = self._queued_seq = record.seq

    async def append(self, record: Record) -> None:
        """The `Journal` protocol's append: returns once the record is durable.

        The fsync never happens on the event loop. With the writer idle, the line is written here
        (a deferred intent, which has no fsync; or a line of up to `DIRECT_MAX` bytes whose fsync
        the kernel does, `aiosync`); otherwise the group-commit writer's thread writes and
        fsyncs it. A cancelled append still completes in the background, and the journal learns
        its outcome: a replay of the same seq then waits for it instead of writing it twice.
        """
        self._check_usable()
        if not self._must_write(self._queued_seq, record):
            if record.seq > self._last_seq:  # a replay of an append still in flight
                waiter = asyncio.get_running_loop().create_future()
                self._replays.append((record.seq, waiter))
                await self._wait(record, waiter)
            return
        sync = not (isinstance(record, ToolStarted) and record.name in self.deferred_intents)
        writer, line = shared_writer(), _line(record)
        if not sync:  # counts as written once in the file: written here, if nothing is queued
            try:
                if writer.write_unsynced(self._channel, line):
                    self._queued_seq = self._last_seq = record.seq
                    return
            except OSError as exc:
                raise self._failed(record, exc) from exc
        elif len(line) <= DIRECT_MAX and writer.idle and (direct := _alone()) is not None:
            try:  # a run on its own: written here, fsynced by the kernel (`aiosync`)
                if writer.write_unsynced(self._channel, line):
                    await self._synced_direct(record, direct)
                    return
            except OSError as exc:
                raise self._failed(record, exc) from exc
        then = functools.partial(self._committed, record.seq)
        future = writer.submit(self._channel, line, sync=sync, then=then)
        self._queued_seq = record.seq
        await self._wait(record, future)

    async def _synced_direct(self, record: Record, direct: LoopSync) -> None:
        """Wait for the kernel's fsync of the line just written; should the kernel not take the
        request, the writer's thread fsyncs it. As with the writer, a cancelled wait leaves the
        fsync to finish, and the journal learns its outcome (`_committed`)."""
        self._queued_seq = record.seq
        then = functools.partial(self._committed, record.seq)
        try:
            future = direct.fsync(self._fd)
        except OSError:
            future = shared_writer().submit(self._channel, b"", then=then)
        else:
            future.add_done_callback(functools.partial(_settled, then, self._channel))
            self._direct = future  # `close` waits for it
        await self._wait(record, asyncio.shield(future))

    def _committed(self, seq: int, failure: OSError | None) -> None:
        # The writer calls it on the loop whatever became of the awaiting task, so `last_seq`
        # and `_broken` always match the file.
        if failure is None:
            self._last_seq = max(self._last_seq, seq)
        else:
            self._broken = True
        if self._replays:
            self._wake_replays(failure)

    def _wake_replays(self, failure: OSError | None) -> None:
        waiting = []
        for replayed, waiter in self._replays:
            if waiter.done():
                continue
            if failure is not None:
                waiter.set_exception(failure)
            elif replayed <= self._last_seq:
                waiter.set_result(None)
            else:
                waiting.append((replayed, waiter))
        self._replays = waiting

    async def _wait(self, record: Record, future: asyncio.Future[None]) -> None:
        # Not shielded: cancelling the run cancels this wait, not the commit (see _committed).
        try:
            await future
        except OSError as exc:
            raise self._failed(record, exc) from exc

    def _release(self) -> None:
        try:
            os.close(self._fd)
        finally:
            os.close(self._lock_fd)

    def close_sync(self) -> None:
        """Close the journal and release the lock; idempotent.

        If an append is still being committed (its run was cancelled), this waits for it.
        """
        if self._closed:
            return
        self._closed = True
        if self._direct is not None and not self._direct.done():
            os.fsync(self._fd)  # the kernel's fsync cannot be awaited here: this one covers it
        pending = shared_writer().after_pending(self._channel, self._release)
        if pending is None:
            self._release()
        else:
            pending.result()

    async def close(self) -> None:
        """The `Journal` protocol's close: release the file and the lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._direct is not None:  # a cancelled append's fsync, still with the kernel
            await asyncio.wait([self._direct])
        pending = shared_writer().after_pending(self._channel, self._release)
        if pending is None:
            self._release()  # two close(2) calls: nothing to wait for
        else:
            await asyncio.wrap_future(pending)

    def __enter__(self) -> FileJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close_sync()

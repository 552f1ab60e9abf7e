"""The group-commit writer: the journal appends of every run, written and fsynced off the loop.

A supervisor drives hundreds of runs on one event loop, so no run may make the loop wait for a
disk. One daemon thread takes the appends that every run of the process queues, in arrival
order, and commits them in batches: it writes each record of the batch, then fsyncs each file
the batch touched, once, and only then resolves each append's future, on the append's own event
loop. A run therefore moves on only once its record is durable, waits for the commit that covers
its record and nothing else, and the loop never waits for an fsync.

A lone append (the writer idle, nothing else queued: one run on its own) takes a fast path on
the same thread: it is written and fsynced at once, without a batch's bookkeeping, and settled
with one call on its loop, which first tells the journal (`then`) and then resolves the future.
The bytes on disk and the guarantee are those of a batch of one, and appends queued while a
commit is under way still share the next one. `stats` counts the commits of either kind.

Each run has a file of its own, so a batch makes one fsync per touched file; they run in parallel
on a few helper threads, because concurrent fsyncs on one filesystem share its journal commit
(ext4, 200 files: 0.53 s fsynced one after another, about 20 ms on 4 to 16 threads).

An append queued with `sync=False` (the intent record of a `retry` tool) is written but causes no
fsync of its own: the next synced append to that file is written after it, and its fsync covers
both. Such an append made while the writer is idle (`write_unsynced`) needs no thread at all:
the caller writes its few hundred bytes into the page cache itself, in order, and moves on
without a round trip through the writer's thread and back (`stats.direct`). A busy writer (many
runs) takes it as before: a write(2) on the loop's thread would hand the GIL to another thread
each time.

The first write or fsync that fails on a file sticks to that file's `Channel`: the appends
of that batch and every later one fail with it, since the file's tail is no longer known.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Callable

import attrs

from fisk_sm.events.threads import Fanout, PerProcess

__all__ = ["FSYNC_THREADS", "Channel", "GroupCommitWriter", "WriterStats", "shared_writer"]

#: Helper threads for the fsyncs of one batch (more did not help in the measurement above).
FSYNC_THREADS = 8

#: Told the outcome of an append on its loop, before its future resolves (even a cancelled one).
Then = Callable[[OSError | None], object]
_Outcome = tuple[asyncio.Future[None], Then | None, OSError | None]


@attrs.define(eq=False)
class Channel:
    """One file's lane through the writer: its descriptor and its first failure."""

    fd: int
    #: The first write or fsync error on this file; every later append fails with it.
    failure: OSError | None = None
    #: Appends queued or being committed (guarded by the writer's lock).
    queued: int = 0


@attrs.define
class WriterStats:
    """What the writer thread committed, and how (its own counters; read them between commits)."""

    #: Appends committed on the fast path, each alone.
    lone: int = 0
    #: Batches committed with the batch's bookkeeping, and the appends they held.
    batches: int = 0
    batched: int = 0
    #: Appends written by their caller with the writer idle (an unsynced intent, or a lone
    #: run's line whose fsync the kernel does: `fisk_sm.journal.aiosync`).
    direct: int = 0


@attrs.define(eq=False)
class _Append:
    channel: Channel
    data: bytes
    sync: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    then: Then | None


@attrs.define(eq=False)
class _After:
    """Work to do once every append queued before it has been committed (closing a file)."""

    channel: Channel
    work: Callable[[], None]
    done: concurrent.futures.Future[None]


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    view = memoryview(data)
    while written < len(view):  # a short write (a signal, a nearly full disk) is completed
        view = view[written:]
        written = os.write(fd, view)


def _write(channel: Channel, data: bytes) -> bool:
    """Append `data` to the channel's file unless it failed before; whether it is written now
    (a failure sticks to the channel)."""
    if channel.failure is not None:
        return False
    try:
        _write_all(channel.fd, data)
    except OSError as exc:
        channel.failure = exc
        return False
    return True


def _fsync(channel: Channel) -> None:
    try:
        os.fsync(channel.fd)
    except OSError as exc:
        channel.failure = exc


def _settle_one(future: asyncio.Future[None], then: Then | None, failure: OSError | None) -> None:
    """Tell one append's outcome on its loop's thread (called there through
    call_soon_threadsafe): first to `then`, then to the future, unless it was cancelled."""
    try:
        if then is not None:
            then(failure)
    finally:
        if not future.done():  # done: only ever cancelled, nobody waits for it any more
            if failure is None:
                future.set_result(None)
            else:
                future.set_exception(failure)


def _settle(outcomes: list[_Outcome]) -> None:
    for outcome in outcomes:
        _settle_one(*outcome)


class GroupCommitWriter:
    """A daemon thread that commits queued appends in batches; see the module docstring."""

    def __init__(self, *, threads: int = FSYNC_THREADS, syncfs: bool = False) -> None:
        """`threads` fsync a batch's files in parallel (1: one after another on the writer
        thread); `syncfs` makes a batch one `syncfs(2)` of the filesystem instead (Linux; it
        flushes every file there, other processes' included; measured in bench/journal.py)."""
        self._lock = threading.Lock()  # guards _queue, _idle and every Channel.queued
        self._wake = threading.Lock()  # held while the thread sleeps; released to wake it
        self._wake.acquire()
        self._queue: list[_Append | _After] = []
        self._idle = True  # the thread has taken everything and sleeps (or is about to)
        self._pending = 0  # appends queued or being committed, of every file
        self._thread: threading.Thread | None = None
        self._pool = Fanout(threads, "fisk-fsync")
        self._threads = threads
        self._syncfs = _libc_syncfs() if syncfs else None
        self.stats = WriterStats()

    def submit(
        self, channel: Channel, data: bytes, *, sync: bool = True, then: Then | None = None
    ) -> asyncio.Future[None]:
        """Queue `data` for `channel`'s file; the future resolves once it is durable.

        Call it on the thread of a running event loop: the future belongs to that loop. It
        fails with the file's `OSError` if the write or the fsync failed. With `sync=False` it
        resolves once written; a later synced append to the file makes it durable. `then`, if
        given, is called on the loop with the outcome (None or the error) just before the
        future resolves, and also if the future was cancelled meanwhile.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._put(_Append(channel, data, sync, loop, future, then))
        return future

    @property
    def idle(self) -> bool:
        """Whether no append of any file is queued or being committed (a run on its own)."""
        return not self._pending

    def write_unsynced(self, channel: Channel, data: bytes) -> bool:
        """Write `data` (an append that needs no fsync of its own) on the calling thread, if
        the writer is idle (a run on its own); False, writing nothing, if it is busy or has
        something of the file (queue it with `submit(..., sync=False)`: it must go after
        those). Raises the file's `OSError`.

        Only the thread that queues a channel's appends adds to its `queued` (and to the
        writer's count of pending appends), and the writer takes one off only once the append
        is written and fsynced, so 0 seen here means no earlier append of the file is still to
        be written.
        """
        if self._pending:  # a busy writer keeps the write(2), which lets the GIL go, off the
            return False  # loop's thread: another thread would take the GIL on every append
        if not _write(channel, data):
            assert channel.failure is not None
            raise channel.failure
        self.stats.direct += 1
        return True

    def after_pending(
        self, channel: Channel, work: Callable[[], None]
    ) -> concurrent.futures.Future[None] | None:
        """Run `work` once `channel`'s queued appends are committed.

        Returns None when nothing is queued for `channel` (the caller runs `work` itself, at
        once); otherwise a future that resolves when the writer thread has run it.
        """
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if channel.queued == 0:
                return None
            self._queue.append(_After(channel, work, done))  # the thread is busy: no wake
        return done

    def _put(self, item: _Append) -> None:
        with self._lock:
            item.channel.queued += 1
            self._pending += 1
            self._queue.append(item)
            wake, self._idle = self._idle, False
        if wake:  # the one release for the thread's acquire: it was idle
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="fisk-journal", daemon=True
                )
                self._thread.start()
            self._wake.release()

    def _take(self) -> list[_Append | _After]:
        """Everything queued; when there is nothing, the thread is idle from now on."""
        with self._lock:
            batch, self._queue = self._queue, []
            self._idle = not batch
            return batch

    def _serve(self) -> None:
        while True:
            self._wake.acquire()
            while batch := self._take():
                try:
                    self._commit(batch)
                # A boundary: this thread serves every run's appends, so a bug here must fail
                # the batch's appends (with EIO) and keep serving, never hang their runs.
                except Exception as exc:
                    failure = OSError(errno.EIO, f"journal writer failed: {exc!r}")
                    for item in batch:
                        item.channel.failure = item.channel.failure or failure
                    self._commit(batch)  # writes nothing now; resolves and runs what waits

    def _commit(self, batch: list[_Append | _After]) -> None:
        if len(batch) == 1 and isinstance(batch[0], _Append):
            self._commit_lone(batch[0])
        else:
            self._commit_batch(batch)

    def _commit_lone(self, item: _Append) -> None:
        """The fast path: write and fsync one append, then tell its loop."""
        channel = item.channel
        if _write(channel, item.data) and item.sync:
            _fsync(channel)
        with self._lock:
            channel.queued -= 1
            self._pending -= 1
        self.stats.lone += 1
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            item.loop.call_soon_threadsafe(_settle_one, item.future, item.then, channel.failure)

    def _commit_batch(self, batch: list[_Append | _After]) -> None:
        """Write the batch, fsync each touched file once, then resolve and run what waits."""
        appends = [item for item in batch if isinstance(item, _Append)]
        touched: dict[Channel, None] = {}  # an ordered set
        for item in appends:
            if _write(item.channel, item.data) and item.sync:
                touched[item.channel] = None
        self._sync([channel for channel in touched if channel.failure is None])
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for item in appends:
            outcome = (item.future, item.then, item.channel.failure)
            by_loop.setdefault(item.loop, []).append(outcome)
        with self._lock:
            for item in appends:
                item.channel.queued -= 1
            self._pending -= len(appends)
        self.stats.batches += 1
        self.stats.batched += len(appends)
        for loop, outcomes in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
                loop.call_soon_threadsafe(_settle, outcomes)
        for after in batch:
            if isinstance(after, _After):
                try:
                    after.work()
                except BaseException as exc:  # handed to the waiter, never lost in this thread
                    after.done.set_exception(exc)
                else:
                    after.done.set_result(None)

    def _sync(self, to_sync: list[Channel]) -> None:
        """Make the batch's files durable: one syncfs, or an fsync each (in parallel)."""
        if self._syncfs is not None and len(to_sync) > 1:
            self._sync_filesystem(self._syncfs, to_sync)
        elif len(to_sync) == 1 or (to_sync and self._threads <= 1):
            for channel in to_sync:
                _fsync(channel)
        elif to_sync:
            self._pool.run(_fsync, to_sync)

    @staticmethod
    def _sync_filesystem(syncfs: Callable[[int], int], channels: list[Channel]) -> None:
        """One syncfs of the filesystem of the batch's first file; should it fail (or the files
        lie on several filesystems), each file is fsynced as usual."""
        devices = {os.fstat(channel.fd).st_dev for channel in channels}
        if len(devices) != 1 or syncfs(channels[0].fd) != 0:
            for channel in channels:
                _fsync(channel)


def _libc_syncfs() -> Callable[[int], int] | None:
    """`syncfs(2)` from the C library (not in Python's `os`); None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        syncfs: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):
        return None
    return syncfs


_SHARED = PerProcess(GroupCommitWriter)


def shared_writer() -> GroupCommitWriter:
    """The process's writer (its thread starts with the first write)."""
    return _SHARED.get()

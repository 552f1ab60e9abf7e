"""The group-commit writer: the journal appends of every run, written and fsynced off the loop.

A supervisor drives hundreds of runs on one event loop, so no run may make the loop wait for a
disk. One daemon thread takes the appends that every run of the process queues, in arrival
order, and commits them in batches: it writes each record of the batch, then fsyncs each file
the batch touched, once, and only then resolves each append's future, on the append's own event
loop. A run therefore moves on only once its record is durable, waits for the commit that covers
its record and nothing else, and the loop never blocks on a write or an fsync.

Each run has a file of its own, so a batch makes one fsync per touched file; they run in parallel
on a few helper threads, because concurrent fsyncs on one filesystem share its journal commit
(ext4, 200 files: 0.53 s fsynced one after another, about 20 ms on 4 to 16 threads).

An append queued with `sync=False` (the intent record of a `retry` tool) is written but causes no
fsync of its own: the next synced append to that file is written after it, and its fsync covers
both. The first write or fsync that fails on a file sticks to that file's `Channel`: the appends
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

from fisk_sm.events.threads import Batches, PerProcess

__all__ = ["FSYNC_THREADS", "Channel", "GroupCommitWriter", "shared_writer"]

#: Helper threads for the fsyncs of one batch (more did not help in the measurement above).
FSYNC_THREADS = 8


@attrs.define(eq=False)
class Channel:
    """One file's lane through the writer: its descriptor and its first failure."""

    fd: int
    #: The first write or fsync error on this file; every later append fails with it.
    failure: OSError | None = None
    #: Appends queued or being committed (guarded by the writer's lock).
    queued: int = 0


@attrs.define(eq=False)
class _Append:
    channel: Channel
    data: bytes
    sync: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


@attrs.define(eq=False)
class _After:
    """Work to do once every append queued before it has been committed (closing a file)."""

    channel: Channel
    work: Callable[[], None]
    done: concurrent.futures.Future[None]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write (a signal, a nearly full disk) is completed, not dropped
        view = view[os.write(fd, view) :]


def _fsync(channel: Channel) -> None:
    try:
        os.fsync(channel.fd)
    except OSError as exc:
        channel.failure = exc


def _settle(outcomes: list[tuple[asyncio.Future[None], OSError | None]]) -> None:
    """Resolve futures on their loop's thread (called there through call_soon_threadsafe)."""
    for future, failure in outcomes:
        if future.done():  # only ever cancelled: nobody waits for it any more
            continue
        if failure is None:
            future.set_result(None)
        else:
            future.set_exception(failure)


class GroupCommitWriter:
    """A daemon thread that commits queued appends in batches; see the module docstring."""

    def __init__(self, *, threads: int = FSYNC_THREADS, syncfs: bool = False) -> None:
        """`threads` fsync a batch's files in parallel (1: one after another on the writer
        thread); `syncfs` makes a batch one `syncfs(2)` of the filesystem instead (Linux; it
        flushes every file there, other processes' included; measured in bench/journal.py)."""
        self._batches: Batches[_Append | _After] = Batches()
        self._thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads = threads
        self._syncfs = _libc_syncfs() if syncfs else None

    def submit(self, channel: Channel, data: bytes, *, sync: bool = True) -> asyncio.Future[None]:
        """Queue `data` for `channel`'s file; the future resolves once it is durable.

        Call it on the thread of a running event loop: the future belongs to that loop. It
        fails with the file's `OSError` if the write or the fsync failed. With `sync=False` it
        resolves once written; a later synced append to the file makes it durable.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._batches.cond:
            self._start()
            channel.queued += 1
            self._batches.put_locked(_Append(channel, data, sync, loop, future))
        return future

    def after_pending(
        self, channel: Channel, work: Callable[[], None]
    ) -> concurrent.futures.Future[None] | None:
        """Run `work` once `channel`'s queued appends are committed.

        Returns None when nothing is queued for `channel` (the caller runs `work` itself, at
        once); otherwise a future that resolves when the writer thread has run it.
        """
        with self._batches.cond:
            if channel.queued == 0:
                return None
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._batches.put_locked(_After(channel, work, done))
            return done

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="fisk-journal", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            batch = self._batches.take()
            try:
                self._commit(batch)
            # A boundary: this thread serves every run's appends, so a bug here must fail the
            # batch's appends (with EIO) and keep serving, never hang their runs.
            except Exception as exc:
                failure = OSError(errno.EIO, f"journal writer failed: {exc!r}")
                for item in batch:
                    item.channel.failure = item.channel.failure or failure
                self._commit(batch)  # writes nothing now; resolves and runs what waits

    def _commit(self, batch: list[_Append | _After]) -> None:
        """Write the batch, fsync each touched file once, then resolve and run what waits."""
        appends = [item for item in batch if isinstance(item, _Append)]
        touched: dict[Channel, None] = {}  # an ordered set
        for item in appends:
            channel = item.channel
            if channel.failure is not None:
                continue
            try:
                _write_all(channel.fd, item.data)
            except OSError as exc:
                channel.failure = exc
            else:
                if item.sync:
                    touched[channel] = None
        to_sync = [channel for channel in touched if channel.failure is None]
        if self._syncfs is not None and len(to_sync) > 1:
            self._sync_filesystem(self._syncfs, to_sync)
        elif len(to_sync) == 1 or (to_sync and self._threads <= 1):
            for channel in to_sync:
                _fsync(channel)
        elif to_sync:
            list(self._fsync_pool().map(_fsync, to_sync))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], OSError | None]]]
        by_loop = {}
        for item in appends:
            by_loop.setdefault(item.loop, []).append((item.future, item.channel.failure))
        with self._batches.cond:
            for item in appends:
                item.channel.queued -= 1
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

    def _fsync_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="fisk-fsync"
            )
        return self._pool

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

"""fsync with no thread: Linux kernel AIO, for the append of a run that has the writer to itself.

A run on its own pays for the group-commit writer's thread twice an append: the loop wakes the
writer, the writer wakes the loop, and each wake is a context switch and a hand-over of the
GIL (about 90 µs a round trip on a small VM, measured in bench/journal.py). When the writer has
nothing queued, `FileJournal.append` instead writes the record's line itself (a small write
into the page cache, as an unsynced intent already is) and asks the kernel for the fsync with
`io_submit(IOCB_CMD_FSYNC)` (`caio`'s binding): the kernel runs that fsync on a worker of its own
(Linux 4.18 and later) and reports its end on an eventfd the loop watches. The loop never waits
for the disk, and no Python thread takes part. The guarantee is fsync(2)'s, the same call.

One context per event loop, made on first use. `for_running_loop()` is None where there is no
such fsync: not Linux, no `caio`, no context to be had (the kernel's `aio-max-nr` is used up),
or a request the kernel refused once (at its submit, or EINVAL at its end: the loop's context is
then set aside for good); the writer's thread serves those appends as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import sys
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caio.abstract import AbstractOperation as Operation

__all__ = ["LoopSync", "for_running_loop"]

#: Requests in flight a context allows (one per run appending on its own at the same instant).
MAX_REQUESTS = 64
#: strerror text -> errno: the binding reports a failed request by its message only.
_ERRNO_OF = {os.strerror(code): code for code in errno.errorcode}
_CONTEXTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopSync | None]
_CONTEXTS = weakref.WeakKeyDictionary()


class LoopSync:
    """A loop's kernel-AIO context: `fsync(fd)` gives a future resolved on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from caio import linux_aio  # a C extension: loaded on first use

        self._operation = linux_aio.Operation
        self._context = linux_aio.Context(max_requests=MAX_REQUESTS)
        self._in_flight: dict[Operation, asyncio.Future[None]] = {}
        self.usable = True
        self.synced = 0  # fsyncs the kernel did
        self._loop = weakref.ref(loop)
        loop.add_reader(self._context.fileno, self._completed)

    @property
    def in_flight(self) -> int:
        """fsyncs requested and not yet seen to end."""
        return len(self._in_flight)

    def fsync(self, fd: int) -> asyncio.Future[None]:
        """Start an fsync of `fd`; the future resolves once it is done, or fails with its
        `OSError`. Raises `OSError` if the kernel would not take the request."""
        loop = self._loop()
        if loop is None:  # pragma: no cover - a loop that is gone runs nothing
            raise OSError(errno.EBADF, "event loop closed")
        future: asyncio.Future[None] = loop.create_future()
        operation = self._operation.fsync(fd)
        operation.set_callback(functools.partial(self._done, operation, fd))
        self._in_flight[operation] = future  # the operation lives until its end is read
        try:  # the binding refuses with ValueError, OverflowError, SystemError or OSError
            taken = self._context.submit(operation)
        except (ValueError, OverflowError, SystemError, OSError) as exc:
            taken, refusal = 0, _os_error(exc)
        else:
            refusal = OSError(errno.EAGAIN, "the kernel did not take the fsync")
        if taken != 1:  # this loop asks no more: the writer's thread fsyncs from now on
            del self._in_flight[operation]
            self.usable = False
            raise refusal
        return future

    def _completed(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a zero count: the events are read anyway
            self._context.poll()
        while self._context.process_events():
            pass

    def _done(self, operation: Operation, fd: int, _result: object) -> None:
        future = self._in_flight.pop(operation, None)
        if future is None or future.done():
            return
        try:
            operation.get_value()
        except (SystemError, OSError) as exc:
            failure = _os_error(exc)
            if failure.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                future.set_exception(failure)
                return
            # this file system takes no AIO fsync: a thread does this one, the writer the rest
            self.usable = False
            thread = asyncio.get_running_loop().run_in_executor(None, os.fsync, fd)
            thread.add_done_callback(functools.partial(_copy_outcome, future))
        else:
            self.synced += 1
            future.set_result(None)


def _copy_outcome(future: asyncio.Future[None], thread: asyncio.Future[None]) -> None:
    if future.done():
        return
    failure = thread.exception()
    if failure is None:
        future.set_result(None)
    else:
        future.set_exception(failure)


def _os_error(exc: BaseException) -> OSError:
    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    return OSError(_ERRNO_OF.get(text, errno.EIO), text)


def for_running_loop() -> LoopSync | None:
    """The running loop's context (made now if this is the first call), or None (see the
    module)."""
    if not sys.platform.startswith("linux"):
        return None
    loop = asyncio.get_running_loop()
    try:
        found = _CONTEXTS[loop]
    except KeyError:
        try:
            found = LoopSync(loop)
        except (ImportError, OSError, SystemError, NotImplementedError):
            found = None  # no caio, no context to be had, or a loop that watches no fds
        _CONTEXTS[loop] = found
    return found if found is not None and found.usable else None

"""One background worker per process, made on first use and forgotten in a forked child.

The JSON Lines writer (`fisk_sm.events.linewriter`) and the journal's group-commit writer
(`fisk_sm.journal.writer`) each run one thread for every run of the process. A forked child has
none of its parent's threads, so it must start workers of its own instead of queueing work for a
thread that does not exist there.

`Fanout` runs one function over a batch of items on a few helper threads and the caller's (the
group-commit writer's fsyncs): the items go on one C-level queue and the caller waits once for
the batch, where an executor would build a future, a condition and its lock for every item.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Batches", "Fanout", "PerProcess"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """The one `T` of this process, made by `factory` on the first `get()`."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The process's instance, made now if this is the first call."""
        with self._lock:
            if self._value is None:
                self._value = self._factory()
            return self._value


class Batches(Generic[T]):
    """Work queued by many threads and taken by one worker a whole batch at a time.

    Hold `cond` to queue (`put_locked`) together with any bookkeeping that must happen under
    the same lock; the worker's `take` waits until something is queued and takes all of it.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._items: list[T] = []

    def put_locked(self, item: T) -> None:
        """Queue `item` and wake the worker; the caller holds `cond`."""
        self._items.append(item)
        self.cond.notify()

    def take(self) -> list[T]:
        """Everything queued, once there is something (blocks the worker until then)."""
        with self.cond:
            while not self._items:
                self.cond.wait()
            batch, self._items = self._items, []
            return batch


class _Countdown:
    """One batch of a `Fanout`: how many items are left, and a lock released by the last."""

    def __init__(self, items: int) -> None:
        self.left = items
        self.failed = False
        self._count = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()

    def run(self, call: Callable[[], object]) -> None:
        returned = False
        try:
            call()
            returned = True
        finally:  # an item that raised (a bug) still counts, and its batch is marked failed
            with self._count:
                self.left -= 1
                self.failed = self.failed or not returned
                last = self.left == 0
            if last:
                self.done.release()


class Fanout:
    """`run(fn, items)` calls `fn` on every item, on up to `threads` daemon helpers (started on
    first need, named `name`) and on the calling thread, and returns once all calls have.

    `fn` is to handle its own errors. Should it raise anyway (a bug), `run` raises: the error
    itself if it was the calling thread's item (at once), else a `RuntimeError` once the others
    are done, the helper having died with the traceback (`threading.excepthook`) and a new one
    taking its place. One caller at a time.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._threads = threads
        self._name = name
        self._started = 0
        self._jobs: queue.SimpleQueue[tuple[_Countdown, Callable[[], object]]]
        self._jobs = queue.SimpleQueue()

    def run(self, fn: Callable[[T], object], items: list[T]) -> None:
        """Call `fn` on each of `items` in parallel; returns when every call has returned."""
        if not items:
            return
        batch = _Countdown(len(items))
        while self._started < min(self._threads, len(items) - 1):
            self._started += 1
            name = f"{self._name}_{self._started}"
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        for item in items:
            self._jobs.put((batch, functools.partial(fn, item)))
        while True:  # the caller takes its share instead of sleeping at once
            try:
                job, call = self._jobs.get_nowait()
            except queue.Empty:
                break
            job.run(call)
        batch.done.acquire()
        if batch.failed:
            raise RuntimeError(f"an item of a {self._name} batch raised on a helper thread")

    def _serve(self) -> None:
        try:
            while True:
                job, call = self._jobs.get()
                job.run(call)
        finally:  # an item raised here: the next batch starts a helper in this one's place
            self._started -= 1

"""One background worker per process, made on first use and forgotten in a forked child.

The JSON Lines writer (`fisk_sm.events.linewriter`) and the journal's group-commit writer
(`fisk_sm.journal.writer`) each run one thread for every run of the process. A forked child has
none of its parent's threads, so it must start workers of its own instead of queueing work for a
thread that does not exist there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Batches", "PerProcess"]

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

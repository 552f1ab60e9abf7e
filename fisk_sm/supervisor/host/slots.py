"""`Slots`: the host's bound on the steps in flight (a model request, a tool), shared by every
run it drives. A run waits for a slot only around such a step; a suspend-now stops the wait."""

from __future__ import annotations

import asyncio
import contextlib

from fisk_sm.config.states import States

__all__ = ["SLOT_STATES", "Slots"]

#: The states whose step holds a concurrency slot: a model request, a tool.
SLOT_STATES = frozenset({States.CALL, States.EXECUTE})


class Slots:
    """At most `n` steps at once."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"concurrency must be at least 1, not {n}")
        self._semaphore = asyncio.Semaphore(n)

    async def acquire(self, stopping: asyncio.Event) -> bool:
        """Wait for a slot; False (and no slot) if `stopping` (a suspend-now) stopped the wait."""
        if stopping.is_set():
            return False
        semaphore = self._semaphore
        if not semaphore.locked():  # a slot is free: `acquire` takes it without waiting, so
            return await semaphore.acquire()  # no tasks to race the stop (none can come)
        acquire = asyncio.ensure_future(self._semaphore.acquire())
        stop = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not acquire.done():
                acquire.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquire
        return not acquire.cancelled()

    def release(self) -> None:
        """Give a slot back."""
        self._semaphore.release()

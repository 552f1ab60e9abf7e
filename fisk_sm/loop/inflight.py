"""`InFlight`: the one model request of a run that a suspend-now may cancel.

The `call` action awaits its request through `InFlight.run`, which runs it as its own task;
`cancel()` (what `Run.request_suspend(now=True)` does) cancels that task, from any thread, and
the action then sees `CallCancelled` instead of a reply. A request cancelled this way was never
answered, so nothing of it is journaled: the run ends `suspended` and a resume calls again. A
cancel that comes before the request starts stops it from starting; one that comes after the
reply has arrived changes nothing (the suspend then takes effect at the next boundary).
Cancelling the task that drives the run (a second signal) is not a suspend: it propagates.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import asyncio

__all__ = ["CallCancelled", "InFlight"]

T = TypeVar("T")


class CallCancelled(Exception):
    """The request was cancelled by a suspend-now before it was answered."""


class InFlight:
    """Holds the request in flight, if any, and whether a suspend-now was asked for."""

    def __init__(self) -> None:
        self.cancel_requested = False
        self._task: asyncio.Task[object] | None = None

    def cancel(self) -> None:
        """Cancel the request in flight (and any later one); safe from any thread."""
        self.cancel_requested = True
        task = self._task
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def run(self, request: Coroutine[object, object, T]) -> T:
        """Await `request` as a cancellable task; `CallCancelled` if `cancel()` stopped it."""
        import asyncio

        if self.cancel_requested:
            request.close()
            raise CallCancelled
        task = asyncio.ensure_future(request)
        self._task = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the run itself is being cancelled (an abort), not suspended
            if not (self.cancel_requested and task.cancelled()):
                raise
            raise CallCancelled from None
        finally:
            self._task = None
            if not task.done():  # the run's own cancellation reached us first
                task.cancel()

"""A synchronous tool's call, on a daemon thread of its own.

The event loop stays free while a blocking tool works (signals, timeouts and the other runs of a
supervisor are served by it). The thread is neither the loop's default executor nor any
`concurrent.futures` pool: `asyncio.run` waits for the default executor's threads when it ends,
and `concurrent.futures` joins its workers at exit, so a tool that hangs there keeps the process
alive after its run has timed it out and finished. A thread cannot be stopped: a call whose
waiter gives up (a timeout, a cancel) goes on, detached, and its result is dropped; being a
daemon, it does not hold the process up when it exits.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = ["call_in_thread"]


async def call_in_thread(fn: Callable[..., Any], arguments: Mapping[str, Any], name: str) -> Any:
    """`fn(**arguments)` on a new daemon thread (named after the tool), in a copy of the
    caller's context; what it returns or raises. Cancelling the wait leaves the thread running."""
    import asyncio

    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():  # the waiter gave up (a timeout, a cancel)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def work() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, **arguments)
        except BaseException as exc:  # handed to the waiter, as a worker pool does
            error = exc
        # The run may be over and its loop closed by the time a detached call returns.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"fisk-sm tool {name}", daemon=True).start()
    return await done

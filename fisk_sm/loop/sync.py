"""`SyncRun`: a blocking facade over a `Run`, usable from any thread, even one running a loop.

A debugger prompt is a plain synchronous caller, but it may sit inside a coroutine (`(Pdb)` at
a breakpoint in `async def main()`), on a thread whose event loop is running and blocked by the
prompt. So a `SyncRun` owns one private event loop for its whole life, so that the run's
resources stay on one loop: it runs the coroutine on that loop in the caller's thread when
the caller runs no loop, and on the same loop in a helper thread (one, long-lived) when it does.
The caller blocks until the call is done either way; the loop never runs in two threads at once.

The SDK client of an `AnthropicModel` belongs to the loop it was built on (a pooled connection
cannot move between loops: `fisk_sm.model.clients`). So during each call the run's model is a
copy of it built on the private loop (its client the private loop's own); the run's own model is
put back after the call, and `close()` releases the copy on the loop that made it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

import attrs

from fisk_sm.journal.snapshot import Snapshot
from fisk_sm.loop.explain import Explanation
from fisk_sm.machine.evaluator import Step
from fisk_sm.model.anthropic import AnthropicModel

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from fisk_sm.loop.run import Run
    from fisk_sm.loop.stops import Stops

__all__ = ["SyncRun"]

T = TypeVar("T")


def _loop_running() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SyncRun:
    """Blocking `step()`/`run()`/`run_until()` over a `Run`: `(Pdb) debugger.step()`.

    Anything else is the run's own attribute (`debugger.state`, `debugger.explain()`). At a pdb
    prompt, name it after no pdb command: `r` is pdb's `return`, `run` its restart.
    """

    def __init__(self, run: Run) -> None:
        import asyncio

        self.run_ = run
        self._runner = asyncio.Runner()
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[object] | None = None
        self._model: AnthropicModel | None = None  # the model's copy on the private loop

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await `make()` on the private loop, here or in the helper thread."""
        return self._off_any_loop(lambda: self._runner.run(self._bound(make)))

    def _off_any_loop(self, fn: Callable[[], T]) -> T:
        """`fn()` in this thread if it runs no loop, else in the helper thread."""
        if not _loop_running():
            return fn()
        import concurrent.futures

        if self._helper is None:
            self._helper = concurrent.futures.ThreadPoolExecutor(1, "fisk-sm-sync")
        future = self._helper.submit(fn)
        try:
            return future.result()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: cancel the call, then report it
            task, loop = self._task, self._runner.get_loop()
            if task is not None:
                loop.call_soon_threadsafe(task.cancel)
            concurrent.futures.wait([future])
            raise

    async def _bound(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run `make()` with the run's model swapped for its copy on this (private) loop."""
        import asyncio

        self._task = asyncio.current_task()
        harness = self.run_.harness
        original = harness.model
        if isinstance(original, AnthropicModel):
            if self._model is None:
                self._model = attrs.evolve(original)  # acquires this loop's client
            harness.model = self._model
        try:
            return await make()
        finally:
            harness.model = original
            self._task = None

    def step(self) -> Step:
        """One transition."""
        return self._call(self.run_.step)

    def run(self) -> str:
        """To a terminal state."""
        return self._call(self.run_.run)

    def run_until(
        self,
        *states: str,
        tool: str | Iterable[str] | None = None,
        iteration: int | Iterable[int] | None = None,
        approval: bool | str | Iterable[str] | None = None,
        any_of: Iterable[Stops | dict[str, object]] = (),
    ) -> str:
        """Until the conditions given all hold, or any of `any_of` does (`Run.run_until`)."""
        return self._call(
            lambda: self.run_.run_until(
                *states, tool=tool, iteration=iteration, approval=approval, any_of=any_of
            )
        )

    def run_to(self, stops: Stops) -> str | None:
        """Until `stops` (`Run.run_to`): returns why it stopped, None at the end."""
        return self._call(lambda: self.run_.run_to(stops))

    @property
    def state(self) -> str:
        """The current state."""
        return self.run_.state

    def snapshot(self) -> Snapshot:
        """A frozen copy of the run."""
        return self.run_.snapshot()

    def explain(self) -> Explanation:
        """What the next step will do (`Run.explain`)."""
        return self.run_.explain()

    def close(self) -> None:
        """Release the model's copy and close the private loop (the run itself stays open)."""
        model, self._model = self._model, None
        try:
            if model is not None:
                self._call(model.aclose)
        finally:
            self._off_any_loop(self._runner.close)
            if self._helper is not None:
                self._helper.shutdown()
                self._helper = None

    def __enter__(self) -> SyncRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> object:
        # For a person at a prompt (`r.data`); typed code uses `run_` or the properties above.
        return getattr(self.run_, name)

"""`drive`: the task that steps one run of a host to its end, and what its end leaves behind.

A run steps one transition at a time (`Run.advance`: the host never reads a step's report);
only a model request or a tool (`SLOT_STATES`) holds one of the host's slots. A suspend-now
that finds the run waiting for a slot stops the wait: in `call` the run steps without one (the
cancelled call is never made, the run ends `suspended`); in `execute` the task stops before the
tool starts, leaving the journal open there (a resume runs the tool).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from fisk_sm.config.states import States
from fisk_sm.journal.base import JournalError
from fisk_sm.loop.run import Run
from fisk_sm.supervisor.host.slots import SLOT_STATES
from fisk_sm.supervisor.view.tracked import Tracked

if TYPE_CHECKING:
    from fisk_sm.supervisor.host.host import Host

__all__ = ["drive", "let_go"]


async def drive(host: Host, tracked: Tracked, run: Run) -> None:
    """Step `run` to its end (or until a suspend-now stops it before a tool)."""
    slots = host.slots
    try:
        while not run.finished:
            if run.state not in SLOT_STATES:
                await run.advance()
                continue
            tracked.queued = True
            if await slots.acquire(tracked.stopping):
                tracked.queued = False
                try:
                    await run.advance()
                finally:
                    slots.release()
            elif run.state == States.CALL:
                await run.advance()  # a cancelled call makes no request: the run suspends
            else:
                break  # before a tool starts: the journal stays open in `execute`
    # A boundary: this task drives one run of many, so whatever stops it (a failing disk,
    # a refused journal, a bug) fails this run only, and says why in its `error`.
    except Exception as exc:
        host._failed(tracked, exc)
    finally:
        tracked.snapshot = run.snapshot()
        # Stopped before a tool, or suspended (a parked run's suspend journals that it
        # waits for its approval still, which the run's own state does not say): the
        # journal's fold is the truth, as a restart and every other host read it.
        if not run.finished or run.state == States.SUSPENDED:
            with contextlib.suppress(JournalError, OSError, ValueError):
                tracked.snapshot = await host.book.snapshot_of(run.data.run_id)
        if run.finished:
            host.desk.forget(run.data.run_id)
        await run.aclose()
        tracked.queued = False
        await host._stopped(tracked, run)
        host.book.changed(run.data.run_id)


def let_go(tracked: Tracked, run: Run, _: object) -> None:
    """The task driving `run` is done: its row is the journal's fold from now on (`Tracked`),
    so the run and all it holds are let go (fewer objects for every later pass of the cyclic
    collector: a host keeps every run it knows), unless a resume put another in its place."""
    if tracked.run is run:
        tracked.run = None

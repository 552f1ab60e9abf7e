"""A new run's two durable records, made at once: its line in the registry and its session.

A submit is answered once both are durable. Each waits for its own fsyncs (the registry's
group commit; the journal's meta record and its directory entry), so making them one after the
other made every submit wait for both in turn; together, a submit waits for the slower. A
crash between them leaves a registry line without a journal (listed, cannot resume) or a
journal without a line (never listed), and neither submit was answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fisk_sm.journal.filestore import SessionExistsError
from fisk_sm.loop.run import Run
from fisk_sm.supervisor.host.registry import RunRegistry
from fisk_sm.supervisor.view.entry import ABORTED, RegistryEntry

__all__ = ["recorded_start"]


async def recorded_start(
    registry: RunRegistry, entry: RegistryEntry, start: Awaitable[Run]
) -> tuple[RegistryEntry, Run | None]:
    """Record `entry` in `registry` while `start` makes the run's session; the entry as
    recorded (a resent submit's is the first one) and the run, once both are durable.

    The run is None if its session exists already (`SessionExistsError`: a host that died
    since started it), for the caller to adopt. Should `start` fail, a recorded run is marked
    aborted and the error raised; should the record fail, the started run is closed (its
    journal stays, unlisted) and the record's error raised.
    """
    registered = asyncio.ensure_future(registry.submitted(entry.run_id, entry.name, entry.config))
    try:
        run = await start
    except SessionExistsError:
        return await registered, None
    except BaseException:
        recorded = (await asyncio.gather(registered, return_exceptions=True))[0]
        if isinstance(recorded, RegistryEntry):
            await registry.mark(ABORTED, entry.run_id)
        raise
    try:
        return await registered, run
    except BaseException:
        await run.aclose()
        raise

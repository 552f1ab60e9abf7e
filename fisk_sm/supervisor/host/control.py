"""`LocalControl`: the control API's `HostControl` over one supervisor in this process.

The API calls it and nothing else of the supervisor; it answers with the plain records of
`fisk_sm.supervisor.interface` (a run's row taken now, its page, the pending approvals), and
reads what a row does not carry (the states a run entered, its journal's path) here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fisk_sm.client.records import Approval
from fisk_sm.journal.base import JournalError
from fisk_sm.machine.path import PathError, SessionPath, session_path
from fisk_sm.supervisor.host.desk import ANSWERS
from fisk_sm.supervisor.interface import (
    Action,
    Answer,
    EventFeed,
    RunRow,
    ShownRun,
    SubmitRequest,
)
from fisk_sm.supervisor.view.rows import transcript

if TYPE_CHECKING:
    from fisk_sm.supervisor.host.host import Supervisor
    from fisk_sm.supervisor.view.tracked import Tracked

__all__ = ["LocalControl"]


class LocalControl:
    """`HostControl` over `host`, whose hub holds the last `event_buffer` events if given."""

    def __init__(self, host: Supervisor, *, event_buffer: int | None = None) -> None:
        self.host = host
        if event_buffer is not None:
            host.hub.resize(event_buffer)

    @property
    def config_path(self) -> Path | None:
        return self.host.config.path

    @property
    def events(self) -> EventFeed:
        return self.host.hub

    async def submit(self, request: SubmitRequest) -> RunRow:
        host = self.host
        start = host.submit_chat if request.chat else host.submit
        return (await start(request.prompt, request.name, request.config)).row()

    async def listing(self) -> Sequence[RunRow]:
        await self.host.refresh()
        return [tracked.row() for tracked in self.host.listing()]

    async def row(self, run_id: str) -> RunRow:
        return self.host.get(run_id).row()

    async def show(self, run_id: str) -> ShownRun:
        await self.host.refresh()
        tracked = self.host.get(run_id)
        path = await self._path(run_id)
        states = path.states if path is not None else tuple(tracked.sink.states)
        return ShownRun(tracked.row(), transcript(tracked.messages()), states)

    async def session_path(self, run_id: str) -> SessionPath | None:
        self.host.get(run_id)
        return await self._path(run_id)

    async def _path(self, run_id: str) -> SessionPath | None:
        try:
            records = await self.host.records_of(run_id)
            return await asyncio.to_thread(session_path, records)
        except (PathError, OSError, ValueError, JournalError):
            return None

    async def approvals(self) -> Sequence[Approval]:
        await self.host.refresh()
        return [Approval(**approval) for approval in self.host.approvals()]

    async def act(self, run_id: str, action: Action) -> RunRow:
        host = self.host
        acts = {"suspend": host.suspend, "resume": host.resume, "abort": host.abort}
        tracked: Tracked = await acts.get(action, host.end)(run_id)
        return tracked.row()

    async def say(self, run_id: str, text: str) -> RunRow:
        return (await self.host.say(run_id, text)).row()

    async def answer(self, run_id: str, tool_use_id: str, answer: Answer) -> RunRow:
        return (await self.host.answer(run_id, tool_use_id, ANSWERS[answer])).row()

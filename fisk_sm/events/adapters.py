"""Event adapters that write structured records: structlog, and a JSON Lines stream.

Library etiquette: nothing here configures logging. `StructlogEvents` logs each event through
the logger it is given (or `structlog.get_logger("fisk_sm")`) and leaves rendering to the
application. `JsonLinesEvents` writes one JSON object per event to a text stream, for a
supervisor or a test to read; the writing happens on a background thread
(`fisk_sm.events.linewriter`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol, TextIO

import attrs
import structlog

from fisk_sm.events.linewriter import Lane, shared_line_writer
from fisk_sm.events.types import Event, ToolFinished, WarningRaised

__all__ = ["JsonLinesEvents", "Logger", "StructlogEvents", "event_fields"]

OUTPUT_CAP = 2048


def event_fields(event: Event) -> dict[str, object]:
    """An event's fields as its adapters write them (a long tool output capped, and marked)."""
    fields = event.fields()
    if isinstance(event, ToolFinished) and len(event.output) > OUTPUT_CAP:
        fields["output"] = event.output[:OUTPUT_CAP]
        fields["truncated"] = True
    return fields


class Logger(Protocol):
    """What `StructlogEvents` asks of its logger: a structlog bound logger has it."""

    def info(self, event: str, **fields: object) -> object:
        """Log `event` with `fields` at info level."""
        ...

    def warning(self, event: str, **fields: object) -> object:
        """Log `event` with `fields` at warning level."""
        ...


@attrs.define
class StructlogEvents:
    """Logs every event; warnings at warning level, everything else at info."""

    logger: Logger = attrs.field(factory=lambda: structlog.get_logger("fisk_sm"))

    def emit(self, event: Event) -> None:
        """Log `event` under its kind, with its fields as key-value pairs."""
        fields = event_fields(event)
        if isinstance(event, WarningRaised):
            self.logger.warning("agent advisory", **fields)
        else:
            self.logger.info(event.kind, **fields)


@attrs.define
class JsonLinesEvents:
    """Writes `{"event": kind, ...fields}` per line, in order, flushed so a reader sees it soon.

    `emit` only queues the line: a background thread shared by every stream writes and flushes
    it, so a slow disk or reader never stalls the event loop. `close()` (or `await aclose()`)
    waits until every line emitted so far is written and flushed; the stream stays open (it is
    the caller's), and the first write error, if any, is raised there.
    """

    stream: TextIO
    _lane: Lane = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._lane = Lane(self.stream)

    def emit(self, event: Event) -> None:
        """Queue one line for `event`."""
        line = json.dumps({"event": event.kind, **event_fields(event)}, default=str)
        shared_line_writer().put(self._lane, line + "\n")

    def close(self) -> None:
        """Block until every line emitted so far is written and flushed."""
        shared_line_writer().drain()
        if self._lane.error is not None:
            raise self._lane.error

    async def aclose(self) -> None:
        """`close()` from a worker thread, so the event loop does not wait."""
        await asyncio.to_thread(self.close)

"""Event adapters that write structured records: structlog, and a JSON Lines stream.

Library etiquette: nothing here configures logging. `StructlogEvents` logs each event through
the logger it is given (or `structlog.get_logger("fisk_sm")`) and leaves rendering to the
application. `JsonLinesEvents` writes one JSON object per event to a text stream, for a
supervisor or a test to read.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import attrs
import structlog

from fisk_sm.events.types import Event, ToolFinished, WarningRaised

__all__ = ["JsonLinesEvents", "StructlogEvents"]

OUTPUT_CAP = 2048


def _fields(event: Event) -> dict[str, Any]:
    fields = event.fields()
    if isinstance(event, ToolFinished) and len(event.output) > OUTPUT_CAP:
        fields["output"] = event.output[:OUTPUT_CAP]
        fields["truncated"] = True
    return fields


@attrs.define
class StructlogEvents:
    """Logs every event; warnings at warning level, everything else at info."""

    logger: Any = attrs.field(factory=lambda: structlog.get_logger("fisk_sm"))

    def emit(self, event: Event) -> None:
        """Log `event` under its kind, with its fields as key-value pairs."""
        fields = _fields(event)
        if isinstance(event, WarningRaised):
            self.logger.warning("agent advisory", **fields)
        else:
            self.logger.info(event.kind, **fields)


@attrs.define
class JsonLinesEvents:
    """Writes `{"event": kind, ...fields}` per line and flushes, so a reader sees it at once."""

    stream: TextIO

    def emit(self, event: Event) -> None:
        """Write one line for `event`."""
        line = json.dumps({"event": event.kind, **_fields(event)}, default=str)
        self.stream.write(line + "\n")
        self.stream.flush()

"""Typed events and the adapters that deliver them (structlog, JSON Lines).

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.events.adapters import JsonLinesEvents, StructlogEvents
    from fisk_sm.events.otel import OtelEvents
    from fisk_sm.events.types import (
        ApprovalAsked,
        ApprovalDenied,
        ApprovalGranted,
        Event,
        Events,
        Fanout,
        GatedCall,
        MessageReceived,
        Recorder,
        RunEnded,
        RunResumed,
        RunStarted,
        StateEntered,
        ToolCalled,
        ToolFinished,
        WarningRaised,
    )
    from fisk_sm.events.usage import Usage

_EXPORTS = {
    "ApprovalAsked": "fisk_sm.events.types",
    "ApprovalDenied": "fisk_sm.events.types",
    "ApprovalGranted": "fisk_sm.events.types",
    "Event": "fisk_sm.events.types",
    "Events": "fisk_sm.events.types",
    "Fanout": "fisk_sm.events.types",
    "GatedCall": "fisk_sm.events.types",
    "MessageReceived": "fisk_sm.events.types",
    "Recorder": "fisk_sm.events.types",
    "RunEnded": "fisk_sm.events.types",
    "RunResumed": "fisk_sm.events.types",
    "RunStarted": "fisk_sm.events.types",
    "StateEntered": "fisk_sm.events.types",
    "ToolCalled": "fisk_sm.events.types",
    "ToolFinished": "fisk_sm.events.types",
    "WarningRaised": "fisk_sm.events.types",
    "Usage": "fisk_sm.events.usage",
    "JsonLinesEvents": "fisk_sm.events.adapters",
    "StructlogEvents": "fisk_sm.events.adapters",
    "OtelEvents": "fisk_sm.events.otel",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "ApprovalAsked",
    "ApprovalDenied",
    "ApprovalGranted",
    "Event",
    "Events",
    "Fanout",
    "GatedCall",
    "JsonLinesEvents",
    "MessageReceived",
    "OtelEvents",
    "Recorder",
    "RunEnded",
    "RunResumed",
    "RunStarted",
    "StateEntered",
    "StructlogEvents",
    "ToolCalled",
    "ToolFinished",
    "Usage",
    "WarningRaised",
]

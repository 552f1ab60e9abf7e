"""fisk-sm: an Anthropic tool-using agent loop as an explicit, steppable state machine.

This module is the public API; everything a user imports comes from here.
"""

from __future__ import annotations

from fisk_sm.cli.lineui import LineUI
from fisk_sm.config.agent import (
    AgentConfig,
    Budget,
    ConfigError,
    LLMConfig,
    load_config,
    parse_config,
)
from fisk_sm.events.adapters import JsonLinesEvents, StructlogEvents
from fisk_sm.events.types import (
    Event,
    Events,
    Fanout,
    MessageReceived,
    Recorder,
    RunEnded,
    RunStarted,
    StateEntered,
    ToolCalled,
    ToolFinished,
    WarningRaised,
)
from fisk_sm.journal.base import Journal, JournalError, MemoryJournal
from fisk_sm.journal.snapshot import RunData, Snapshot, Usage
from fisk_sm.loop.run import Run, RunFinished, SyncRun
from fisk_sm.machine.evaluator import Step
from fisk_sm.model.anthropic import AnthropicModel, ModelClient, ModelError, ModelRequest
from fisk_sm.tools.base import Outcome, Tool, ToolBox, tool

__all__ = [
    "AgentConfig",
    "AnthropicModel",
    "Budget",
    "ConfigError",
    "Event",
    "Events",
    "Fanout",
    "Journal",
    "JournalError",
    "JsonLinesEvents",
    "LLMConfig",
    "LineUI",
    "MemoryJournal",
    "MessageReceived",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "Outcome",
    "Recorder",
    "Run",
    "RunData",
    "RunEnded",
    "RunFinished",
    "RunStarted",
    "Snapshot",
    "StateEntered",
    "Step",
    "StructlogEvents",
    "SyncRun",
    "Tool",
    "ToolBox",
    "ToolCalled",
    "ToolFinished",
    "Usage",
    "WarningRaised",
    "load_config",
    "parse_config",
    "tool",
]

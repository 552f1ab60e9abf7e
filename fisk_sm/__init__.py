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
from fisk_sm.config.mcp import McpServer
from fisk_sm.events.adapters import JsonLinesEvents, StructlogEvents
from fisk_sm.events.types import (
    ApprovalAsked,
    ApprovalDenied,
    ApprovalGranted,
    Event,
    Events,
    Fanout,
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
from fisk_sm.journal.base import Journal, JournalError, MemoryJournal, SessionStore
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.jetstream import JetStreamJournal, JetStreamStore
from fisk_sm.journal.snapshot import RunData, Snapshot, Usage
from fisk_sm.loop.actions import Inbox, InputSource
from fisk_sm.loop.explain import Explanation
from fisk_sm.loop.fingerprint import ResumeRefused
from fisk_sm.loop.harness import Harness, RunOptions
from fisk_sm.loop.replay import ReplayDiverged, ReplayModel, recorded_tools, replay
from fisk_sm.loop.run import Run, RunFinished, SyncRun
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.evaluator import GuardCheck, Step
from fisk_sm.model.anthropic import AnthropicModel, ModelClient, ModelError, ModelRequest
from fisk_sm.operator.prompter import Approval, Prompter, ScriptedPrompter
from fisk_sm.supervisor import ApprovalDesk, DeskPrompter, Supervisor
from fisk_sm.tools.base import Outcome, Tool, ToolBox, ToolError, tool

__all__ = [
    "AgentConfig",
    "AnthropicModel",
    "Approval",
    "ApprovalAsked",
    "ApprovalDenied",
    "ApprovalDesk",
    "ApprovalGranted",
    "Budget",
    "ConfigError",
    "DeskPrompter",
    "Event",
    "Events",
    "Explanation",
    "Fanout",
    "FileStore",
    "GuardCheck",
    "Harness",
    "Inbox",
    "InputSource",
    "JetStreamJournal",
    "JetStreamStore",
    "Journal",
    "JournalError",
    "JsonLinesEvents",
    "LLMConfig",
    "LineUI",
    "McpServer",
    "MemoryJournal",
    "MessageReceived",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "Outcome",
    "Prompter",
    "Recorder",
    "ReplayDiverged",
    "ReplayModel",
    "ResumeRefused",
    "Run",
    "RunData",
    "RunEnded",
    "RunFinished",
    "RunOptions",
    "RunResumed",
    "RunStarted",
    "ScriptedPrompter",
    "SessionStore",
    "Snapshot",
    "StateEntered",
    "Step",
    "StructlogEvents",
    "Supervisor",
    "SyncRun",
    "Tool",
    "ToolBox",
    "ToolCalled",
    "ToolError",
    "ToolFinished",
    "Usage",
    "WarningRaised",
    "fold",
    "load_config",
    "parse_config",
    "recorded_tools",
    "replay",
    "resume_session",
    "start_session",
    "tool",
]

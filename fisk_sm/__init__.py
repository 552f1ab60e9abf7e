"""fisk-sm: an Anthropic tool-using agent loop as an explicit, steppable state machine.

This module is the public API: the names in `__all__`, each documented in the README's "Python
API" section. Importing it costs nothing: each name is imported the first time it is used
(PEP 562), so `import fisk_sm` loads no third-party module and `from fisk_sm import Run, tool`
loads the core alone, never the command line, the supervisor or the HTTP stack. Everything else
is reached through its subpackage (`fisk_sm.events`, `fisk_sm.journal`, `fisk_sm.tools`, ...).
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.config.agent import AgentConfig, ConfigError, load_config, parse_config
    from fisk_sm.events.adapters import JsonLinesEvents, StructlogEvents
    from fisk_sm.events.types import Event, Events, Recorder
    from fisk_sm.journal.base import MemoryJournal
    from fisk_sm.journal.filestore import FileStore
    from fisk_sm.journal.fold import fold
    from fisk_sm.journal.snapshot import Snapshot
    from fisk_sm.loop.explain import Explanation
    from fisk_sm.loop.fingerprint import ResumeRefused
    from fisk_sm.loop.harness import Harness, RunOptions
    from fisk_sm.loop.replay import ReplayDiverged, replay
    from fisk_sm.loop.run import Run
    from fisk_sm.loop.sessions import resume_session, start_session
    from fisk_sm.loop.sync import SyncRun
    from fisk_sm.machine.evaluator import Step
    from fisk_sm.operator.prompter import Approval, Prompter, ScriptedPrompter
    from fisk_sm.supervisor.host.host import Supervisor
    from fisk_sm.tools.base import Tool, tool

#: Where each public name lives (imported on first use).
_EXPORTS = {
    "AgentConfig": "fisk_sm.config.agent",
    "ConfigError": "fisk_sm.config.agent",
    "load_config": "fisk_sm.config.agent",
    "parse_config": "fisk_sm.config.agent",
    "Event": "fisk_sm.events.types",
    "Events": "fisk_sm.events.types",
    "Recorder": "fisk_sm.events.types",
    "JsonLinesEvents": "fisk_sm.events.adapters",
    "StructlogEvents": "fisk_sm.events.adapters",
    "MemoryJournal": "fisk_sm.journal.base",
    "FileStore": "fisk_sm.journal.filestore",
    "fold": "fisk_sm.journal.fold",
    "Snapshot": "fisk_sm.journal.snapshot",
    "Explanation": "fisk_sm.loop.explain",
    "ResumeRefused": "fisk_sm.loop.fingerprint",
    "Harness": "fisk_sm.loop.harness",
    "RunOptions": "fisk_sm.loop.harness",
    "ReplayDiverged": "fisk_sm.loop.replay",
    "replay": "fisk_sm.loop.replay",
    "Run": "fisk_sm.loop.run",
    "SyncRun": "fisk_sm.loop.sync",
    "resume_session": "fisk_sm.loop.sessions",
    "start_session": "fisk_sm.loop.sessions",
    "Step": "fisk_sm.machine.evaluator",
    "Approval": "fisk_sm.operator.prompter",
    "Prompter": "fisk_sm.operator.prompter",
    "ScriptedPrompter": "fisk_sm.operator.prompter",
    "Supervisor": "fisk_sm.supervisor.host.host",
    "Tool": "fisk_sm.tools.base",
    "tool": "fisk_sm.tools.base",
}

#: Names the package root exported before it was cut to `__all__`: where they live now, so
#: that an old import fails with the new path instead of a bare AttributeError.
_MOVED = {
    **dict.fromkeys(
        [
            "ApprovalAsked",
            "ApprovalDenied",
            "ApprovalGranted",
            "Fanout",
            "MessageReceived",
            "RunEnded",
            "RunResumed",
            "RunStarted",
            "StateEntered",
            "ToolCalled",
            "ToolFinished",
            "Usage",
            "WarningRaised",
        ],
        "fisk_sm.events",
    ),
    **dict.fromkeys(["Budget", "LLMConfig", "McpServer"], "fisk_sm.config"),
    **dict.fromkeys(["Journal", "JournalError", "SessionStore", "RunData"], "fisk_sm.journal"),
    **dict.fromkeys(["JetStreamJournal", "JetStreamStore"], "fisk_sm.journal.jetstream"),
    **dict.fromkeys(
        ["Inbox", "InputSource", "ReplayModel", "RunFinished", "recorded_tools"], "fisk_sm.loop"
    ),
    "GuardCheck": "fisk_sm.machine",
    **dict.fromkeys(
        ["AnthropicModel", "ModelClient", "ModelError", "ModelRequest"], "fisk_sm.model"
    ),
    **dict.fromkeys(["Outcome", "ToolBox", "ToolError"], "fisk_sm.tools"),
    **dict.fromkeys(["ApprovalDesk", "DeskPrompter"], "fisk_sm.supervisor"),
    "LineUI": "fisk_sm.cli.lineui",
}

_getattr, __dir__ = exports(__name__, _EXPORTS)


def __getattr__(name: str) -> object:
    """A public name, imported on first use; a moved one says where it went."""
    if name in _MOVED:
        raise AttributeError(
            f"fisk_sm.{name} is no longer exported by fisk_sm: import it from {_MOVED[name]}"
        )
    return _getattr(name)


__all__ = [
    "AgentConfig",
    "Approval",
    "ConfigError",
    "Event",
    "Events",
    "Explanation",
    "FileStore",
    "Harness",
    "JsonLinesEvents",
    "MemoryJournal",
    "Prompter",
    "Recorder",
    "ReplayDiverged",
    "ResumeRefused",
    "Run",
    "RunOptions",
    "ScriptedPrompter",
    "Snapshot",
    "Step",
    "StructlogEvents",
    "Supervisor",
    "SyncRun",
    "Tool",
    "fold",
    "load_config",
    "parse_config",
    "replay",
    "resume_session",
    "start_session",
    "tool",
]

"""The run: phase actions, entry hooks, the harness, fingerprints and sessions.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.loop.actions import Inbox, InputSource
    from fisk_sm.loop.explain import Explanation
    from fisk_sm.loop.fingerprint import ResumeRefused
    from fisk_sm.loop.harness import Harness, RunOptions
    from fisk_sm.loop.replay import ReplayDiverged, ReplayModel, recorded_tools
    from fisk_sm.loop.run import Run, RunFinished
    from fisk_sm.loop.sessions import resume_session, start_session
    from fisk_sm.loop.sync import SyncRun

_EXPORTS = {
    "Inbox": "fisk_sm.loop.actions",
    "InputSource": "fisk_sm.loop.actions",
    "Explanation": "fisk_sm.loop.explain",
    "ResumeRefused": "fisk_sm.loop.fingerprint",
    "Harness": "fisk_sm.loop.harness",
    "RunOptions": "fisk_sm.loop.harness",
    "ReplayDiverged": "fisk_sm.loop.replay",
    "ReplayModel": "fisk_sm.loop.replay",
    "recorded_tools": "fisk_sm.loop.replay",
    "Run": "fisk_sm.loop.run",
    "RunFinished": "fisk_sm.loop.run",
    "resume_session": "fisk_sm.loop.sessions",
    "start_session": "fisk_sm.loop.sessions",
    "SyncRun": "fisk_sm.loop.sync",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "Explanation",
    "Harness",
    "Inbox",
    "InputSource",
    "ReplayDiverged",
    "ReplayModel",
    "ResumeRefused",
    "Run",
    "RunFinished",
    "RunOptions",
    "SyncRun",
    "recorded_tools",
    "resume_session",
    "start_session",
]

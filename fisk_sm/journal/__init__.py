"""Durable runs: records, the journal protocol, fold, the file store and the state dir.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.journal.base import Journal, JournalError, MemoryJournal, SessionStore
    from fisk_sm.journal.filestore import (
        FileStore,
        InvalidIdError,
        JournalIOError,
        check_run_id,
        default_directory,
    )
    from fisk_sm.journal.snapshot import RunData, Snapshot

_EXPORTS = {
    "Journal": "fisk_sm.journal.base",
    "JournalError": "fisk_sm.journal.base",
    "MemoryJournal": "fisk_sm.journal.base",
    "SessionStore": "fisk_sm.journal.base",
    "FileStore": "fisk_sm.journal.filestore",
    "InvalidIdError": "fisk_sm.journal.filestore",
    "JournalIOError": "fisk_sm.journal.filestore",
    "check_run_id": "fisk_sm.journal.filestore",
    "default_directory": "fisk_sm.journal.filestore",
    "RunData": "fisk_sm.journal.snapshot",
    "Snapshot": "fisk_sm.journal.snapshot",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "FileStore",
    "InvalidIdError",
    "Journal",
    "JournalError",
    "JournalIOError",
    "MemoryJournal",
    "RunData",
    "SessionStore",
    "Snapshot",
    "check_run_id",
    "default_directory",
]

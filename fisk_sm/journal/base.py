"""The `Journal` protocol and the in-memory journal.

A journal is append-only. `append` must make the record durable before it returns, because the
loop moves on as soon as it does: the assistant turn is journaled before any tool runs, and each
tool result the instant its tool ends. The append contract: a seq at or below the last one is a
no-op (a replay after a lost acknowledgement), `last + 1` is written, anything higher is a gap.

An async `append` must not block the event loop while it waits for the disk: the file journal
hands its lines to a writer thread and awaits the commit (`fisk_sm.journal.writer`). The one
record that may return before its own fsync is the intent record of a `retry` tool: should a
machine crash lose it, resume runs the tool again, which is what `retry` does anyway; the fsync
of the tool's result covers it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import attrs

from fisk_sm.journal.records import Meta, Record

__all__ = [
    "Journal",
    "JournalError",
    "MemoryJournal",
    "SessionJournal",
    "SessionStore",
    "check_append",
]


class JournalError(Exception):
    """A journal could not be written or read; the message names the journal."""


class Journal(Protocol):
    """Where a run's records go."""

    @property
    def last_seq(self) -> int: ...

    async def append(self, record: Record) -> None: ...

    async def close(self) -> None: ...


class SessionJournal(Journal, Protocol):
    """The journal of a session in a store (`FileJournal`, `JetStreamJournal`)."""

    #: The records the journal held when it was handed out (read at open, the meta at create).
    records: list[Record]
    #: Tools whose `tool_started` intent needs no durable write of its own (`retry` tools).
    deferred_intents: frozenset[str]

    @property
    def path(self) -> Path:
        """How errors name the journal (its file, or `<stream>/<prefix>.<id>`)."""
        ...


class SessionStore(Protocol):
    """Where `start_session` and `resume_session` find journals (`FileStore`,
    `JetStreamStore`); both calls run on the event loop and never block it."""

    async def create_async(self, meta: Meta) -> SessionJournal:
        """Create a session whose first, durable record is `meta`."""
        ...

    async def open_async(self, run_id: str) -> SessionJournal:
        """Open a session for appending, with its records read."""
        ...


def check_append(last_seq: int, record: Record) -> bool:
    """Whether `record` must be written (False: an already-written seq, a no-op)."""
    if record.seq <= last_seq:
        return False
    if record.seq != last_seq + 1:
        raise JournalError(f"seq gap: last written {last_seq}, got {record.seq}")
    return True


@attrs.define
class MemoryJournal:
    """Keeps records in a list: for tests, benchmarks and runs that need no durability."""

    records: list[Record] = attrs.Factory(list)

    @property
    def last_seq(self) -> int:
        """The seq of the last record written (0 when empty)."""
        return self.records[-1].seq if self.records else 0

    async def append(self, record: Record) -> None:
        """Append under the append contract."""
        if check_append(self.last_seq, record):
            self.records.append(record)

    async def close(self) -> None:
        """Nothing to release."""

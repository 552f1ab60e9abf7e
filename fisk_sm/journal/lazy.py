"""The records a resume reads from a journal's checkpoint (`fisk_sm.journal.checkpoint`).

`FileStore.open` reads a journal to resume through `parse_journal(..., checkpoint=True)`, which
gives `Records`: with a checkpoint that holds, a list that has decoded only the meta and the lines
after the checkpoint, and that `fold_journal` folds from the checkpoint's facts; without one, every
record, read and checked as ever, and the line each lies on, so that the fold can take a
checkpoint for the next resume (`resume_fold` writes it, and so does `refresh_checkpoint`,
for a writer that grew a session and closes it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from fisk_sm.config.table import Table
from fisk_sm.journal import checkpoint
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.checkpoint import (
    Checkpoint,
    load_checkpoint,
    restore,
    take,
    write_checkpoint,
)
from fisk_sm.journal.fold import Folding
from fisk_sm.journal.records import Assistant, Meta, Record, User
from fisk_sm.journal.snapshot import Snapshot
from fisk_sm.journal.statedir import open_regular

__all__ = ["Records", "read_records", "refresh_checkpoint"]


def read_records(path: Path, data: bytes) -> tuple[list[Record], int]:
    """`parse_journal(path, data, checkpoint=True)`: the journal's `Records` (see the module)."""
    from fisk_sm.journal.parsing import check_version, parse_journal, parse_lines

    found = load_checkpoint(path, data)
    end = data.rfind(b"\n") + 1
    if found is None:
        records, end = parse_journal(path, data)
        if not records or not isinstance(records[0], Meta):
            return records, end  # (no line at all: the fold refuses it)
        return Records(path, data, records[0], None, records[1:]), end
    first = data[: data.index(b"\n")]
    check_version(path, first)
    meta = parse_lines(path, [first], 1)[0]
    assert isinstance(meta, Meta)  # parse_lines checks line 1 is one
    lines = data[found.size : end].split(b"\n")
    lines.pop()  # empty: the tail ends with its newline
    return Records(path, data, meta, found, parse_lines(path, lines, found.seq + 1)), end


class Records(list[Record]):
    """A journal's records, as `FileStore.open` reads them to resume (`read_records`).

    Read from a checkpoint, the records it covers are not decoded: the list holds them only once
    something reads it (any list operation but `len`, which then checks and decodes every line as
    `parse_journal` does), and `fold` needs none of them. Without a checkpoint it is a plain list
    of every record that keeps the journal's bytes, so that `fold` can take a checkpoint.
    """

    def __init__(
        self, path: Path, data: bytes, meta: Meta, base: Checkpoint | None, tail: list[Record]
    ) -> None:
        super().__init__([meta, *tail] if base is None else ())
        self.path, self.data, self.meta, self.base, self.tail = path, data, meta, base, tail
        self._whole = base is None
        self._count = (base.seq if base else 1) + len(tail)
        #: The checkpoint `fold` took at the last turn boundary it passed, if worth writing.
        self.taken: Checkpoint | None = None

    def __len__(self) -> int:
        return super().__len__() if self._whole else self._count

    def __bool__(self) -> bool:
        return len(self) > 0

    def materialise(self) -> None:
        """Decode and check the lines the checkpoint covers (once)."""
        if self._whole:
            return
        from fisk_sm.journal.parsing import parse_lines

        assert self.base is not None
        lines = self.data[: self.base.size].split(b"\n")
        lines.pop()
        super().extend([*parse_lines(self.path, lines, 1), *self.tail])
        self._whole = True

    @property
    def intact(self) -> bool:
        """Whether the list still holds what was read (nobody added or took a record)."""
        return len(self) == self._count

    def fold(self, table: Table | None = None) -> Snapshot:
        """The snapshot of these records, folded from the checkpoint when there is one; takes
        the checkpoint of the last turn boundary (`taken`) when `EVERY` records passed since."""
        base, tail = self.base, self.tail
        boundary = _last_boundary(tail) if len(tail) >= checkpoint.EVERY else -1
        track = boundary >= 0
        if base is None:
            folding = Folding(self.meta, table, track=track)
        else:
            try:
                folding = restore(base, self.meta, table, self.data, track)
            except (LookupError, ValueError, TypeError):  # a table this module did not write
                self.materialise()
                self.base, self.tail = None, self[1:]
                return self.fold(table)
        for index, record in enumerate(tail):
            folding.feed(record)
            if index == boundary:
                self.taken = take(folding, record.seq, self.data, base, tail)
        return folding.snapshot()


def _whole(name: str) -> object:
    method = getattr(list, name)

    @functools.wraps(method)
    def whole(self: Records, *args: object, **kwargs: object) -> object:
        self.materialise()
        return method(self, *args, **kwargs)

    return whole


# Every list operation but `len` reads the whole list (`materialise`).
for _name in [
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__iter__",
    "__reversed__",
    "__contains__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__add__",
    "__iadd__",
    "__mul__",
    "__rmul__",
    "__imul__",
    "__repr__",
    "__reduce_ex__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "index",
    "count",
    "copy",
    "sort",
    "reverse",
]:
    setattr(Records, _name, _whole(_name))


def _last_boundary(tail: list[Record]) -> int:
    """The index in `tail` of its last assistant or user record (-1: none)."""
    for index in range(len(tail) - 1, -1, -1):
        if isinstance(tail[index], Assistant | User):
            return index
    return -1


def refresh_checkpoint(journal: Path) -> bool:
    """Write `journal`'s checkpoint anew if `EVERY` records passed since its last (as a resume
    does), for a writer closing a session it grew; reads the file from its checkpoint, without
    its lock. False if it wrote none (too few records, or a journal this cannot read: the next
    resume reads it as ever)."""
    from fisk_sm.journal.parsing import read_all

    try:
        fd = open_regular(journal, os.O_RDONLY)
        try:
            data = read_all(fd)
        finally:
            os.close(fd)
        records, _ = read_records(journal, data)
        if not isinstance(records, Records):
            return False
        records.fold()
    except (OSError, JournalError, LookupError, TypeError, ValueError):
        return False
    return records.taken is not None and write_checkpoint(journal, records.taken)

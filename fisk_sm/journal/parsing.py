"""Reading a session journal's bytes: its records, where the good ones end, and its fold.

Only the text after the last newline can be a torn write, because the newline is the last byte
of every append; it is left out (and `FileStore.open` cuts it). A complete line that does not
decode, a seq out of step or a misplaced meta is corruption, and so is a journal of another
format version, which is refused before anything reads or cuts it. Whatever bytes a journal
holds, reading it either gives records every reader can use (`fisk_sm.journal.shape`) or raises
`CorruptJournalError` naming the file: never an IndexError, a KeyError or a RecursionError. A
journal with no complete line parses to no records (a torn meta is cut like any torn line); its
fold refuses it, as it refuses any journal that does not start with a meta record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fisk_sm.config.errors import one_line
from fisk_sm.config.table import Table
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.decode import decode
from fisk_sm.journal.fold import FoldError, fold
from fisk_sm.journal.records import FORMAT_VERSION, Meta, Record
from fisk_sm.journal.shape import check_depth, check_shape
from fisk_sm.journal.snapshot import Snapshot

__all__ = [
    "CorruptJournalError",
    "check_version",
    "fold_journal",
    "parse_journal",
    "parse_lines",
    "read_all",
    "resume_fold",
]


class CorruptJournalError(JournalError):
    """A journal with a bad interior line; the message names the file and 1-based line."""


def parse_journal(path: Path, data: bytes, *, checkpoint: bool = False) -> tuple[list[Record], int]:
    """A journal's good records and the byte offset where they end (a torn last line left out).

    A bad interior line, a seq out of step or a misplaced meta is a `CorruptJournalError`.
    With `checkpoint` (an open to resume), a journal whose checkpoint holds is read from it:
    the lines it covers are checked by its checksum alone, and only the lines after it are
    decoded (`fisk_sm.journal.checkpoint`); the records, and any error, are the same.
    """
    if checkpoint:
        from fisk_sm.journal.lazy import read_records

        return read_records(path, data)
    lines = data.split(b"\n")
    lines.pop()  # the text after the last newline, if any: a write cut short, dropped
    if lines:
        check_version(path, lines[0])
    records = parse_lines(path, lines, 1)
    return records, data.rfind(b"\n") + 1


def parse_lines(path: Path, lines: list[bytes], first: int) -> list[Record]:
    """The records of complete `lines`, the first of which is line `first` (and has that seq),
    each checked as `parse_journal` checks it."""
    records: list[Record] = []
    for number, line in enumerate(lines, start=first):
        try:
            check_depth(line)
            record = decode(line)
            check_shape(record)
        except (ValueError, RecursionError) as exc:
            # Only text after the last newline can be a torn write (the newline is the last
            # byte written); a complete line that does not decode is corruption, or a record
            # of a newer format that must not be thrown away.
            raise CorruptJournalError(f"{path}: line {number}: {one_line(exc)}") from None
        if record.seq != number:
            raise CorruptJournalError(f"{path}: line {number}: seq {record.seq}, expected {number}")
        if (number == 1) != isinstance(record, Meta):
            what = "first record is not meta" if number == 1 else "meta record after line 1"
            raise CorruptJournalError(f"{path}: line {number}: {what}")
        records.append(record)
    return records


def check_version(path: Path, first: bytes) -> None:
    """Refuse a journal of another format version before anything else reads (or cuts) it."""
    try:
        check_depth(first)
        version = json.loads(first).get("version")
    except (ValueError, AttributeError, RecursionError):
        return  # not a meta line at all: decoding reports it
    if isinstance(version, int) and version != FORMAT_VERSION:
        raise CorruptJournalError(
            f"{path}: journal format version {version} (this fisk-sm reads {FORMAT_VERSION});"
            " the file was left unchanged"
        )


def fold_journal(path: Path, records: list[Record], table: Table | None = None) -> Snapshot:
    """`fold` (by `table`, the loop's own by default), with a refusal naming the journal's
    file."""
    from fisk_sm.journal.lazy import Records

    try:
        if isinstance(records, Records) and records.intact:
            return records.fold(table)
        return fold(records, table)
    except FoldError as exc:
        raise CorruptJournalError(f"{path}: {exc}") from None
    except (LookupError, TypeError, AttributeError, ValueError) as exc:
        # records that `parse_journal` did not check (built in code, or read by another
        # version): still one line naming the file, never a crash of the command
        raise CorruptJournalError(f"{path}: cannot fold: {type(exc).__name__}: {exc}") from None


def read_all(fd: int) -> bytes:
    """Everything from `fd`'s offset to its end: in one read of the size the file has (a
    journal of megabytes costs no second copy), then whatever a writer added since."""
    chunks, size = [], os.fstat(fd).st_size + 1
    while chunk := os.read(fd, size):
        chunks.append(chunk)
        size = 1 << 20
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def resume_fold(path: Path, records: list[Record], table: Table | None = None) -> Snapshot:
    """`fold_journal` for a resume, in its worker thread: read from the journal's checkpoint when
    it has one (`parse_journal(..., checkpoint=True)`), then write a new checkpoint when the
    journal has grown enough. The messages before the checkpoint stay the journal's bytes: the
    next request sends those bytes (`fisk_sm.journal.wirebytes`), and the few that cannot be
    sent so were read by the fold."""
    from fisk_sm.journal.checkpoint import write_checkpoint
    from fisk_sm.journal.lazy import Records

    snapshot = fold_journal(path, records, table)
    if isinstance(records, Records) and records.taken is not None:
        write_checkpoint(path, records.taken)
    return snapshot

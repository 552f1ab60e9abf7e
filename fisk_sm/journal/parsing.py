"""Reading a session journal's bytes: its records, where the good ones end, and its fold.

Only the text after the last newline can be a torn write, because the newline is the last byte
of every append; it is left out (and `FileStore.open` cuts it). A complete line that does not
decode, a seq out of step or a misplaced meta is corruption, and so is a journal of another
format version, which is refused before anything reads or cuts it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fisk_sm.config.errors import one_line
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.decode import decode
from fisk_sm.journal.fold import FoldError, fold
from fisk_sm.journal.records import FORMAT_VERSION, Meta, Record
from fisk_sm.journal.snapshot import Snapshot

__all__ = ["CorruptJournalError", "fold_journal", "parse_journal", "read_all"]


class CorruptJournalError(JournalError):
    """A journal with a bad interior line; the message names the file and 1-based line."""


def parse_journal(path: Path, data: bytes) -> tuple[list[Record], int]:
    """A journal's good records and the byte offset where they end (a torn last line left out).

    A bad interior line, a seq out of step or a misplaced meta is a `CorruptJournalError`.
    """
    lines = data.split(b"\n")
    lines.pop()  # the text after the last newline, if any: a write cut short, dropped
    if lines:
        _check_version(path, lines[0])
    records: list[Record] = []
    end = 0
    for number, line in enumerate(lines, start=1):
        try:
            record = decode(line)
        except ValueError as exc:
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
        end += len(line) + 1
    return records, end


def _check_version(path: Path, first: bytes) -> None:
    """Refuse a journal of another format version before anything else reads (or cuts) it."""
    try:
        version = json.loads(first).get("version")
    except (ValueError, AttributeError):
        return  # not a meta line at all: decoding reports it
    if isinstance(version, int) and version != FORMAT_VERSION:
        raise CorruptJournalError(
            f"{path}: journal format version {version} (this fisk-sm reads {FORMAT_VERSION});"
            " the file was left unchanged"
        )


def fold_journal(path: Path, records: list[Record]) -> Snapshot:
    """`fold`, with a refusal naming the journal's file."""
    try:
        return fold(records)
    except FoldError as exc:
        raise CorruptJournalError(f"{path}: {exc}") from None


def read_all(fd: int) -> bytes:
    """Everything from `fd`'s offset to its end."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)

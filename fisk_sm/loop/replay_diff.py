"""Where a replay departs from its recording, as a person reads it: the first differing record
and a unified diff of what the journal holds against what the replay sent.

`first_difference(records, recorded, sent)` compares two conversations (the recording's fold and
the messages of a replayed request) and returns a `Divergence`: the index of the first message
that differs, the journal record that made it (a `tool_result` by its tool_use id, an assistant
turn, the prompt or a user message), and a bounded unified diff of the first differing content
block (the whole message when the blocks cannot be paired), pretty JSON, long strings cut.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence

import attrs

from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.journal.records import Assistant, Meta, Record, ToolResult, ToolStarted, User

__all__ = ["MAX_DIFF_LINES", "MAX_STRING", "Divergence", "cut", "first_difference", "unified"]

#: A longer string value is cut to this many characters in a diff, with its length noted.
MAX_STRING = 200
#: A longer diff is cut to this many lines, with how many were left out.
MAX_DIFF_LINES = 60


@attrs.frozen
class Divergence:
    """The first message of a replayed request that departs from the recording."""

    #: Its index in the conversation (0: the prompt).
    message: int
    #: The journal record it departs from, as one line: `record 6 (tool_result of mark, toolu_1)`.
    record: str
    #: The unified diff, expected (the journal) against what happened (the replay).
    diff: str

    def describe(self) -> str:
        """One line: which message and which record."""
        return f"message {self.message} differs from the recording at {self.record}"


def cut(value: object, limit: int = MAX_STRING) -> object:
    """`value` with each string longer than `limit` cut, its full length noted: a diff stays
    readable whatever a tool returned."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}… ({len(value)} characters)"
    if isinstance(value, dict):
        return {k: cut(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [cut(v, limit) for v in value]
    return value


def _lines(value: object) -> list[str]:
    if value is None:
        return []
    return json.dumps(cut(value), indent=2, ensure_ascii=False, default=str).splitlines()


def unified(expected: object, actual: object, expected_label: str, actual_label: str) -> str:
    """A unified diff of `expected` against `actual` as pretty JSON (None: nothing), at most
    `MAX_DIFF_LINES` lines."""
    lines = list(
        difflib.unified_diff(
            _lines(expected), _lines(actual), expected_label, actual_label, lineterm=""
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        left = len(lines) - MAX_DIFF_LINES
        lines = [*lines[:MAX_DIFF_LINES], f"… ({left} more diff lines)"]
    return "\n".join(lines)


def _blocks(message: object) -> list[object] | None:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else None


def _tool_name(records: Sequence[Record], use_id: str) -> str:
    for record in records:
        if isinstance(record, ToolStarted) and record.tool_use_id == use_id:
            return record.name
    return "?"


def _contains(message: JSONObject, block: object) -> bool:
    content = message.get("content")
    return block == content or (isinstance(content, list) and block in content)


def _record_of(records: Sequence[Record], index: int, block: object) -> str:
    """The journal record that put `block` (a content block or whole content) in message
    `index` of the recording, as one line."""
    if isinstance(block, dict) and "role" in block:
        block = block.get("content")  # a whole message: the record holding its content
    if isinstance(block, dict) and block.get("type") == "tool_result":
        use_id = str(block.get("tool_use_id"))
        for record in records:
            if isinstance(record, ToolResult) and record.tool_use_id == use_id:
                name = _tool_name(records, use_id)
                return f"record {record.seq} (tool_result of {name}, {use_id})"
    for record in records:
        if isinstance(record, Assistant) and _contains(record.message, block):
            return f"record {record.seq} (assistant)"
        if isinstance(record, User) and _contains(record.message, block):
            return f"record {record.seq} (user)"
    if index == 0 and records and isinstance(records[0], Meta):
        return f"record {records[0].seq} (meta: the prompt)"
    return f"message {index} of the recording"


def first_difference(
    records: Sequence[Record], recorded: Sequence[object], sent: Sequence[object]
) -> Divergence | None:
    """The first message of `sent` that departs from `recorded` (both as plain JSON, without
    cache_control), or None when they are the same."""
    for index in range(max(len(recorded), len(sent))):
        mine = sent[index] if index < len(sent) else None
        theirs = recorded[index] if index < len(recorded) else None
        if mine == theirs:
            continue
        expected, actual = theirs, mine
        ours, journal = _blocks(mine), _blocks(theirs)
        same_role = isinstance(mine, dict) and isinstance(theirs, dict)
        if ours is not None and journal is not None and same_role:
            assert isinstance(mine, dict) and isinstance(theirs, dict)
            if mine.get("role") == theirs.get("role"):
                at = next(
                    (j for j, (a, b) in enumerate(zip(ours, journal, strict=False)) if a != b),
                    min(len(ours), len(journal)),
                )
                expected = journal[at] if at < len(journal) else None
                actual = ours[at] if at < len(ours) else None
        anchor = expected if expected is not None else theirs
        where = "the end of the recording" if anchor is None else _record_of(records, index, anchor)
        label = f"recorded ({where}, message {index})"
        diff = unified(expected, actual, label, f"replayed (message {index})")
        return Divergence(index, where, diff)
    return None

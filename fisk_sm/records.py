"""Journal records: one frozen attrs class per delta, in a cattrs tagged union.

A run's durable state is the sequence of these records; folding them gives the snapshot. A record
is a delta, never a copy of the whole state, so a journal grows with the conversation's content
and not with its square. Each record carries its `seq` (1 for meta, then +1 per record).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
from cattrs.strategies import configure_tagged_union

__all__ = [
    "FORMAT_VERSION",
    "Assistant",
    "Meta",
    "Record",
    "Terminal",
    "ToolResult",
    "ToolStarted",
    "User",
    "decode",
    "encode",
]

FORMAT_VERSION = 1


@attrs.frozen
class Meta:
    """The first record: who the run is and what it was started with."""

    seq: int
    version: int
    run_id: str
    created: str
    fingerprint: dict[str, Any]
    prompt: str


@attrs.frozen
class Assistant:
    """A model reply, verbatim, journaled before any of its tools run."""

    seq: int
    iteration: int
    message: dict[str, Any]
    stop_reason: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_create_tokens: int = 0


@attrs.frozen
class ToolStarted:
    """The intent: a tool is about to run. Written before it starts."""

    seq: int
    tool_use_id: str
    name: str


@attrs.frozen
class ToolResult:
    """A tool's result, written the instant the tool ended."""

    seq: int
    tool_use_id: str
    result: dict[str, Any]
    is_error: bool = False
    kind: str = "python"


@attrs.frozen
class User:
    """A user follow-up message."""

    seq: int
    message: dict[str, Any]


@attrs.frozen
class Terminal:
    """How the run ended (the last one wins)."""

    seq: int
    reason: str
    message: str | None = None


Record = Meta | Assistant | ToolStarted | ToolResult | User | Terminal

_TAGS = {
    Meta: "meta",
    Assistant: "assistant",
    ToolStarted: "tool_started",
    ToolResult: "tool_result",
    User: "user",
    Terminal: "terminal",
}

converter = cattrs.Converter(forbid_extra_keys=True)
configure_tagged_union(
    Record,
    converter,
    tag_generator=lambda cls: _TAGS[cls],
    tag_name="type",
)


def encode(record: Record) -> str:
    """One JSON line (no newline) for `record`."""
    # ensure_ascii=False: non-Latin text would double in size as \u escapes.
    return json.dumps(
        converter.unstructure(record, Record), separators=(",", ":"), ensure_ascii=False
    )


def decode(line: str | bytes) -> Record:
    """Parse one line back into its record; raises ValueError on anything malformed."""
    try:
        record: Record = converter.structure(json.loads(line), Record)  # type: ignore[arg-type]
    except (ValueError, cattrs.BaseValidationError, TypeError, KeyError) as exc:
        raise ValueError(f"malformed record: {exc}") from None
    return record

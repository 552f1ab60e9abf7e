"""Journal records: one frozen attrs class per delta, in a cattrs tagged union.

A run's durable state is the sequence of these records; folding them gives the snapshot. A record
is a delta, never a copy of the whole state, so a journal grows with the conversation's content
and not with its square. Each record carries its `seq` (1 for meta, then +1 per record).

On disk an `assistant` record keeps its token tiers as four top-level keys (the layout every
journal has had); in Python they are one `usage: Usage`. Two cattrs hooks on `Assistant` move
between the two, registered before the tagged union is configured, because the union captures
each class's hooks when it is built.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn
from cattrs.strategies import configure_tagged_union

from fisk_sm.events.usage import Usage

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

    @classmethod
    def new(cls, run_id: str, fingerprint: dict[str, Any], prompt: str) -> Meta:
        """The meta record (seq 1) of a run created now."""
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(
            seq=1,
            version=FORMAT_VERSION,
            run_id=run_id,
            created=created,
            fingerprint=fingerprint,
            prompt=prompt,
        )


@attrs.frozen
class Assistant:
    """A model reply, verbatim, journaled before any of its tools run.

    `iteration` is the run's count of model calls started, this one included (see
    `RunData.iteration`); journals written before that count was settled hold it one lower,
    which is why the fold counts turns instead of reading it.
    """

    seq: int
    iteration: int
    message: dict[str, Any]
    stop_reason: str | None
    usage: Usage = attrs.Factory(Usage)


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

_TIERS = tuple(f.name for f in attrs.fields(Usage))
_nested_out = make_dict_unstructure_fn(Assistant, converter)
_nested_in = make_dict_structure_fn(Assistant, converter, _cattrs_forbid_extra_keys=True)


def _flat_assistant(record: Assistant) -> dict[str, Any]:
    data: dict[str, Any] = _nested_out(record)
    data.update(data.pop("usage"))  # usage is the last field: the tiers keep their place
    return data


def _nested_assistant(data: dict[str, Any], cls: type[Assistant]) -> Assistant:
    if "usage" in data:  # not a key on disk: the tiers are
        raise ValueError(f"Extra fields in constructor for {cls.__name__}: usage")
    rest = dict(data)
    usage = {tier: rest.pop(tier) for tier in _TIERS if tier in rest}
    record: Assistant = _nested_in({**rest, "usage": usage}, cls)
    return record


converter.register_unstructure_hook(Assistant, _flat_assistant)
converter.register_structure_hook(Assistant, _nested_assistant)
configure_tagged_union(
    Record,
    converter,
    tag_generator=lambda cls: _TAGS[cls],
    tag_name="type",
)


def encode(record: Record) -> str:
    """One JSON line (no newline) for `record`."""
    data = converter.unstructure(record, Record)
    # ensure_ascii=False: non-Latin text would double in size as \u escapes.
    line = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    if not line.isascii():
        try:
            line.encode()
        except UnicodeEncodeError:
            # A lone surrogate (a Python tool's str may hold one) has no UTF-8 form; as a \u
            # escape it is written, and read back, exactly.
            return json.dumps(data, separators=(",", ":"))
    return line


# Decoding dispatches on the tag straight to cattrs's structure function for that class: the
# same functions the tagged union uses, without its per-record dispatch (resume decodes
# thousands of records).
_BY_TAG = {tag: (cls, converter.get_structure_hook(cls)) for cls, tag in _TAGS.items()}


def decode(line: str | bytes) -> Record:
    """Parse one line back into its record; raises ValueError on anything malformed."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"malformed record: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("malformed record: not a JSON object")
    tag = data.pop("type", None)
    if tag not in _BY_TAG:
        raise ValueError(f"malformed record: unknown record type {tag!r}")
    cls, structure = _BY_TAG[tag]
    try:
        record: Record = structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        problems = _leaves(exc)
        notes = "; ".join(f"missing {e}" if isinstance(e, KeyError) else str(e) for e in problems)
        raise ValueError(f"malformed {tag} record: {notes}") from None
    return record


def _leaves(exc: BaseException) -> list[BaseException]:
    """The innermost errors of a cattrs validation error (a nested usage tier's included)."""
    nested = getattr(exc, "exceptions", None)
    return [leaf for e in nested for leaf in _leaves(e)] if nested else [exc]

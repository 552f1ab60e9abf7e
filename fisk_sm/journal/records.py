"""Journal records: one frozen attrs class per delta, in a cattrs tagged union.

A run's durable state is the sequence of these records; folding them gives the snapshot. A record
is a delta, never a copy of the whole state, so a journal grows with the conversation's content
and not with its square. Each record carries its `seq` (1 for meta, then +1 per record).

On disk an `assistant` record keeps its token tiers as four top-level keys (the layout every
journal has had); in Python they are one `usage: Usage`. Two cattrs hooks on `Assistant` move
between the two, registered before the tagged union is configured, because the union captures
each class's hooks when it is built. `encode` is hand-specialised and falls back on that
converter only for a value it cannot write; `decode` is hand-specialised too
(`fisk_sm.journal.decode`). tests/test_journal_decode.py holds both to the converter's results.

The converter is built on first use (`converter`, a lazy module attribute), not at import:
building it (the tagged union, its generated functions) cost some 15 ms of every start.
"""

from __future__ import annotations

import functools
import json
import time
from typing import TYPE_CHECKING

import attrs

# JSON too: attrs and cattrs resolve `JSONObject`'s forward reference ("JSON") in this namespace
from fisk_sm.config.jsontypes import JSON, JSONObject  # noqa: F401
from fisk_sm.config.text import scrub_json
from fisk_sm.events.usage import Usage

if TYPE_CHECKING:
    import cattrs

__all__ = [
    "FORMAT_VERSION",
    "TAKEN_OVER",
    "ApprovalAnswered",
    "ApprovalRequested",
    "Assistant",
    "Meta",
    "Record",
    "Terminal",
    "ToolResult",
    "ToolStarted",
    "User",
    "encode",
    "is_takeover",
]

FORMAT_VERSION = 1


@attrs.frozen
class Meta:
    """The first record: who the run is and what it was started with."""

    seq: int
    version: int
    run_id: str
    created: str
    fingerprint: JSONObject
    prompt: str
    #: A chat session (`fisk-sm chat`); written only when true, so one-shot metas are unchanged.
    interactive: bool = False

    @classmethod
    def new(
        cls, run_id: str, fingerprint: JSONObject, prompt: str, *, interactive: bool = False
    ) -> Meta:
        """The meta record (seq 1) of a run created now."""
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(
            seq=1,
            version=FORMAT_VERSION,
            run_id=run_id,
            created=created,
            fingerprint=fingerprint,
            prompt=prompt,
            interactive=interactive,
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
    #: The message in its wire form, exactly as the model sent it (`fisk_sm.model.blocks`
    #: reads it): the journal holds what the model sent, byte for byte.
    message: JSONObject
    stop_reason: str | None
    usage: Usage = attrs.Factory(Usage)
    #: The model call's wall time in milliseconds; written only when measured (journals written
    #: before it was recorded have none). On disk it follows the token tiers.
    latency_ms: int | None = None


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
    result: JSONObject
    is_error: bool = False
    kind: str = "python"
    #: The tool's wall time in milliseconds from start to result; written only when measured
    #: (a call answered without running, and older journals, have none).
    duration_ms: int | None = None


@attrs.frozen
class ApprovalRequested:
    """A gated call put to the operator: the run waits in `awaiting_approval` until an
    `ApprovalAnswered` for the same call is journaled. A suspend or a crash leaves it pending."""

    seq: int
    run_id: str
    tool_use_id: str
    name: str
    input: JSONObject
    tag: str


@attrs.frozen
class ApprovalAnswered:
    """The operator's answer to an `ApprovalRequested`: `once`, `always` or `no` (denied);
    `reason` says why a call was denied without an operator's `no` (the prompt failed)."""

    seq: int
    tool_use_id: str
    answer: str
    reason: str | None = None
    #: Who answered (the prompter's `name`: "terminal", "stepper", "supervisor", ...) and when
    #: (UTC, ISO 8601 like `Meta.created`); each written only when known, so older journals
    #: and answers nobody gave (a failed prompt) keep their shape.
    by: str | None = None
    at: str | None = None


@attrs.frozen
class User:
    """A user follow-up message."""

    seq: int
    message: JSONObject


@attrs.frozen
class Terminal:
    """How the run ended (the last one wins)."""

    seq: int
    reason: str
    message: str | None = None


#: How the `suspended` terminal record that moves a run to a new owner begins (the new owner
#: appends it when the old owner's lease expired; `fisk_sm.journal.jetstream`).
TAKEN_OVER = "taken over"


def is_takeover(record: object) -> bool:
    """Whether `record` is the record of a run taken over by a new owner."""
    return (
        isinstance(record, Terminal)
        and record.reason == "suspended"
        and (record.message or "").startswith(TAKEN_OVER)
    )


Record = (
    Meta
    | Assistant
    | ToolStarted
    | ToolResult
    | ApprovalRequested
    | ApprovalAnswered
    | User
    | Terminal
)

_TAGS = {
    Meta: "meta",
    Assistant: "assistant",
    ToolStarted: "tool_started",
    ToolResult: "tool_result",
    ApprovalRequested: "approval_requested",
    ApprovalAnswered: "approval_answered",
    User: "user",
    Terminal: "terminal",
}

_TIERS = tuple(f.name for f in attrs.fields(Usage))


def _is_json_object(t: object) -> bool:
    """Whether a field's type is `JSONObject` (a `dict` from `str` to the `JSON` union), as
    cattrs meets it: with its forward reference resolved or not, so not by equality."""
    import typing

    args = typing.get_args(t)
    return typing.get_origin(t) is dict and args[:1] == (str,) and len(typing.get_args(args[1])) > 1


@functools.cache
def _converter() -> cattrs.Converter:
    """The records' cattrs converter (the tagged union on `type`), built on the first call."""
    import cattrs
    from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
    from cattrs.strategies import configure_tagged_union

    converter = cattrs.Converter(forbid_extra_keys=True)
    # A JSON object field (a message, a result, an input) is read as cattrs reads a
    # `dict[str, Any]`: any mapping, copied (a non-mapping fails on `.items()`).
    converter.register_structure_hook_func(_is_json_object, lambda value, _: dict(value.items()))
    # The optional timings and the approver are written only when known (see `_OPTIONAL`).
    nested_out = make_dict_unstructure_fn(
        Assistant, converter, latency_ms=override(omit_if_default=True)
    )
    nested_in = make_dict_structure_fn(Assistant, converter, _cattrs_forbid_extra_keys=True)

    def flat_assistant(record: Assistant) -> JSONObject:
        data: JSONObject = nested_out(record)
        tiers = data.pop("usage")
        latency = data.pop("latency_ms", None)
        if isinstance(tiers, dict):  # always: the tiers keep their place, the latency follows
            data.update(tiers)
        if latency is not None:
            data["latency_ms"] = latency
        return data

    def nested_assistant(data: JSONObject, cls: type[Assistant]) -> Assistant:
        if "usage" in data:  # not a key on disk: the tiers are
            raise ValueError(f"Extra fields in constructor for {cls.__name__}: usage")
        rest = dict(data)
        usage = {tier: rest.pop(tier) for tier in _TIERS if tier in rest}
        record: Assistant = nested_in({**rest, "usage": usage}, cls)
        return record

    # Registered before the tagged union is configured: the union captures each class's hooks.
    converter.register_unstructure_hook(Assistant, flat_assistant)
    # `interactive` is written only for a chat: a one-shot meta is the line it always was.
    converter.register_unstructure_hook(
        Meta, make_dict_unstructure_fn(Meta, converter, interactive=override(omit_if_default=True))
    )
    converter.register_unstructure_hook(
        ToolResult,
        make_dict_unstructure_fn(ToolResult, converter, duration_ms=override(omit_if_default=True)),
    )
    converter.register_unstructure_hook(
        ApprovalAnswered,
        make_dict_unstructure_fn(
            ApprovalAnswered,
            converter,
            by=override(omit_if_default=True),
            at=override(omit_if_default=True),
        ),
    )
    converter.register_structure_hook(Assistant, nested_assistant)
    configure_tagged_union(
        Record,
        converter,
        tag_generator=lambda cls: _TAGS[cls],
        tag_name="type",
    )
    return converter


if TYPE_CHECKING:
    #: The records' cattrs converter (module attribute, built on first access).
    converter: cattrs.Converter
else:

    def __getattr__(name: str) -> object:
        """`converter`, built on first access (PEP 562); no other name is lazy."""
        if name == "converter":
            return _converter()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_FIELD_NAMES = {cls: tuple(f.name for f in attrs.fields(cls)) for cls in _TAGS}
#: Fields written only when not None: added after journals existed, so a record without them
#: is the line it always was.
_OPTIONAL: dict[type, tuple[str, ...]] = {
    Assistant: ("latency_ms",),
    ToolResult: ("duration_ms",),
    ApprovalAnswered: ("by", "at"),
}


def _unstructure(record: Record) -> dict[str, object]:
    """The record as the converter unstructures it (its fields in order, an assistant's usage
    as its tiers, then the tag) without the converter's per-field dispatch."""
    cls = type(record)
    data = {name: getattr(record, name) for name in _FIELD_NAMES[cls]}
    if cls is Assistant:
        usage = data.pop("usage")
        latency = data.pop("latency_ms")
        for tier in _TIERS:
            data[tier] = getattr(usage, tier)
        data["latency_ms"] = latency  # after the tiers, as the converter writes it
    for name in _OPTIONAL.get(cls, ()):
        if data[name] is None:
            del data[name]
    if cls is Meta and not data["interactive"]:
        del data["interactive"]  # only a chat's meta has it: one-shot journals read as before
    data["type"] = _TAGS[cls]
    return data


def encode(record: Record) -> str:
    """One JSON line (no newline) for `record`."""
    try:
        data = _unstructure(record)
        # ensure_ascii=False: non-Latin text would double in size as \u escapes.
        line = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    except TypeError:  # a value only the converter can make JSON of (an attrs object in a dict)
        data = _converter().unstructure(record, Record)
        line = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    if not line.isascii():
        try:
            line.encode()
        except UnicodeEncodeError:
            # A lone surrogate has no UTF-8 form. The edges replace it before it gets here
            # (fisk_sm.config.text); this is the last guard: never journaled, always U+FFFD.
            return json.dumps(scrub_json(data), separators=(",", ":"), ensure_ascii=False)
    return line

"""`decode`: one journal line back into its record (`fisk_sm.journal.records` has the records
and `encode`)."""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from fisk_sm.config.text import scrub_json
from fisk_sm.events.usage import Usage
from fisk_sm.journal.records import (
    _TAGS,
    _TIERS,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
)

__all__ = ["decode"]

# Decoding is hand-specialised per record type: resume decodes thousands of records, and cattrs's
# generated functions (collecting errors, building notes) cost more than the JSON parse of a
# record. Each type has a fast path, taken when every field already has its exact type and no
# key is unknown, and a slow path for anything else that coerces and reports exactly as the
# cattrs converter above would (`int("2")` is 2, a missing key is "missing 'x'", unknown keys
# are "Extra fields in constructor for T: a, b"), so a journal decodes to the same records, or
# fails with the same line, as it always has. tests/test_journal_decode.py holds the two to it.

try:  # a C JSON parser, about 2.5x faster than the stdlib's on journal lines
    from msgspec.json import Decoder as _Decoder
except ImportError:  # pragma: no cover - msgspec is a dependency; the stdlib's parser works too
    _fast_loads: Any = json.loads
else:
    _fast_loads = _Decoder().decode


# The JSON escape of a surrogate (a pair, or a lone one that `scrub_json` replaces)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _loads(line: str | bytes) -> Any:
    """`json.loads`, through msgspec when it can (it reads every value as the stdlib does,
    integers beyond 64 bits included); anything it refuses (NaN, 1e400, the escape of a lone
    surrogate, bad JSON) is parsed, or refused with its usual message, by the stdlib.

    A lone surrogate escape (an older build journaled a Python tool's that way, or a hand edit)
    is read as U+FFFD, so that a resume never sends the model text that cannot be encoded."""
    try:
        return _fast_loads(line)
    except ValueError:  # msgspec.DecodeError is one
        data = json.loads(line)
        text = line if isinstance(line, str) else line.decode("utf-8", "replace")
        return scrub_json(data) if _SURROGATE_ESCAPE.search(text) else data


def _mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise AttributeError(f"'{type(value).__name__}' object has no attribute 'items'")


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


# (field, coercion, required) in declaration order, as cattrs structures them; Assistant's
# usage tiers are top-level keys on disk, structured where its last field, `usage`, would be.
_Field = tuple[str, Any, bool]
_TIER_FIELDS: tuple[_Field, ...] = tuple((tier, int, False) for tier in _TIERS)
_COERCE: dict[Any, Any] = {
    int: int,
    str: str,
    bool: bool,
    str | None: _optional_str,
    int | None: _optional_int,
}
_FIELDS: dict[type, tuple[_Field, ...]] = {
    cls: tuple(
        (f.name, _COERCE.get(f.type, _mapping), f.default is attrs.NOTHING)
        for f in attrs.fields(attrs.resolve_types(cls))
        if not (cls is Assistant and f.name == "usage")
    )
    + (_TIER_FIELDS if cls is Assistant else ())
    for cls in _TAGS
}


def _structure_slowly(cls: type, data: dict[str, Any]) -> Record:
    """Coerce each field as cattrs does, or raise ValueError listing every problem."""
    if cls is Assistant and "usage" in data:  # not a key on disk: the tiers are
        raise ValueError("Extra fields in constructor for Assistant: usage")
    fields = _FIELDS[cls]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, coerce, required in fields:
        if name not in data:
            if required:
                problems.append(f"missing {name!r}")
            continue
        try:
            values[name] = coerce(data[name])
        # What int() (of inf too), str() and `_mapping` raise: cattrs reports each as is.
        except (ValueError, TypeError, OverflowError, AttributeError) as exc:
            problems.append(str(exc))
    extra = data.keys() - {name for name, _, _ in fields}
    if extra:
        names = ", ".join(sorted(extra))
        problems.append(f"Extra fields in constructor for {cls.__name__}: {names}")
    if problems:
        raise ValueError("; ".join(problems))
    if cls is Assistant:
        values["usage"] = Usage(**{tier: values.pop(tier) for tier in _TIERS if tier in values})
    record: Record = cls(**values)
    return record


def _meta(d: dict[str, Any]) -> Record | None:
    seq, version, run_id, created = (
        d.get("seq"),
        d.get("version"),
        d.get("run_id"),
        d.get("created"),
    )
    fingerprint, prompt = d.get("fingerprint"), d.get("prompt")
    if (
        len(d) == 6
        and type(seq) is int
        and type(version) is int
        and type(run_id) is str
        and type(created) is str
        and type(fingerprint) is dict
        and type(prompt) is str
    ):
        return Meta(seq, version, run_id, created, fingerprint, prompt)
    return None


def _assistant(d: dict[str, Any]) -> Record | None:
    seq, iteration, message = d.get("seq"), d.get("iteration"), d.get("message")
    stop = d.get("stop_reason", 0)
    tokens_in, tokens_out = d.get("input_tokens", 0), d.get("output_tokens", 0)
    cache_read, cache_create = d.get("cache_read_tokens", 0), d.get("cache_create_tokens", 0)
    latency = d.get("latency_ms")
    if (
        type(seq) is int
        and type(iteration) is int
        and type(message) is dict
        and (stop is None or type(stop) is str)
        and type(tokens_in) is int
        and type(tokens_out) is int
        and type(cache_read) is int
        and type(cache_create) is int
        and (latency is None or type(latency) is int)
        and len(d) == 4 + len(d.keys() & _TIERS) + ("latency_ms" in d)
    ):
        usage = Usage(tokens_in, tokens_out, cache_read, cache_create)
        return Assistant(seq, iteration, message, stop, usage, latency)
    return None


def _tool_started(d: dict[str, Any]) -> Record | None:
    seq, tool_use_id, name = d.get("seq"), d.get("tool_use_id"), d.get("name")
    if len(d) == 3 and type(seq) is int and type(tool_use_id) is str and type(name) is str:
        return ToolStarted(seq, tool_use_id, name)
    return None


def _tool_result(d: dict[str, Any]) -> Record | None:
    seq, tool_use_id, result = d.get("seq"), d.get("tool_use_id"), d.get("result")
    is_error, kind = d.get("is_error", False), d.get("kind", "python")
    duration = d.get("duration_ms")
    if (
        type(seq) is int
        and type(tool_use_id) is str
        and type(result) is dict
        and type(is_error) is bool
        and type(kind) is str
        and (duration is None or type(duration) is int)
        and len(d) == 3 + ("is_error" in d) + ("kind" in d) + ("duration_ms" in d)
    ):
        return ToolResult(seq, tool_use_id, result, is_error, kind, duration)
    return None


def _user(d: dict[str, Any]) -> Record | None:
    seq, message = d.get("seq"), d.get("message")
    if len(d) == 2 and type(seq) is int and type(message) is dict:
        return User(seq, message)
    return None


def _terminal(d: dict[str, Any]) -> Record | None:
    seq, reason, message = d.get("seq"), d.get("reason"), d.get("message")
    if (
        type(seq) is int
        and type(reason) is str
        and (message is None or type(message) is str)
        and len(d) == 2 + ("message" in d)
    ):
        return Terminal(seq, reason, message)
    return None


def _no_fast_path(d: dict[str, Any]) -> Record | None:
    return None  # rare records: the general path is fast enough


_BY_TAG: dict[str, tuple[type, Any]] = {
    "meta": (Meta, _meta),
    "assistant": (Assistant, _assistant),
    "tool_started": (ToolStarted, _tool_started),
    "tool_result": (ToolResult, _tool_result),
    "user": (User, _user),
    "terminal": (Terminal, _terminal),
}
_BY_TAG.update({tag: (cls, _no_fast_path) for cls, tag in _TAGS.items() if tag not in _BY_TAG})


def decode(line: str | bytes) -> Record:
    """Parse one line back into its record; raises ValueError on anything malformed."""
    try:
        data = _loads(line)
    except ValueError as exc:
        raise ValueError(f"malformed record: not JSON ({exc})") from None
    except RecursionError:  # both parsers give up on arrays nested ~1,000 deep
        raise ValueError("malformed record: not JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ValueError("malformed record: not a JSON object")
    tag = data.pop("type", None)
    if not isinstance(tag, str) or tag not in _BY_TAG:
        raise ValueError(f"malformed record: unknown record type {tag!r}")
    cls, fast = _BY_TAG[tag]
    record: Record | None = fast(data)
    if record is None:
        try:
            record = _structure_slowly(cls, data)
        except ValueError as exc:
            raise ValueError(f"malformed {tag} record: {exc}") from None
    return record

"""The hand-specialised record decoder against cattrs, the converter it replaced.

`decode` must read every line to the record the cattrs converter structured, and refuse every
malformed line with the very message it gave: those messages are what `session show`, `resume`
and the damaged rows of `session ls` print. The reference below is the decoder as it was, on the
converter that `encode` still uses; each record type is decoded as written, then with every key
dropped, every value replaced by each odd JSON value, an unknown key and a `usage` key added.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
import pytest

from fisk_sm.config.text import scrub_json
from fisk_sm.events.usage import Usage
from fisk_sm.journal import records as records_module
from fisk_sm.journal.decode import decode
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    encode,
)

MESSAGE = {"role": "assistant", "content": [{"type": "text", "text": "naïve “fold” \ud800"}]}
SAMPLES: list[Record] = [
    Meta(1, FORMAT_VERSION, "run-1", "2026-01-01T00:00:00Z", {"model": "m", "n": [1]}, "go"),
    Assistant(2, 1, MESSAGE, "tool_use", Usage(10, 20, 3, 4)),
    Assistant(2, 1, MESSAGE, None),
    ToolStarted(3, "toolu_1", "echo"),
    ToolResult(4, "toolu_1", {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}),
    ToolResult(4, "toolu_1", {"content": []}, is_error=True, kind="exec"),
    ApprovalRequested(5, "run-1", "toolu_2", "rm", {"path": "/tmp/x"}, "danger"),
    ApprovalAnswered(6, "toolu_2", "no", "the prompt failed"),
    ApprovalAnswered(6, "toolu_2", "once"),
    User(7, {"role": "user", "content": "more"}),
    Terminal(8, "completed", "done"),
    Terminal(8, "suspended"),
]
#: Each a JSON value that some field's coercion accepts, changes or refuses.
ODD_VALUES = [None, "x", "2", "", 2, 2.5, 0, True, False, [], [1], {}, {"a": 1}, 1e400, -(2**70)]


def reference(line: str | bytes) -> Record:
    """The decoder as it was: cattrs's structure function for the record's class; since
    unencodable text has one rule, a lone surrogate escape reads as U+FFFD."""
    try:
        data = scrub_json(json.loads(line))
    except ValueError as exc:
        raise ValueError(f"malformed record: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("malformed record: not a JSON object")
    tag = data.pop("type", None)
    by_tag = {tag: cls for cls, tag in records_module._TAGS.items()}
    if not isinstance(tag, str) or tag not in by_tag:  # an unhashable tag used to crash here
        raise ValueError(f"malformed record: unknown record type {tag!r}")
    cls = by_tag[tag]
    try:
        record: Record = records_module.converter.get_structure_hook(cls)(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        notes = "; ".join(
            f"missing {e}" if isinstance(e, KeyError) else str(e) for e in leaves(exc)
        )
        raise ValueError(f"malformed {tag} record: {notes}") from None
    return record


def leaves(exc: BaseException) -> list[BaseException]:
    nested = getattr(exc, "exceptions", None)
    return [leaf for e in nested for leaf in leaves(e)] if nested else [exc]


def outcome(decoder: Any, line: str | bytes) -> tuple[str, Any]:
    try:
        return "record", decoder(line)
    except ValueError as exc:
        return "error", str(exc)


def variants(record: Record) -> list[str]:
    """The record's line, then each key dropped, each value made odd, a key added."""
    data = json.loads(encode(record))
    out = [encode(record)]
    for key in data:
        out.append(json.dumps({k: v for k, v in data.items() if k != key}))
        for value in ODD_VALUES:
            out.append(json.dumps({**data, key: value}))
    for extra in ({"bogus": 1}, {"usage": {}}, {"zz": 1, "aa": 2}, {"input_tokens": "7"}):
        out.append(json.dumps({**data, **extra}))
    return out


LINES = sorted({line for record in SAMPLES for line in variants(record)})
ODD_LINES = [
    "", "nope", "[1]", '"\\ud800"', "{", '{"type":"zzz"}', '{"type":null}', '{"type":["x"]}',
    '{"seq":2}', '{"type":"user","seq":2,"message":{"a":NaN}}',
    '{"type":"user","seq":NaN,"message":{}}', '{"type":"user","seq":2,"message":{},"seq":3}',
    '{"type":"user","seq":99999999999999999999999,"message":{}}',
    '{"type":"user","seq":2,"message":{"big":99999999999999999999999}}',
    '{"type":"user","seq":2,"message":{"s":"\\ud800"}}',
]  # fmt: skip


@pytest.mark.parametrize("line", LINES + ODD_LINES)
def test_every_line_decodes_to_the_same_record_or_the_same_error(line: str) -> None:
    expected = outcome(reference, line)
    assert outcome(decode, line) == expected
    assert outcome(decode, line.encode("utf-8", "surrogatepass")) == expected


def test_the_cases_cover_both_paths_and_every_record_type() -> None:
    kinds = [outcome(reference, line)[0] for line in LINES]
    assert kinds.count("record") > 50 and kinds.count("error") > 200
    decoded = {type(outcome(decode, line)[1]) for line in LINES}
    assert set(records_module._TAGS) <= decoded


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_each_record_round_trips_and_keeps_its_field_types(record: Record) -> None:
    decoded = decode(encode(record))
    assert decoded == replaced(record)
    for field in attrs.fields(type(record)):
        assert type(getattr(decoded, field.name)) is type(getattr(record, field.name))


def test_invalid_utf8_is_not_json_with_the_stdlib_message() -> None:
    line = b'{"type":"user","seq":2,"message":{"t":"\xff"}}'
    assert outcome(decode, line) == outcome(reference, line)
    assert outcome(decode, line)[1].startswith("malformed record: not JSON (")


def test_an_unhashable_type_tag_is_a_malformed_record_not_a_crash() -> None:
    with pytest.raises(ValueError, match=r"^malformed record: unknown record type \['x'\]$"):
        decode('{"type":["x"],"seq":2}')


def test_several_extra_keys_are_named_in_order() -> None:
    line = '{"type":"user","seq":2,"message":{},"zz":1,"aa":2}'
    with pytest.raises(ValueError) as info:
        decode(line)
    assert str(info.value) == "malformed user record: Extra fields in constructor for User: aa, zz"


def test_every_problem_of_a_line_is_listed() -> None:
    with pytest.raises(ValueError) as info:
        decode('{"type":"user","bogus":1}')
    assert str(info.value) == (
        "malformed user record: missing 'seq'; missing 'message'; "
        "Extra fields in constructor for User: bogus"
    )


def reference_encode(record: Record) -> str:
    """The encoder as it was: the converter's unstructuring, compact JSON, non-ASCII kept;
    a lone surrogate is written as U+FFFD (it used to force \\u escapes: it is never journaled
    now, tests/test_unencodable_text.py)."""
    data = scrub_json(records_module.converter.unstructure(record, Record))
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def replaced(record: Record) -> Record:
    """`record` with each lone surrogate replaced by U+FFFD, as it is journaled."""
    fields = {f.name: scrub_json(getattr(record, f.name)) for f in attrs.fields(type(record))}
    return attrs.evolve(record, **fields)


def test_a_lone_surrogate_is_journaled_as_the_replacement_character() -> None:
    line = encode(SAMPLES[1])
    assert "\\ud800" not in line and line.encode().count("\ufffd".encode()) == 1


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_each_record_encodes_to_the_same_line_as_through_the_converter(record: Record) -> None:
    assert encode(record) == reference_encode(record)


def test_a_value_only_the_converter_can_unstructure_still_encodes() -> None:
    record = User(2, {"role": "user", "content": "x", "usage": Usage(1, 2)})
    assert encode(record) == reference_encode(record)
    assert json.loads(encode(record))["message"]["usage"]["output_tokens"] == 2

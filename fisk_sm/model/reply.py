"""The check every Messages API reply passes before any of it is journaled.

A reply is checked at the model adapter, so that a malformed one ends the run as `failed` with one
short line naming the field (``malformed model reply: content[1].id: missing``) instead of being
journaled and then crashing every later fold and resume, or crashing the CLI with a traceback.
Only what the loop reads is checked: the body is a JSON object; ``content`` is a list of typed
blocks (a text block has its text; a tool call its id, name and input); ``stop_reason`` is a
string or null; ``usage`` holds non-negative integer token counts, so that a hostile count cannot
lower the run's total and hide an exhausted budget. Everything else, unknown block types included
(thinking, redacted_thinking, ...), passes through untouched: the reply is returned exactly as
parsed, because thinking signatures break if blocks are re-encoded.

Pure: no I/O. `ModelError` is defined here, so that this module needs nothing from
`fisk_sm.model.anthropic`, which re-exports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from fisk_sm.config.errors import one_line as flat_line
from fisk_sm.config.jsontypes import JSON, JSONObject
from fisk_sm.config.text import scrub_json

__all__ = ["PREFIX", "MalformedReply", "ModelError", "check_reply", "one_line", "parse_reply"]

PREFIX = "malformed model reply: "
QUOTE_LIMIT = 60  # a quoted value is evidence, not a dump of the body
TOOL_CALLS = ("tool_use", "server_tool_use")
_COUNTS = ("input_tokens", "output_tokens")
_CACHE_COUNTS = ("cache_read_input_tokens", "cache_creation_input_tokens")
# UTF-8 on the wire cannot carry a surrogate; only a \uD800-\uDFFF escape can (often a pair)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str from JSON, a surrogate is always lone


class ModelError(Exception):
    """A model call failed; the message is what the run reports."""


class MalformedReply(ModelError):
    """The API answered with a success status, but not with a well-formed Messages API reply."""


def one_line(text: str, limit: int = 200) -> str:
    """`text` with its whitespace runs (newlines included) collapsed, cut to `limit` characters.

    A lone surrogate becomes U+FFFD, so that the text can be journaled as UTF-8. Control
    characters other than whitespace are kept: the UI layer strips those.
    """
    return _SURROGATE.sub("\ufffd", flat_line(text, limit))


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _show(value: object) -> str:
    """A short, one-line rendering of an offending value: scalars quoted, containers by kind."""
    if isinstance(value, str):
        text = repr(value[: QUOTE_LIMIT + 1])  # repr escapes newlines: one line whatever came
    elif isinstance(value, bool | int | float) or value is None:
        text = repr(value)
    else:
        return _kind(value)
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 1] + "…"


def _fail(field: str, problem: str) -> MalformedReply:
    return MalformedReply(f"{PREFIX}{field}: {problem}")


def _expected(field: str, what: str, value: object) -> MalformedReply:
    return _fail(field, f"expected {what}, got {_show(value)}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _nonempty_string(block: Mapping[str, JSON], key: str, where: str) -> str:
    if key not in block:
        raise _fail(f"{where}.{key}", "missing")
    value = block[key]
    if not isinstance(value, str) or not value:
        raise _expected(f"{where}.{key}", "a non-empty string", value)
    return value


def _check_block(block: object, where: str, tool_ids: dict[str, str]) -> None:
    if not isinstance(block, dict):
        raise _expected(where, "an object", block)
    kind = _nonempty_string(block, "type", where)
    if kind == "text":
        if "text" not in block:
            raise _fail(f"{where}.text", "missing")
        if not isinstance(block["text"], str):
            raise _expected(f"{where}.text", "a string", block["text"])
    elif kind in TOOL_CALLS:
        use_id = _nonempty_string(block, "id", where)
        _nonempty_string(block, "name", where)
        if "input" not in block:
            raise _fail(f"{where}.input", "missing")
        if not isinstance(block["input"], dict):
            raise _expected(f"{where}.input", "an object", block["input"])
        # results are matched to calls by id: a repeated id would answer two calls with one result
        if use_id in tool_ids:
            raise _fail(f"{where}.id", f"repeats the id of {tool_ids[use_id]}")
        tool_ids[use_id] = where


def check_reply(body: object) -> JSONObject:
    """`body` itself if it is a well-formed reply; else raises `MalformedReply` naming the field."""
    if not isinstance(body, dict):
        raise MalformedReply(f"{PREFIX}body is not a JSON object (got {_kind(body)})")
    if "content" not in body:
        raise _fail("content", "missing")
    content = body["content"]
    if not isinstance(content, list):
        raise _expected("content", "a list", content)
    tool_ids: dict[str, str] = {}
    for i, block in enumerate(content):
        _check_block(block, f"content[{i}]", tool_ids)
    stop_reason = body.get("stop_reason")
    if stop_reason is not None and not isinstance(stop_reason, str):
        raise _expected("stop_reason", "a string or null", stop_reason)
    if "usage" not in body:
        raise _fail("usage", "missing")
    usage = body["usage"]
    if not isinstance(usage, dict):
        raise _expected("usage", "an object", usage)
    for key in (*_COUNTS, *_CACHE_COUNTS):
        required = key in _COUNTS  # the cache tiers may be absent or null
        if required and key not in usage:
            raise _fail(f"usage.{key}", "missing")
        value = usage.get(key)
        if (required or value is not None) and not _is_count(value):
            raise _expected(f"usage.{key}", "a non-negative integer", value)
    return body


def parse_reply(data: bytes) -> JSONObject:
    """Parse a raw response body as JSON and check it (`check_reply`)."""
    if not data.strip():
        raise MalformedReply(f"{PREFIX}body is empty")
    try:
        body = json.loads(data, parse_constant=_no_constant)
    except _NotANumber as exc:
        raise MalformedReply(f"{PREFIX}body is not JSON (it holds {exc})") from None
    except (ValueError, RecursionError):  # RecursionError: a body of nested brackets
        raise MalformedReply(f"{PREFIX}body is not JSON") from None
    reply = check_reply(body)
    if _SURROGATE_ESCAPE.search(data):
        # Text from the model is never refused for a lone surrogate: it is replaced with U+FFFD
        # before anything is journaled or sent back (`fisk_sm.config.text`, one rule per channel).
        scrubbed: JSONObject = scrub_json(reply)
        return scrubbed
    return reply


class _NotANumber(ValueError):
    pass


def _no_constant(name: str) -> object:
    """Refuse NaN and Infinity: Python's JSON reads them, but no request can send them back."""
    raise _NotANumber(name)

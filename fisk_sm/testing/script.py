"""Scripted replies for the fake Messages API (:mod:`fisk_sm.testing`), and script files.

A :class:`Reply` is one scripted answer. Most tests script well-formed messages
(:meth:`Reply.text`, :meth:`Reply.tool_use`) and HTTP errors (:meth:`Reply.error`, with an
optional message, control characters and all). Tests of a client's defences can script any body
at all: :meth:`Reply.body` sends any JSON value in place of the message (content as a string,
usage with negative counts, a tool call without an id, an array), and :meth:`Reply.raw` sends
bytes as they are (an HTML page, invalid JSON, nothing), with any content type and status.

:func:`load_script` reads such a script from a YAML or JSON file, strictly: an unknown key, a
wrong type or a meaningless combination is a :class:`ScriptError` naming file, item and field.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

__all__ = ["Reply", "ScriptError", "ScriptFile", "load_script", "load_script_file"]

_CACHE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens")
_USAGE_KEYS = ("input_tokens", "output_tokens", *_CACHE_KEYS)
_tool_ids = itertools.count(1)
_tool_lock = threading.Lock()


def _next_tool_id() -> str:
    with _tool_lock:
        return f"toolu_{next(_tool_ids):02d}"


def _blocks(value: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(dict(block) for block in value)


def _encoded(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


@attrs.frozen
class Reply:
    """One scripted answer: content blocks (sent verbatim), stop reason, usage, delay, status.

    ``payload``, when set, is the whole response body instead of a message built from the
    other fields, sent with ``content_type``; ``message`` is the error message of an error
    reply (``status`` 400-599 without a payload).
    """

    content: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=_blocks)
    stop_reason: str = "end_turn"
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    delay: float = 0.0  # seconds to wait before answering
    status: int = attrs.field(default=200)  # anything else: an Anthropic-shaped error body
    payload: bytes | None = attrs.field(default=None, converter=_encoded)
    content_type: str = "application/json"
    message: str | None = None

    @status.validator
    def _check_status(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value != 200 and not 400 <= value <= 599:
            raise ValueError(f"status must be 200 or 400-599, not {value}")

    def __attrs_post_init__(self) -> None:
        if self.payload is not None and self.content:
            raise ValueError("a payload is the whole body: it cannot be combined with content")
        if self.message is not None and (self.status == 200 or self.payload is not None):
            raise ValueError("'message' is for error replies (status 400-599, no body)")

    @classmethod
    def text(cls, text: str, **kw: Any) -> Reply:
        """A reply with a single text block."""
        return cls(content=({"type": "text", "text": text},), **kw)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: Mapping[str, Any],
        id: str | None = None,
        text: str | None = None,
        **kw: Any,
    ) -> Reply:
        """A tool call (after a text block if ``text``); stop_reason defaults to "tool_use"."""
        block = {"type": "tool_use", "id": id or _next_tool_id(), "name": name}
        lead = [{"type": "text", "text": text}] if text is not None else []
        kw.setdefault("stop_reason", "tool_use")
        return cls(content=(*lead, {**block, "input": dict(input)}), **kw)

    @classmethod
    def error(cls, status: int, message: str | None = None, **kw: Any) -> Reply:
        """An HTTP error answer (529 overloaded, 429 rate limited, anything else api_error).

        ``message`` (any text, control characters included) replaces the default
        ``error.message`` of the Anthropic-shaped error body.
        """
        return cls(status=status, message=message, **kw)

    @classmethod
    def raw(
        cls,
        body: bytes | str,
        status: int = 200,
        content_type: str = "application/json",
        **kw: Any,
    ) -> Reply:
        """``body`` as the whole response, byte for byte (a str is sent as UTF-8)."""
        return cls(payload=body, status=status, content_type=content_type, **kw)

    @classmethod
    def body(cls, value: object, status: int = 200, **kw: Any) -> Reply:
        """Any JSON value as the whole response body, in place of a well-formed message."""
        return cls.raw(json.dumps(value), status, **kw)

    @property
    def usage(self) -> dict[str, int]:
        """The ``usage`` object sent with the reply."""
        return {key: int(getattr(self, key)) for key in _USAGE_KEYS}


class ScriptError(ValueError):
    """A script file is unreadable or malformed; the message names file, item and field."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (_is_str, "a string"),
    "stop_reason": (_is_str, "a string"),
    "tool_use": (lambda v: isinstance(v, dict), "a mapping"),
    "usage": (lambda v: isinstance(v, dict), "a mapping"),
    "content": (lambda v: isinstance(v, list), "a list of blocks"),
    "delay": (lambda v: (_is_int(v) or isinstance(v, float)) and v >= 0, "seconds (>= 0)"),
    "status": (lambda v: _is_int(v) and (v == 200 or 400 <= v <= 599), "200 or 400-599"),
    "body": (lambda v: True, "any JSON value"),
    "raw": (_is_str, "a string"),
    "content_type": (_is_str, "a string"),
    "message": (_is_str, "a string"),
}
_MESSAGE_KEYS = ("text", "tool_use", "content", "stop_reason", "usage")


def _payload(item: dict[str, Any], fail: Callable[[str], ScriptError]) -> dict[str, Any]:
    """The keyword arguments of a ``body`` or ``raw`` item (the whole response body)."""
    given = [key for key in ("body", "raw") if key in item]
    if not given:
        if "content_type" in item:
            raise fail("'content_type' needs 'body' or 'raw'")
        return {}
    if len(given) > 1:
        raise fail("'body' and 'raw' cannot be combined")
    clash = next((key for key in _MESSAGE_KEYS if key in item), None)
    if clash is not None:
        raise fail(f"{given[0]!r} is the whole body: it cannot be combined with {clash!r}")
    kw: dict[str, Any] = {"content_type": item.get("content_type", "application/json")}
    if "raw" in item:
        return {**kw, "payload": item["raw"]}
    try:
        return {**kw, "payload": json.dumps(item["body"], allow_nan=False)}
    except (TypeError, ValueError) as exc:
        raise fail(f"field 'body': not JSON: {exc}") from None


def _parse_item(item: object, where: str) -> Reply:
    def fail(msg: str) -> ScriptError:
        return ScriptError(f"{where}: {msg}")

    if not isinstance(item, dict):
        raise fail(f"expected a mapping, got {type(item).__name__}")
    for key, value in item.items():
        if key not in _CHECKS:
            raise fail(f"unknown key {key!r}")
        check, expected = _CHECKS[key]
        if not check(value):
            raise fail(f"field {key!r}: expected {expected}, got {type(value).__name__}")
    if "content" in item and ("text" in item or "tool_use" in item):
        raise fail("'content' cannot be combined with 'text' or 'tool_use'")
    kw = _payload(item, fail)
    kw.update({k: item[k] for k in ("stop_reason", "status", "message") if k in item})
    blocks: list[dict[str, Any]] = []
    for i, block in enumerate(item.get("content", [])):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise fail(f"field 'content': block {i} must be a mapping with a string 'type'")
        blocks.append(block)
    if "text" in item:
        blocks.append({"type": "text", "text": item["text"]})
    if "tool_use" in item:
        tool = item["tool_use"]
        bad = sorted(set(tool) - {"name", "input", "id"})
        if bad:
            raise fail(f"field 'tool_use': unknown key {bad[0]!r}")
        name, args, tool_id = tool.get("name"), tool.get("input", {}), tool.get("id")
        if not isinstance(name, str) or not isinstance(args, dict):
            raise fail("field 'tool_use': needs a string 'name' and a mapping 'input'")
        if not isinstance(tool_id, str | None):
            raise fail("field 'tool_use': 'id' must be a string")
        blocks.extend(Reply.tool_use(name, args, tool_id).content)
        kw.setdefault("stop_reason", "tool_use")
    for key, value in item.get("usage", {}).items():
        if key not in _USAGE_KEYS:
            raise fail(f"field 'usage': unknown key {key!r}")
        if not _is_int(value) or value < 0:
            raise fail(f"field 'usage': {key!r} must be a non-negative integer")
        kw[key] = value
    if "delay" in item:
        kw["delay"] = float(item["delay"])
    try:
        return Reply(content=blocks, **kw)
    except ValueError as exc:  # the combinations Reply itself refuses (e.g. a 200 'message')
        raise fail(str(exc)) from None


def _read(path: str | Path) -> object:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ScriptError(f"{name}: {exc}") from exc


def _replies(data: object, where: str) -> tuple[Reply, ...]:
    if not isinstance(data, list):
        raise ScriptError(f"{where}: expected a list of replies, got {type(data).__name__}")
    return tuple(_parse_item(item, f"{where}: item {i}") for i, item in enumerate(data))


def load_script(path: str | Path) -> tuple[Reply, ...]:
    """Read a YAML (or JSON) list of replies; error messages number items from 0.

    Item keys: ``text``, ``tool_use: {name, input, id?}``, ``content`` (raw blocks),
    ``stop_reason``, ``usage: {input_tokens, output_tokens, cache_read_input_tokens,
    cache_creation_input_tokens}``, ``delay`` (seconds), ``status`` (HTTP code), ``message``
    (an error reply's message). ``body`` (any JSON value) or ``raw`` (a string) is the whole
    response body instead, sent with ``content_type`` (default ``application/json``).
    """
    return _replies(_read(path), str(path))


@attrs.frozen
class ScriptFile:
    """A script file's contents: ordered ``replies`` and per-conversation scripts."""

    replies: tuple[Reply, ...] = ()
    conversations: Mapping[str, tuple[tuple[Reply, ...], ...]] = attrs.field(factory=dict)


def _turn(item: object, where: str) -> tuple[Reply, ...]:
    if not isinstance(item, list):
        return (_parse_item(item, where),)
    if not item:
        raise ScriptError(f"{where}: a list of attempts must not be empty")
    return tuple(_parse_item(one, f"{where}: attempt {i}") for i, one in enumerate(item))


def load_script_file(path: str | Path) -> ScriptFile:
    """Read a script file: a list of replies (as :func:`load_script`), or a mapping with
    ``replies`` (that list) and/or ``conversations`` (first user message text -> list of
    turns; a turn is a reply item, or a list of items answering successive attempts)."""
    name = str(path)
    data = _read(path)
    if isinstance(data, list):
        return ScriptFile(_replies(data, name))
    if not isinstance(data, dict):
        what = type(data).__name__
        raise ScriptError(f"{name}: expected a list of replies or a mapping, got {what}")
    unknown = sorted(str(k) for k in set(data) - {"replies", "conversations"})
    if unknown:
        raise ScriptError(f"{name}: unknown key {unknown[0]!r} (expected replies, conversations)")
    replies = _replies(data.get("replies", []), f"{name}: replies")
    keyed = data.get("conversations", {})
    if not isinstance(keyed, dict):
        what = type(keyed).__name__
        raise ScriptError(f"{name}: field 'conversations': expected a mapping, got {what}")
    conversations: dict[str, tuple[tuple[Reply, ...], ...]] = {}
    for key, turns in keyed.items():
        where = f"{name}: conversation {key!r}"
        if not isinstance(key, str):
            raise ScriptError(f"{where}: the key must be a string (the first user message)")
        if not isinstance(turns, list) or not turns:
            raise ScriptError(f"{where}: expected a non-empty list of turns")
        conversations[key] = tuple(_turn(t, f"{where}: turn {i}") for i, t in enumerate(turns))
    return ScriptFile(replies, conversations)

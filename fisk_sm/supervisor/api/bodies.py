"""Request bodies of the control API: one JSON object, checked before anything uses it.

`read_object` refuses (`BadRequest`, 400, naming the field or `body`): a body nested deeper than
`MAX_DEPTH` (counted on the raw bytes, without recursion, before `json.loads`, so a body of
100,000 brackets cannot exhaust the stack), one that is not JSON or not an object, and any string
holding a lone surrogate (`"\\ud800"` is valid JSON but no valid text: it cannot be journaled as
UTF-8 or shown). The size cap is `security.BodyLimit`'s, on the bytes as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import re
from itertools import accumulate
from typing import Any

from starlette.requests import Request

__all__ = ["MAX_DEPTH", "BadRequest", "check_depth", "check_text", "field", "read_object"]

MAX_DEPTH = 32
#: A body longer than this is checked and parsed in a worker thread, off the loop.
INLINE = 64 << 10
#: Escapes (`\"` is no quote), then strings (an unterminated one runs to the end): both removed
#: before brackets are counted. Neither pattern backtracks, so the scan is linear.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"?')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class BadRequest(ValueError):
    """A bad body, field or id (HTTP 400)."""


def check_depth(raw: bytes, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON text nested deeper than `limit` (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:  # the usual flat body: no scan needed
        return
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", raw)).translate(None, _NOT_BRACKET)
    if brackets and max(accumulate(map(_STEP.__getitem__, brackets))) > limit:
        raise BadRequest(f"body: nested deeper than {limit} levels")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text(value: Any, name: str = "body") -> None:
    """Refuse a lone surrogate in any string of `value` (keys too), naming where it is."""
    stack: list[tuple[Any, str]] = [(value, name)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                raise BadRequest(f"{where}: contains a lone surrogate")
        elif isinstance(item, dict):
            for key, inner in item.items():
                if _has_surrogate(key):
                    raise BadRequest(f"{where}: a key contains a lone surrogate")
                stack.append((inner, key if where == "body" else f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{n}]") for n, inner in enumerate(item))


def _reason(exc: ValueError) -> str:
    """Why `json.loads` refused: its own message, or what the other `ValueError`s mean."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    if "integer string conversion" in str(exc):  # past sys.get_int_max_str_digits()
        return "integer too long"
    return " ".join(str(exc).split())[:80]


def _parse(raw: bytes) -> dict[str, Any]:
    check_depth(raw)
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError as exc:  # UnicodeDecodeError too: bytes that are no UTF-8
        raise BadRequest(f"body: not valid JSON ({_reason(exc)})") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    check_text(body)
    return body


async def read_object(request: Request) -> dict[str, Any]:
    """The request's body, one JSON object (`BadRequest` otherwise)."""
    raw = await request.body()
    if len(raw) > INLINE:
        return await asyncio.to_thread(_parse, raw)
    return _parse(raw)


def field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """The string `body[name]` (None when absent or null, unless `required`)."""
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name}: required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name}: must be a string, not {type(value).__name__}")
    return value

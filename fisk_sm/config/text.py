"""The one rule for text that cannot be encoded as UTF-8 (a lone surrogate, or invalid UTF-8
that Python decoded with ``surrogateescape``), by where the text came from.

- From a person (a prompt, a chat line, a follow-up posted to a supervisor): refused, with one
  line naming the field (`refuse_unencodable`), before anything is journaled; they can type it
  again.
- From the model, a tool or a journal: replaced with U+FFFD (`scrub`, `scrub_json`), before it
  is journaled or sent to the model. Nobody is there to ask, and the run must go on: a surrogate
  that reached the SDK would end the run (its request encoder is strict UTF-8), and one in a
  journal would end every resume of it.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import TypeVar, overload

__all__ = ["UnencodableText", "is_encodable", "refuse_unencodable", "scrub", "scrub_json"]

# Every surrogate in a str is lone: a pair decoded from UTF-8 or JSON is one code point.
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


class UnencodableText(ValueError):
    """A person's text holds a lone surrogate or invalid UTF-8; the message names the field."""


def is_encodable(text: str) -> bool:
    """Whether `text` has a UTF-8 form (no lone surrogate)."""
    return text.isascii() or _SURROGATE.search(text) is None


def refuse_unencodable(text: str, field: str) -> str:
    """`text` unchanged, or `UnencodableText` naming `field` (one line)."""
    if not is_encodable(text):
        raise UnencodableText(
            f"{field}: holds text that cannot be encoded (invalid UTF-8 or a lone surrogate)"
        )
    return text


def scrub(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (`text` itself when it has none)."""
    if text.isascii():
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


_T = TypeVar("_T")


@overload
def scrub_json(value: str) -> str: ...
@overload
def scrub_json(value: _T) -> _T: ...
def scrub_json(value: object) -> object:
    """A JSON-shaped value (dicts, lists, strings, scalars) with `scrub` applied to every
    string, keys included; the value itself when nothing needed replacing. The result has the
    input's shape (a dict stays a dict, a tuple a tuple), so it has the input's type."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        items = [(scrub_json(k), scrub_json(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        scrubbed = [scrub_json(v) for v in value]
        if all(v is v0 for v, v0 in zip(scrubbed, value, strict=True)):
            return value
        return type(value)(scrubbed)
    return value

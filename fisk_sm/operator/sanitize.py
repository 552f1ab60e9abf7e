"""The one sanitizer: what fisk-sm shows on a terminal carries no control sequence.

Anything that came from the model, the API or a journal (an answer, a tool name, a tool's input,
an error message from the API, a transcript) may hold escape sequences that recolour, clear,
retitle or rewrite the terminal, or bidi controls that make text read differently than it is.
Every such string passes through `strip_control` (or `sanitize`, for one line) before it reaches
a terminal. What goes to a file or a pipe stays byte-exact: `for_terminal` strips only when the
stream is a terminal.
"""

from __future__ import annotations

import re
import sys
import unicodedata

#: `typing.TYPE_CHECKING` without importing typing, which `fisk-sm ctl` never needs otherwise
#: (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO

__all__ = ["for_terminal", "is_terminal", "make_visible", "sanitize", "say", "strip_control"]

# Order matters: a string sequence (OSC, DCS, SOS, PM, APC) goes whole with its payload only when
# it is terminated; an unterminated one loses just its introducer, so it cannot swallow the rest
# of the line out of the operator's sight. Whatever is left of C0 (but \t and \n), DEL and C1 goes
# last, so no control character of any kind survives.
_CONTROL = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"  # strings
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b[ -/]*[0-~]"  # other escape sequences
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 (but \t, \n), DEL, C1
    r"|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"  # bidi controls that reorder text
)


def strip_control(text: str) -> str:
    """`text` without terminal control sequences and control characters (keeps `\\n`, `\\t`)."""
    return _CONTROL.sub("", text)


def sanitize(text: str, limit: int = 500) -> str:
    """`text` as one safe line: controls stripped, whitespace collapsed, at most `limit` runes."""
    flat = " ".join(strip_control(text).split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def is_terminal(stream: IO[str] | None) -> bool:
    """Whether `stream` is an open terminal."""
    try:
        return stream is not None and bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def for_terminal(text: str, stream: IO[str] | None) -> str:
    """`text` stripped of controls when `stream` is a terminal; byte-exact otherwise."""
    return strip_control(text) if is_terminal(stream) else text


def say(text: str, stream: IO[str] | None = None) -> None:
    """Write `text` as one line on `stream` (default: the current stderr), controls stripped.

    Diagnostics are for people, so they are stripped even when stderr is not a terminal: a log
    file of them is read on a terminal too.
    """
    out = sys.stderr if stream is None else stream
    out.write(" ".join(strip_control(text).splitlines()) + "\n")
    out.flush()


_HIDDEN = ("Cc", "Cf", "Zl", "Zp")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def make_visible(text: str) -> str:
    """Control and format characters (escapes, newlines, bidi overrides) shown as `\\uXXXX`.

    For a command line put to the operator: unlike `strip_control`, nothing that would run
    disappears from view.
    """
    return "".join(
        _NAMED.get(ch) or (f"\\u{ord(ch):04x}" if unicodedata.category(ch) in _HIDDEN else ch)
        for ch in text
    )

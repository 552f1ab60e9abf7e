"""The pieces of config checking that every config module shares.

`ConfigError` is the one error type for bad configuration: its `str()` is
`"{source}: {field}: {problem}"` on a single line. `check` turns a predicate into an attrs
validator raising it, and `parse_duration` reads Go-style durations.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["ConfigError", "check", "one_line", "parse_duration", "show"]

_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART_RE.pattern})+")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_UNIT_SECONDS |= {"m": 60.0, "h": 3600.0}


def one_line(text: object, limit: int | None = None) -> str:
    """`text` with its whitespace runs (line breaks included) folded into single spaces, cut to
    `limit` characters when one is given."""
    flat = " ".join(str(text).split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


def _short_repr() -> reprlib.Repr:
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother, shown.maxlong = 3, 60, 60, 60
    shown.maxlist = shown.maxtuple = shown.maxdict = shown.maxset = shown.maxfrozenset = 6
    return shown


_SHORT = _short_repr()


def show(value: object) -> str:
    """A short repr of a bad value for an error message. Bounded work, whatever the value: a
    YAML alias tree (a few hundred bytes, shared lists billions of items deep when expanded) is
    never walked whole, nor is a long string copied."""
    if isinstance(value, str | bytes):
        text = repr(value[:80])  # a prefix's repr is the repr's prefix (all that is shown)
    elif isinstance(value, bool | float | type(None)):
        text = repr(value)
    else:  # containers (depth and width cut), ints (digits cut)
        try:
            text = _SHORT.repr(value)
        except ValueError:  # an int past sys.get_int_max_str_digits(), maybe deep inside
            text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= 60 else text[:57] + "..."


class ConfigError(ValueError):
    """A configuration problem: `str()` is `"{source}: {field}: {problem}"`, one line."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = map(one_line, (source, field, problem))
        super().__init__(f"{self.source}: {self.field}: {self.problem}")


_T = TypeVar("_T")


class _Named(Protocol):
    """What a validator reads of the attrs `Attribute` it checks (whatever the field's type)."""

    @property
    def name(self) -> str: ...


def check(test: Callable[[_T], str | None]) -> Callable[[object, _Named, _T], None]:
    """An attrs validator that raises `ConfigError` with the problem `test` returns."""

    def validate(_inst: object, attribute: _Named, value: _T) -> None:
        problem = test(value)
        if problem:
            raise ConfigError("<config>", attribute.name, problem)

    return validate


def parse_duration(text: str) -> float:
    """Parse a Go-style duration (`120s`, `1m30s`, `500ms`, `1.5s`, `0`) to seconds.

    Raises `ValueError` (`invalid duration '...'`) for anything else.
    """
    if text == "0":
        return 0.0
    if not isinstance(text, str) or not _DURATION_RE.fullmatch(text):
        raise ValueError(f"invalid duration {show(text)}")
    parts = _DURATION_PART_RE.findall(text)
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)

"""The limits every tool kind has: how much output reaches the model, and for how long a call
may run. One copy of the defaults and of the checks, for agent.yaml and the `@tool` decorator.

- `max_output`: bytes of a result's text (UTF-8). Over it, the first and last halves are kept
  around a marker that says how much was left out (`fisk_sm.tools.output`).
- `max_image`: bytes of an image's base64 data, the size the Messages API measures (its own
  limit is 5 MiB of base64). An image over it is never cut: the result becomes an `is_error`
  that names the limit.
- `timeout`: seconds a call may run (Go-style durations in YAML); None: no limit.
"""

from __future__ import annotations

import math

from fisk_sm.config.errors import parse_duration, show

__all__ = [
    "MAX_IMAGE",
    "MAX_OUTPUT",
    "byte_limit_problem",
    "parse_timeout",
    "timeout_problem",
]

#: Bytes of text a tool result keeps by default (exec's capture included).
MAX_OUTPUT = 65536
#: Bytes of base64 an image in a tool result may have: the Messages API's own limit.
MAX_IMAGE = 5 * 1024 * 1024


def byte_limit_problem(value: object) -> str | None:
    """Why `value` is not a `max_output` or `max_image` (a positive integer of bytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None
    return f"must be a positive number of bytes, got {show(value)}"


def timeout_problem(value: object) -> str | None:
    """Why `value` is not a timeout in seconds (None, or a positive finite number)."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, int | float) and number and math.isfinite(value) and value > 0:
        return None
    return f"must be a positive duration such as '30s', got {show(value)}"


def parse_timeout(value: object) -> float:
    """A timeout from YAML: a positive number of seconds or a Go-style duration (`1m30s`).

    Raises ValueError with the problem."""
    try:
        seconds = parse_duration(value) if isinstance(value, str) else value
    except ValueError:
        seconds = None
    if seconds is None or timeout_problem(seconds) or not isinstance(seconds, int | float):
        raise ValueError(f"must be a positive duration such as '30s', got {show(value)}")
    return float(seconds)

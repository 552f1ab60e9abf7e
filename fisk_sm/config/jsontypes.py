"""The type of JSON data as `json.loads` gives it, for the places where JSON is really open.

The core is checked with mypy's `disallow_any_explicit` (pyproject.toml): a value whose shape
fisk-sm knows is a record, a value it only passes on is an `object`, and a JSON document whose
shape is the sender's (a journal line, a message in its wire form) is a `JSON`. Reading one
means narrowing it (`isinstance`), which is what a reader of foreign JSON must do anyway.

mypy handles the recursive alias; note only that `dict` is invariant, so a `dict[str, str]`
variable is not a `JSONObject` (a literal, or what `json.loads` returns, is).
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = ["JSON", "JSONObject"]

#: Any JSON value: what `json.loads` returns.
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
#: A JSON object: what `json.loads` returns for `{...}`.
JSONObject: TypeAlias = dict[str, JSON]

"""The tool-schema mapping `@tool` used before pydantic (commit 5a27dad), for recognition only.

Nothing builds a tool with it. A session's fingerprint records a digest of its tool definitions;
a session saved before the pydantic mapping (`fisk_sm.tools.schema`) recorded the digest of the
schemas this mapping gave, which differ for `X | None`, `Enum`, fixed-length `tuple`, `TypedDict`
and attrs parameters. The resume gate (`fisk_sm.loop.fingerprint`) imports this module only when
the recorded tool digest differs from today's, to ask whether it is what this mapping would
have made of the same functions: then the tools did not change, only their schemas' mapping, and
the run resumes (sending the new schemas). The code below is 5a27dad's, unchanged: do not
"fix" it, or the sessions it recognises stop resuming.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from fisk_sm.tools.base import Tool

__all__ = ["legacy_definitions", "schema_for"]

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}


def _schema_of(hint: Any) -> dict[str, Any]:
    origin = get_origin(hint)
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(hint) if a is not type(None)]
        return _schema_of(inner[0]) if len(inner) == 1 else {}
    if origin in (list, tuple, Sequence):
        args = get_args(hint)
        return {"type": "array", "items": _schema_of(args[0])} if args else {"type": "array"}
    if origin in (dict, Mapping):
        return {"type": "object"}
    return {"type": _JSON_TYPES[hint]} if hint in _JSON_TYPES else {}


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and its `Args:` entries."""
    text = inspect.cleandoc(doc)
    head, _, args = text.partition("\nArgs:\n")
    described: dict[str, str] = {}
    current = ""
    for line in args.splitlines():
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if match and (not current or len(line) - len(line.lstrip()) <= 4):
            current = match.group(1)
            described[current] = match.group(2).strip()
        elif current and line.strip():
            described[current] = f"{described[current]} {line.strip()}".strip()
    return head.strip(), described


def schema_for(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """The description and input schema 5a27dad's `@tool` gave `fn`."""
    description, described = _docstring_parts(fn.__doc__ or "")
    hints = get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _schema_of(hints.get(name, Any))
        if name in described:
            prop["description"] = described[name]
        if param.default is param.empty:
            required.append(name)
        else:
            prop["default"] = param.default
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return description, schema


def legacy_definitions(tools: Iterable[Tool]) -> list[dict[str, Any]] | None:
    """The definitions of `tools` as 5a27dad offered them, or None if it could not have.

    Only a tool whose schema was derived from its signature (it has a `check`) is mapped
    anew; one given its schema by hand, and every other kind, kept its definition. The name
    and the description were made as they are today."""
    out: list[dict[str, Any]] = []
    for t in tools:
        definition = t.definition
        if t.check is not None:
            try:
                _, schema = schema_for(t.fn)
            # a hint the old mapping could not read (get_type_hints, inspect.signature):
            # no session of it can exist
            except (NameError, TypeError, ValueError, AttributeError):
                return None
            definition = {**definition, "input_schema": schema}
        out.append(definition)
    return out

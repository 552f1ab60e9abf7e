"""The description and input schema of a Python tool, from its signature and docstring.

`@tool` (`fisk_sm.tools.base`) offers a function to the model under them unless it is given
its own. A parameter's type hint becomes its JSON schema type (an unknown one: no constraint), an
`Args:` section of the docstring describes the parameters, and a parameter without a default is
required.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["schema_for"]

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
    """The description and input schema of `fn`, from its signature and docstring."""
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

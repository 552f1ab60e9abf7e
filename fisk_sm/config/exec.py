"""Exec tool declarations: the `command:` entries of agent.yaml's `tools`, validated.

A declaration names a command whose elements may hold ``{placeholder}`` references to typed
arguments (``{{`` and ``}}`` are literal braces). Each command element becomes exactly one argv
element (`fisk_sm.tools.exec` builds and runs it), so an argument value is never parsed by a
shell. Errors name the tool by index and name, e.g. ``tools[2] (say).command[1]``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

import attrs

from fisk_sm.config.errors import ConfigError, parse_duration, show
from fisk_sm.config.names import CRASH_POLICIES, TOOL_NAME_RE, pass_env_problem

__all__ = [
    "ARGUMENT_TYPES",
    "Argument",
    "ExecToolSpec",
    "parse_exec_tool",
    "placeholders",
    "render_value",
    "split_element",
]

ARGUMENT_TYPES = ("string", "integer", "number", "boolean", "enum")

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENT_RE = re.compile(_IDENT)
_TOKEN_RE = re.compile(rf"\{{\{{|\}}\}}|\{{({_IDENT})\}}|[{{}}]")
_TOOL_KEYS = (
    "name",
    "description",
    "command",
    "arguments",
    "tags",
    "timeout",
    "crash_policy",
    "pass_env",
)
_ARGUMENT_KEYS = ("name", "type", "required", "description", "values", "default", "allow_options")


@attrs.frozen
class Argument:
    """One typed argument of an exec tool; ``values`` lists an enum's choices.

    ``allow_options`` lets a string value given by the model start with ``-``."""

    name: str
    type: str
    required: bool = False
    description: str = ""
    values: tuple[str, ...] = ()
    default: str | int | float | bool | None = None
    allow_options: bool = False


@attrs.frozen
class ExecToolSpec:
    """A validated exec tool declaration; ``timeout`` is in seconds (None: no timeout).

    ``pass_env`` names variables let through although they look like credentials."""

    name: str
    description: str
    command: tuple[str, ...]
    arguments: tuple[Argument, ...] = ()
    tags: tuple[str, ...] = ()
    timeout: float | None = None
    crash_policy: str = "retry"
    pass_env: tuple[str, ...] = ()


def split_element(element: str) -> list[tuple[bool, str]]:
    """Split a command element into (is_placeholder, text) parts; a stray brace is a ValueError."""
    parts: list[tuple[bool, str]] = []
    literal, pos = "", 0
    for match in _TOKEN_RE.finditer(element):
        literal += element[pos : match.start()]
        token, pos = match.group(0), match.end()
        if match.group(1):
            parts += [(False, literal), (True, match.group(1))]
            literal = ""
        elif len(token) == 2:
            literal += token[0]
        else:
            raise ValueError(f"stray {token!r}; write {token * 2} for a literal brace")
    parts.append((False, literal + element[pos:]))
    return [(ref, text) for ref, text in parts if ref or text]


def placeholders(element: str) -> list[str]:
    """The ``{name}`` placeholders of one command element, in order (ValueError: stray brace)."""
    return [text for ref, text in split_element(element) if ref]


class _Where:
    """Builds ConfigErrors whose field names the tool by index and name."""

    def __init__(self, source: str, label: str) -> None:
        self.source, self.label = source, label

    def fail(self, field: str, problem: str) -> NoReturn:
        raise ConfigError(self.source, self.label + field, problem)


def _string_list(where: _Where, field: str, value: object, *, non_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        where.fail(field, f"expected a list of strings, got {show(value)}")
    if non_empty and not value:
        where.fail(field, "must not be empty")
    return tuple(value)


def _check_keys(where: _Where, prefix: str, raw: Iterable[object], known: Sequence[str]) -> None:
    for key in raw:
        if key not in known:
            where.fail(f"{prefix}.{key}", f"unknown key (expected one of {', '.join(known)})")


def _parse_argument(where: _Where, field: str, raw: object) -> Argument:
    if not isinstance(raw, Mapping):
        where.fail(field, f"expected a mapping, got {show(raw)}")
    _check_keys(where, field, raw, _ARGUMENT_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not _IDENT_RE.fullmatch(name):
        where.fail(f"{field}.name", f"must match {_IDENT}, got {show(name)}")
    kind = raw.get("type", "string")
    if kind not in ARGUMENT_TYPES:
        where.fail(
            f"{field}.type", f"type must be one of {', '.join(ARGUMENT_TYPES)}; got {kind!r}"
        )
    for key, expected in (("required", bool), ("description", str), ("allow_options", bool)):
        if key in raw and not isinstance(raw[key], expected):
            where.fail(f"{field}.{key}", f"expected a {expected.__name__}, got {show(raw[key])}")
    values: tuple[str, ...] = ()
    if kind == "enum":
        if "values" not in raw:
            where.fail(f"{field}.values", "an enum argument needs a non-empty list of values")
        values = _string_list(where, f"{field}.values", raw["values"], non_empty=True)
        if len(set(values)) != len(values):
            where.fail(f"{field}.values", "duplicate value")
    elif "values" in raw:
        where.fail(f"{field}.values", f"only an enum argument takes values, not {kind!r}")
    if "allow_options" in raw and kind != "string":
        where.fail(f"{field}.allow_options", f"only a string argument takes it, not {kind!r}")
    arg = Argument(name, kind, raw.get("required", False), raw.get("description", ""), values)
    arg = attrs.evolve(arg, allow_options=raw.get("allow_options", False))
    if "default" in raw:
        if arg.required:
            where.fail(f"{field}.default", "a required argument takes no default")
        try:
            render_value(arg, raw["default"])
        except ValueError as exc:
            where.fail(f"{field}.default", str(exc))
        arg = attrs.evolve(arg, default=raw["default"])
    return arg


def _parse_timeout(where: _Where, value: object) -> float:
    seconds = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            where.fail(".timeout", str(exc))
    if not (math.isfinite(seconds) and seconds > 0):
        where.fail(".timeout", f"must be a positive duration such as '30s', got {show(value)}")
    return seconds


def _parse_pass_env(where: _Where, value: object) -> tuple[str, ...]:
    names = _string_list(where, ".pass_env", value, non_empty=False)
    for i, name in enumerate(names):
        if problem := pass_env_problem(name):
            where.fail(f".pass_env[{i}]", problem)
    return names


def parse_exec_tool(raw: object, *, index: int, source: str) -> ExecToolSpec:
    """Validate one exec tool declaration (``tools[index]`` of ``source``).

    Raises :class:`ConfigError` whose field names the tool, e.g. ``tools[2] (say).command``.
    """
    where = _Where(source, f"tools[{index}]")
    if not isinstance(raw, Mapping):
        where.fail("", f"expected a mapping, got {show(raw)}")
    name = raw.get("name")
    if name is None:
        where.fail(".name", "missing")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        where.fail(".name", f"must match ^[a-zA-Z0-9_-]{{1,64}}$, got {show(name)}")
    where.label = f"tools[{index}] ({name})"
    _check_keys(where, "", raw, _TOOL_KEYS)
    if "command" not in raw:
        where.fail(".command", "missing")
    command = _string_list(where, ".command", raw["command"], non_empty=True)
    used: list[str] = []
    for i, element in enumerate(command):
        try:
            refs = placeholders(element)
        except ValueError as exc:
            where.fail(f".command[{i}]", str(exc))
        if "\0" in element:
            where.fail(f".command[{i}]", "must not contain a NUL character")
        if i == 0 and (refs or not element):
            where.fail(".command[0]", "the program must be a fixed, non-empty name")
        used += refs
    raw_args = raw.get("arguments", [])
    if not isinstance(raw_args, list):
        where.fail(".arguments", f"expected a list, got {show(raw_args)}")
    arguments: list[Argument] = []
    for i, item in enumerate(raw_args):
        arg = _parse_argument(where, f".arguments[{i}]", item)
        if any(a.name == arg.name for a in arguments):
            where.fail(f".arguments[{i}].name", f"duplicate argument name {arg.name!r}")
        if arg.name not in used:
            where.fail(f".arguments[{i}]", f"argument {arg.name!r} is not used by the command")
        arguments.append(arg)
    for i, element in enumerate(command):
        for ref in placeholders(element):
            if all(a.name != ref for a in arguments):
                where.fail(f".command[{i}]", f"placeholder {{{ref}}} has no argument")
    description = raw.get("description", f"Run {command[0]}")
    if not isinstance(description, str):
        where.fail(".description", f"expected a string, got {show(description)}")
    policy = raw.get("crash_policy", "retry")
    if policy not in CRASH_POLICIES:
        where.fail(".crash_policy", f"must be one of {', '.join(CRASH_POLICIES)}, got {policy!r}")
    timeout = raw.get("timeout")
    return ExecToolSpec(
        name=name,
        description=description,
        command=command,
        arguments=tuple(arguments),
        tags=_string_list(where, ".tags", raw.get("tags", []), non_empty=False),
        timeout=None if timeout is None else _parse_timeout(where, timeout),
        crash_policy=policy,
        pass_env=_parse_pass_env(where, raw.get("pass_env", [])),
    )


def render_value(arg: Argument, value: object, *, given: bool = False) -> str:
    """The value as argv text, or ValueError saying why it does not fit the argument.

    A ``given`` value (the model's, not the author's default) is also refused as an option.
    """
    if arg.type == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    if arg.type in ("integer", "number") and not isinstance(value, bool):
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float) and math.isfinite(value):
            if value.is_integer() and abs(value) < 1e16:
                return str(int(value))
            if arg.type == "number":
                return str(value)
    if arg.type in ("string", "enum") and isinstance(value, str):
        if "\0" in value:
            raise ValueError("must not contain a NUL character")
        if given and arg.type == "string" and value.startswith("-") and not arg.allow_options:
            raise ValueError(
                "must not start with '-' (it would be read as an option);"
                " declare allow_options: true to permit it"
            )
        if arg.values and value not in arg.values:
            raise ValueError(f"must be one of {', '.join(arg.values)}; got {show(value)}")
        return value
    article = "an" if arg.type[0] in "aeiou" else "a"
    raise ValueError(f"expected {article} {arg.type}, got {show(value)}")

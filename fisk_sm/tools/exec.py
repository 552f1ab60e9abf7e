"""Exec tools: programs declared in agent.yaml, run as argv with no shell.

A declaration names a command whose elements may hold ``{placeholder}`` references to typed
arguments (``{{`` and ``}}`` are literal braces). Each command element becomes exactly one argv
element, so an argument value is never parsed by a shell; a string value from the model starting
with ``-`` is refused (unless its argument has ``allow_options: true``), so it is never read as an
option. :mod:`fisk_sm.tools.process` runs it: no credentials in its environment (but
``pass_env``), its process group killed when it ends, output merged and kept to the first and
last 32 KiB.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fisk_sm.config.exec import ExecToolSpec, render_value, split_element
from fisk_sm.operator.sanitize import make_visible
from fisk_sm.tools.base import Tool, ToolError
from fisk_sm.tools.process import run_command

__all__ = ["build_argv", "exec_tool", "input_schema"]


def input_schema(spec: ExecToolSpec) -> dict[str, Any]:
    """The JSON schema of the tool's input (``required`` is left out when nothing is)."""
    properties: dict[str, Any] = {}
    for arg in spec.arguments:
        prop: dict[str, Any] = {"type": "string" if arg.type == "enum" else arg.type}
        if arg.values:
            prop["enum"] = list(arg.values)
        if arg.description:
            prop["description"] = arg.description
        if arg.default is not None:
            prop["default"] = arg.default
        properties[arg.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [arg.name for arg in spec.arguments if arg.required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def build_argv(spec: ExecToolSpec, arguments: Mapping[str, Any]) -> list[str]:
    """The argv for one call: placeholders filled in, one element per command element.

    An element referring to an optional argument that was not given (nor defaulted) is left
    out. A value that does not fit its argument, a string value starting with ``-`` (unless
    ``allow_options``), a missing required argument and an unknown argument raise
    :class:`ToolError`.
    """
    by_name = {arg.name: arg for arg in spec.arguments}
    unknown = sorted(str(key) for key in arguments if key not in by_name)
    if unknown:
        raise ToolError(f"tool {spec.name!r} has no argument(s): {', '.join(unknown)}")
    text: dict[str, str] = {}
    for arg in spec.arguments:
        given = arguments.get(arg.name)
        value = arg.default if given is None else given
        if value is None:
            if arg.required:
                raise ToolError(f"tool {spec.name!r}: argument {arg.name!r} is required")
            continue
        try:
            text[arg.name] = render_value(arg, value, given=given is not None)
        except ValueError as exc:
            raise ToolError(f"tool {spec.name!r}: argument {arg.name!r}: {exc}") from None
    argv: list[str] = []
    for element in spec.command:
        parts = split_element(element)
        if all(part in text for ref, part in parts if ref):
            argv.append("".join(text[part] if ref else part for ref, part in parts))
    return argv


def exec_tool(spec: ExecToolSpec, *, work_dir: Path | None = None) -> Tool:
    """The :class:`Tool` that runs ``spec`` in ``work_dir`` (default: the current directory)."""

    async def run(**arguments: Any) -> dict[str, Any]:
        return await run_command(
            build_argv(spec, arguments),
            timeout=spec.timeout,
            work_dir=work_dir,
            pass_env=spec.pass_env,
        )

    def display(name: str, arguments: Mapping[str, Any]) -> str:
        try:
            line = shlex.join(build_argv(spec, arguments))
        except ToolError:
            line = f"{name} {json.dumps(dict(arguments), ensure_ascii=False, default=str)}"
        return make_visible(line)

    run.__name__ = run.__qualname__ = spec.name
    return Tool(
        name=spec.name,
        description=spec.description,
        input_schema=input_schema(spec),
        fn=run,
        crash_policy=spec.crash_policy,
        tags=spec.tags,
        kind="exec",
        display=display,
        # Capped at the source: the capture keeps the output's head and tail, so the
        # {command, exit_code, output} it returns stays whole JSON.
        max_output=None,
    )

"""Python tools: the `@tool` decorator, the tool box and dispatch.

A tool is a Python callable (sync or async) plus a name, a description and a JSON schema for its
input. The schema comes from the function's type hints and docstring (`fisk_sm.tools.schema`), or
is given explicitly. Dispatch never raises for the model's mistakes: an unknown tool, missing
required parameters and a tool that raises all become `is_error` results, and the run goes on.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from fisk_sm.config.limits import MAX_IMAGE, MAX_OUTPUT, byte_limit_problem, timeout_problem
from fisk_sm.config.names import CRASH_POLICIES
from fisk_sm.config.text import scrub, scrub_json
from fisk_sm.tools.output import cap_blocks, cap_text, image_problem
from fisk_sm.tools.schema import InputError, derive
from fisk_sm.tools.worker import call_in_thread

__all__ = [
    "Content",
    "Outcome",
    "Tool",
    "ToolBox",
    "ToolError",
    "ToolLoadError",
    "load_tool",
    "tool",
]


class ToolLoadError(ValueError):
    """A `module:function` tool reference could not be loaded."""


class ToolError(Exception):
    """Raised by a tool for a failure of the harness or the invocation (not of the task).

    The message becomes the content of an `is_error` result. A tool's own negative outcome (a
    non-zero exit, a miss, a refusal) is a normal result instead, for the model to reason about.
    """


def _check_limit(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if attribute.name == "timeout":
        problem = timeout_problem(value)
    else:
        problem = None if value is None else byte_limit_problem(value)
    if problem:
        raise ValueError(f"{attribute.name} {problem}")


def _json_call(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{name} {json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)}"


@attrs.frozen
class Tool:
    """A callable the model may ask for, with the definition it is offered under.

    `fn` is called with the model's arguments as keywords: a coroutine function is awaited, a
    plain function runs on a daemon thread of its own (`fisk_sm.tools.worker`). `kind` says
    what it is (python, exec, builtin, memory, remote) for tracing and counting; `tags` feed
    selection and the confirm gate; `display` renders a call as the operator sees it (a
    command line for exec tools). Dispatch holds every call to `timeout` seconds (None: no
    limit) and its result to `max_output` bytes of text (None: the kind caps it at the source)
    and `max_image` bytes of base64 per image (`fisk_sm.config.limits`).
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any] = attrs.field(eq=False, repr=False)
    crash_policy: str = "retry"
    tags: tuple[str, ...] = ()
    kind: str = "python"
    #: For a remote tool, the host that runs it.
    agent: str = ""
    display: Callable[[str, Mapping[str, Any]], str] = attrs.field(
        default=_json_call, eq=False, repr=False
    )
    timeout: float | None = attrs.field(default=None, validator=_check_limit)
    max_output: int | None = attrs.field(default=MAX_OUTPUT, validator=_check_limit)
    max_image: int = attrs.field(default=MAX_IMAGE, validator=_check_limit)
    #: For a tool made from a signature: checks the model's input against it and returns the
    #: arguments converted to the function's types, or raises `InputError` naming the field.
    check: Callable[[Mapping[str, Any]], dict[str, Any]] | None = attrs.field(
        default=None, eq=False, repr=False
    )

    @property
    def definition(self) -> dict[str, Any]:
        """The tool as the Messages API's `tools` list wants it; tags end the description."""
        description = self.description
        if self.tags:
            description = f"{description}\n\nTags: {', '.join(self.tags)}"
        return {
            "name": self.name,
            "description": description,
            "input_schema": self.input_schema,
        }

    def describe(self, arguments: Mapping[str, Any]) -> str:
        """How a call with `arguments` is shown to the operator."""
        return self.display(self.name, arguments)

    @property
    def required(self) -> tuple[str, ...]:
        """Required parameter names, in schema order."""
        return tuple(self.input_schema.get("required", ()))


@attrs.frozen
class Outcome:
    """What one tool call produced: the text the model sees, and whether the harness failed."""

    content: str
    is_error: bool = False
    warning: str = ""
    #: The tool_result content as blocks (text and images) when it is more than text;
    #: `content` is then its text, for events and the terminal.
    blocks: tuple[dict[str, Any], ...] = ()


@attrs.frozen
class Content:
    """What a tool returns when its result is more than text: Messages API content blocks
    (`text`, `image`) for the tool_result, and their text."""

    text: str
    blocks: tuple[dict[str, Any], ...]


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    crash_policy: str = "retry",
    tags: Sequence[str] = (),
    timeout: float | None = None,
    max_output: int = MAX_OUTPUT,
    max_image: int = MAX_IMAGE,
) -> Any:
    """Make a `Tool` of a function: `@tool` or `@tool(name=..., input_schema=...)`.

    `timeout` (seconds; None: no limit), `max_output` and `max_image` (bytes) are the call's
    limits (`Tool`); a bad one is a ValueError."""
    if crash_policy not in CRASH_POLICIES:
        raise ValueError(f"crash_policy must be one of {', '.join(CRASH_POLICIES)}")

    def wrap(f: Callable[..., Any]) -> Tool:
        derived_description, derived_schema, check = derive(f)
        return Tool(
            name=name or f.__name__,
            description=description or derived_description or f.__name__,
            input_schema=input_schema or derived_schema,
            fn=f,
            crash_policy=crash_policy,
            tags=tuple(tags),
            timeout=timeout,
            max_output=max_output,
            max_image=max_image,
            # A schema given by hand is the caller's: the signature's check might contradict it.
            check=None if input_schema else check,
        )

    if max_output is None:
        raise ValueError("max_output must be a positive number of bytes, got None")
    return wrap(fn) if fn is not None else wrap


_MISSING = object()


def load_tool(
    ref: str,
    base_dir: Path,
    crash_policy: str = "retry",
    tags: Sequence[str] = (),
    limits: Mapping[str, Any] | None = None,
) -> Tool:
    """Load `module:function`, looking on sys.path and then in `base_dir` (the config's folder).

    `limits` (`timeout`, `max_output`, `max_image`) replace those of the function's `@tool`."""
    given = {key: value for key, value in (limits or {}).items() if value is not None}
    module_name, _, attr = ref.partition(":")
    try:
        module = _import(module_name, base_dir)
    except SystemExit as exc:  # the module's own code ran and asked to exit
        raise ToolLoadError(
            f"cannot import {module_name!r}: it called sys.exit({exc.code!r})"
        ) from None
    except SyntaxError as exc:
        raise ToolLoadError(f"cannot import {module_name!r}: SyntaxError: {exc}") from None
    except ModuleNotFoundError as exc:
        raise ToolLoadError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # a boundary: the user's module ran, and may raise anything
        raise ToolLoadError(
            f"cannot import {module_name!r}: {type(exc).__name__} at import: {exc}"
        ) from None
    obj = getattr(module, attr, _MISSING)
    if obj is _MISSING:
        raise ToolLoadError(f"cannot load tool {ref!r}: {module_name!r} has no {attr!r}")
    if isinstance(obj, Tool):
        return attrs.evolve(obj, crash_policy=crash_policy, tags=(*obj.tags, *tags), **given)
    if not callable(obj):
        raise ToolLoadError(f"cannot load tool {ref!r}: {attr!r} is not callable")
    made: Tool = tool(obj, crash_policy=crash_policy, tags=tags, **given)
    return made


def _import(module_name: str, base_dir: Path) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:
            raise
    folder = str(base_dir.resolve())
    if folder not in sys.path:
        sys.path.append(folder)
    return importlib.import_module(module_name)


def _missing_message(t: Tool, missing: list[str]) -> str:
    props = t.input_schema.get("properties", {})
    optional = sorted(p for p in props if p not in t.required)
    text = (
        f"tool {t.name!r} was called without required parameter(s): {', '.join(missing)}."
        f" required: {', '.join(t.required)}"
    )
    return text + (f"; optional: {', '.join(optional)}" if optional else "")


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


@attrs.frozen
class ToolBox:
    """The tools of one run, by name."""

    tools: Mapping[str, Tool]
    # The last input checked and what it converted to: a call is screened by the gate, again
    # before it runs, and then converted, and pydantic need validate it only once. Keyed by
    # identity: a call's input is its tool_use block's, which nothing mutates.
    _checked: list[tuple[Mapping[str, Any], Tool, dict[str, Any]]] = attrs.field(
        factory=list, init=False, eq=False, repr=False
    )

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> ToolBox:
        """Collect tools; two with one name are an error."""
        by_name: dict[str, Tool] = {}
        for t in tools:
            if t.name in by_name:
                raise ToolLoadError(f"duplicate tool name {t.name!r}")
            by_name[t.name] = t
        return cls(by_name)

    @property
    def definitions(self) -> list[dict[str, Any]]:
        """Every tool's definition, in registration order."""
        return [t.definition for t in self.tools.values()]

    def rejection(self, name: str, arguments: Mapping[str, Any]) -> Outcome | None:
        """The is_error outcome for a call that must not run, or None if it may."""
        t = self.tools.get(name)
        if t is None:
            return Outcome(f"unknown tool {name!r}", is_error=True, warning="unknown_tool")
        if not isinstance(arguments, Mapping):
            return Outcome(
                f"tool {name!r} input must be a JSON object", is_error=True, warning="bad_input"
            )
        missing = [p for p in t.required if p not in arguments]
        if missing:
            return Outcome(_missing_message(t, missing), is_error=True, warning="missing_required")
        if t.check is not None:
            try:
                self._converted(t, arguments)
            except InputError as exc:
                text = f"tool {name!r} input is invalid: {exc}"
                return Outcome(text, is_error=True, warning="bad_input")
        return None

    async def invoke(self, name: str, arguments: Mapping[str, Any]) -> Outcome:
        """Run a tool that passed `rejection`, within its limits (`Tool`): an exception or
        the timeout becomes an is_error outcome, text over `max_output` keeps its head and
        tail, an image over `max_image` makes the result an is_error. Every kind of tool is
        called through here, so none escapes the limits."""
        import asyncio

        t = self.tools[name]
        deadline = asyncio.timeout(t.timeout)
        try:
            async with deadline:  # an async tool is cancelled; a sync one is left to itself
                outcome = await self._call(name, arguments)
        except TimeoutError:
            if not deadline.expired():
                raise  # pragma: no cover - `_call` turns a tool's own errors into outcomes
            outcome = Outcome(f"tool {name!r} timed out after {t.timeout:g}s", is_error=True)
        return _capped(outcome, t)

    def _converted(self, t: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """`arguments` checked and converted by `t.check` (raises `InputError`)."""
        assert t.check is not None
        memo = self._checked
        if memo and memo[0][0] is arguments and memo[0][1] is t:
            return memo[0][2]
        converted = t.check(arguments)
        memo[:] = [(arguments, t, converted)]
        return converted

    async def _call(self, name: str, arguments: Mapping[str, Any]) -> Outcome:
        t = self.tools[name]
        fn = t.fn
        try:
            if t.check is not None:  # passed `rejection`: now converted to the function's types
                arguments = self._converted(t, arguments)
            if inspect.iscoroutinefunction(fn):
                value = await fn(**arguments)
            else:
                value = await call_in_thread(fn, arguments, name)
            if inspect.isawaitable(value):  # a sync function that returned an awaitable
                value = await value
        except ToolError as exc:
            return _scrubbed(Outcome(str(exc), is_error=True))
        # A boundary: a tool is the user's code, and whatever it raises becomes the call's
        # is_error result for the model to read, never the end of the run.
        except Exception as exc:
            failed = f"tool {name!r} failed: {type(exc).__name__}: {exc}"
            return _scrubbed(Outcome(failed, is_error=True))
        if isinstance(value, Content):
            return _scrubbed(Outcome(value.text, blocks=value.blocks))
        return _scrubbed(Outcome(_render(value)))


def _capped(outcome: Outcome, t: Tool) -> Outcome:
    """`outcome` within the limits of `t` (`fisk_sm.tools.output`)."""
    problem = next(filter(None, (image_problem(b, t.max_image) for b in outcome.blocks)), None)
    if problem is not None:
        return Outcome(f"tool {t.name!r} returned {problem}", is_error=True)
    if t.max_output is None:
        return outcome
    content, cut = cap_text(outcome.content, t.max_output)
    blocks, cut_blocks = cap_blocks(outcome.blocks, t.max_output)
    if not (cut or cut_blocks):
        return outcome
    return attrs.evolve(outcome, content=content, blocks=blocks)


def _scrubbed(outcome: Outcome) -> Outcome:
    """Every tool's output enters the run here: a lone surrogate in it (a str can hold one)
    becomes U+FFFD before it is journaled or sent (`fisk_sm.config.text`)."""
    content, blocks = scrub(outcome.content), scrub_json(outcome.blocks)
    if content is outcome.content and blocks is outcome.blocks:
        return outcome
    return attrs.evolve(outcome, content=content, blocks=blocks)

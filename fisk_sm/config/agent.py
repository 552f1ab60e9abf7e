"""Load ``agent.yaml`` into frozen attrs classes, with one-line errors naming file and field.

Every problem is reported as a :class:`ConfigError` whose ``str()`` is
``"{source}: {field}: {problem}"`` on a single line, e.g.
``agent.yaml: llm.budget.max_tokens: expected an integer, got 'abc'``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

import attrs

from fisk_sm.config.errors import ConfigError, check, parse_duration, show
from fisk_sm.config.exec import ExecToolSpec, parse_exec_tool
from fisk_sm.config.harness import HarnessConfig, NatsConfig, RemoteHost
from fisk_sm.config.limits import byte_limit_problem, parse_timeout
from fisk_sm.config.mcp import McpServer, check_mcp_servers, structure_argv
from fisk_sm.config.names import CRASH_POLICIES, IDENTITY_RE, check_base_url
from fisk_sm.config.telemetry import TelemetryConfig

if TYPE_CHECKING:
    import cattrs

__all__ = [
    "AgentConfig",
    "Budget",
    "ConfigError",
    "LLMConfig",
    "Thinking",
    "ToolSpec",
    "check_base_url",
    "load_config",
    "parse_config",
    "parse_duration",
]

_TOOL_REF_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
#: The model providers this version can call.
PROVIDERS = ("anthropic",)
_ENV_BASE_URL = "ANTHROPIC_BASE_URL"


class _Problem(Exception):
    """Raised by structure hooks; the field path is added when translating."""


def _default_max_tokens(value: int) -> int:
    return value or 200_000


def _default_max_iterations(value: int) -> int:
    return value or 50


_non_negative = check(lambda v: "must not be negative" if v < 0 else None)
_check_model = check(lambda v: None if v.strip() else "must not be empty")
_check_provider = check(
    lambda v: None if v in PROVIDERS else f"must be one of {', '.join(PROVIDERS)}, got {show(v)}"
)
_check_base_url_field = check(lambda v: None if v is None else check_base_url(v))
_check_tool_ref = check(
    lambda v: None if _TOOL_REF_RE.fullmatch(v) else f"expected 'module:function', got {show(v)}"
)
_check_crash_policy = check(
    lambda v: None if v in CRASH_POLICIES else f"must be one of {CRASH_POLICIES}, got {show(v)}"
)
_check_byte_limit = check(lambda v: None if v is None else byte_limit_problem(v))
_check_identity = check(
    lambda v: None if IDENTITY_RE.fullmatch(v) else f"must match [a-zA-Z0-9_-]+, got {show(v)}"
)


@attrs.frozen
class Budget:
    """Limits for one agent run. ``0`` for the token/iteration limits means the default."""

    max_tokens: int = attrs.field(
        default=200_000, converter=_default_max_tokens, validator=_non_negative
    )
    max_iterations: int = attrs.field(
        default=50, converter=_default_max_iterations, validator=_non_negative
    )
    #: Per-call timeout in seconds (YAML accepts Go-style durations such as ``1m30s``).
    call_timeout: float = attrs.field(default=120.0, validator=_non_negative)
    #: Output tokens per model call; ``0`` means automatic (see :attr:`LLMConfig.output_cap`).
    max_output_tokens: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class Thinking:
    """Extended-thinking settings."""

    enabled: bool = False


@attrs.frozen
class LLMConfig:
    """Which model to call, where, and within which limits."""

    model: str = attrs.field(validator=_check_model)
    provider: str = attrs.field(default="anthropic", validator=_check_provider)
    base_url: str | None = attrs.field(default=None, validator=_check_base_url_field)
    budget: Budget = Budget()
    thinking: Thinking = Thinking()
    #: Send no prompt-cache breakpoints (they are on by default: the biggest cost lever).
    no_prompt_cache: bool = False

    @property
    def output_cap(self) -> int:
        """``max_output_tokens`` if set, else 16384 with thinking enabled, else 8192."""
        if self.budget.max_output_tokens > 0:
            return self.budget.max_output_tokens
        return 16384 if self.thinking.enabled else 8192


@attrs.frozen
class ToolSpec:
    """A tool implemented by a Python function, given as ``"module:function"``."""

    python: str = attrs.field(validator=_check_tool_ref)
    crash_policy: str = attrs.field(default="retry", validator=_check_crash_policy)
    tags: tuple[str, ...] = ()
    #: The call's limits (`fisk_sm.config.limits`); None keeps the function's `@tool` ones,
    #: else the defaults: no timeout, 64 KiB of text, 5 MiB of base64 per image.
    timeout: float | None = None
    max_output: int | None = attrs.field(default=None, validator=_check_byte_limit)
    max_image: int | None = attrs.field(default=None, validator=_check_byte_limit)

    @property
    def limits(self) -> dict[str, Any]:
        """The limits given here, for `load_tool`."""
        return {"timeout": self.timeout, "max_output": self.max_output, "max_image": self.max_image}


@attrs.frozen
class AgentConfig:
    """The whole ``agent.yaml``; ``path`` is where it was loaded from (not a YAML key)."""

    llm: LLMConfig
    system_prompt: str = ""
    identity: str = attrs.field(default="fisk-sm", validator=_check_identity)
    tools: tuple[ToolSpec | ExecToolSpec, ...] = ()
    harness: HarnessConfig = attrs.Factory(HarnessConfig)
    #: Hosts of remote tools (NATS request/reply), and the NATS server to reach them on.
    remote_tools: tuple[RemoteHost, ...] = ()
    nats: NatsConfig = attrs.Factory(NatsConfig)
    #: MCP servers whose tools join the tool set (`fisk_sm.config.mcp`).
    mcp_servers: tuple[McpServer, ...] = ()
    #: OpenTelemetry traces (`fisk_sm.config.telemetry`).
    telemetry: TelemetryConfig = attrs.Factory(TelemetryConfig)
    path: Path | None = None

    @property
    def base_dir(self) -> Path:
        """Folder that tool modules are resolved against: the config's folder, or the cwd."""
        return self.path.parent if self.path is not None else Path.cwd()

    @property
    def sessions_directory(self) -> Path | None:
        """`harness.sessions.options.directory`, resolved against the config's folder."""
        directory = self.harness.sessions.options.directory
        return None if directory is None else self.base_dir / Path(directory).expanduser()

    @property
    def memory_directory(self) -> Path | None:
        """`harness.memory.options.directory`, resolved against the config's folder."""
        directory = self.harness.memory.options.directory
        return None if directory is None else self.base_dir / Path(directory).expanduser()

    @property
    def work_dir(self) -> Path:
        """Where exec tools run: `harness.work_dir` (from the config's folder), else the cwd."""
        work_dir = self.harness.work_dir
        return Path.cwd() if work_dir is None else self.base_dir / Path(work_dir).expanduser()


def _strict(kind: type, what: str) -> Callable[[object, object], Any]:
    def structure(value: object, _t: object) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _Problem(f"expected {what}, got {show(value)}")
        return value

    return structure


def _structure_duration(value: object, _t: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
    elif isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise _Problem(str(exc)) from None
    raise _Problem(f"invalid duration {show(value)}")


def _structure_timeout(value: object, _t: object) -> float:
    try:
        return parse_timeout(value)
    except ValueError as exc:
        raise _Problem(str(exc)) from None


def _make_converter() -> cattrs.Converter:
    import cattrs
    from cattrs.gen import make_dict_structure_fn, override

    conv = cattrs.Converter(forbid_extra_keys=True)
    for kind, what in ((int, "an integer"), (str, "a string"), (bool, "a boolean")):
        conv.register_structure_hook(kind, _strict(kind, what))
    overrides: dict[type, dict[str, Any]] = {
        Budget: {"call_timeout": override(struct_hook=_structure_duration)},
        AgentConfig: {"path": override(omit=True)},
        ToolSpec: {"timeout": override(struct_hook=_structure_timeout)},
        RemoteHost: {"timeout": override(struct_hook=_structure_timeout)},
        McpServer: {
            "command": override(struct_hook=structure_argv),
            "timeout": override(struct_hook=_structure_duration),
        },
    }

    def class_hook(cl: type) -> Callable[[object, object], Any]:
        inner: Callable[[Any, Any], Any] = make_dict_structure_fn(cl, conv, **overrides.get(cl, {}))

        def structure(value: object, t: object) -> Any:
            if not isinstance(value, Mapping):
                raise _Problem(f"expected a mapping, got {show(value)}")
            return inner(value, cl)

        return structure

    def is_list_field(t: Any) -> bool:
        return get_origin(t) is tuple and get_args(t)[-1:] == (Ellipsis,)

    def list_hook(t: Any) -> Callable[[object, object], Any]:
        item_type = get_args(t)[0]

        def structure(value: object, _t: object) -> Any:
            # A YAML scalar where a list belongs must not be iterated: 'ai:confirm' would
            # become the tags 'a', 'i', ':', ... and the tool would escape the gate.
            if not isinstance(value, list):
                raise _Problem(f"expected a list, got {show(value)}")
            return tuple(_structure_item(conv, i, item, item_type) for i, item in enumerate(value))

        return structure

    # Registered before the tools hook below, which then takes precedence for `tools`.
    conv.register_structure_hook_factory(is_list_field, list_hook)
    tools_type = tuple[ToolSpec | ExecToolSpec, ...]

    def structure_tools(value: object, t: Any) -> Any:
        if not isinstance(value, list):
            raise _Problem(f"expected a list, got {show(value)}")
        return tuple(_structure_tool(conv, index, item) for index, item in enumerate(value))

    conv.register_structure_hook_factory(attrs.has, class_hook)
    conv.register_structure_hook_func(lambda t: t == tools_type, structure_tools)
    return conv


def _structure_item(conv: cattrs.Converter, index: int, item: object, item_type: Any) -> Any:
    try:
        return conv.structure(item, item_type)
    except _structure_errors() as exc:
        raise _translate(exc, f"[{index}]", "") from None


def _structure_tool(conv: cattrs.Converter, index: int, item: object) -> ToolSpec | ExecToolSpec:
    """A `python:` entry is a ToolSpec; a `command:` entry an exec tool (checked by exectool)."""
    where = f"tools[{index}]"
    if not isinstance(item, Mapping):
        raise _Located(ConfigError("", where, f"expected a mapping, got {show(item)}"))
    if "python" in item:
        try:
            spec: ToolSpec = conv.structure(item, ToolSpec)
        except _structure_errors() as exc:
            raise _Located(_translate(exc, where, "")) from None
        return spec
    if "command" in item or "name" in item:
        try:
            return parse_exec_tool(item, index=index, source="")
        except ConfigError as exc:
            raise _Located(exc) from None
    problem = "a tool needs `python: module:function` or `name:` and `command: [...]`"
    raise _Located(ConfigError("", where, problem))


class _Located(Exception):
    """A ConfigError whose field is already the full path from the top of the file."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


def _duplicate_tool(tools: tuple[ToolSpec | ExecToolSpec, ...], source: str) -> None:
    seen: dict[str, int] = {}
    for index, spec in enumerate(tools):
        if isinstance(spec, ExecToolSpec):
            if spec.name in seen:
                field = f"tools[{index}] ({spec.name}).name"
                problem = f"duplicate tool name {spec.name!r} (also tools[{seen[spec.name]}])"
                raise ConfigError(source, field, problem)
            seen[spec.name] = index


def _structure_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises while structuring; anything else is a bug and is not dressed up
    as one. (A function: cattrs is imported when a config is first parsed, not at import.)"""
    import cattrs

    return (cattrs.BaseValidationError, ValueError, TypeError, KeyError, _Problem, _Located)


#: The converter, built by the first `parse_config` (`_converter`): building it (and importing
#: cattrs) cost some 10 ms of every `from fisk_sm import Run`, which may never parse a config.
_CONVERTER: cattrs.Converter | None = None


def _converter() -> cattrs.Converter:
    global _CONVERTER  # built once, on first use
    if _CONVERTER is None:
        _CONVERTER = _make_converter()
    return _CONVERTER


def _join(prefix: str, name: str) -> str:
    if not prefix or name.startswith("["):
        return prefix + name
    return f"{prefix}.{name}" if name else prefix


def _translate(exc: BaseException, path: str, source: str) -> ConfigError:
    """Turn the first problem in a (nested) cattrs exception into a ConfigError."""
    from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

    if isinstance(exc, _Located):
        return ConfigError(source, exc.error.field, exc.error.problem)
    if isinstance(exc, ConfigError):
        return ConfigError(source, _join(path, exc.field), exc.problem)
    if isinstance(exc, _Problem):
        return ConfigError(source, path or "(top level)", str(exc))
    if isinstance(exc, ForbiddenExtraKeysError):
        key = sorted(exc.extra_fields, key=str)[0]
        return ConfigError(source, _join(path, str(key)), "unknown key")
    if isinstance(exc, ClassValidationError):
        with_notes, others = exc.group_exceptions()
        for sub in others:  # unknown keys and constructor validators come first
            return _translate(sub, path, source)
        for sub, note in with_notes:
            if isinstance(sub, KeyError):
                return ConfigError(source, _join(path, note.name), "required")
            return _translate(sub, _join(path, note.name), source)
    if isinstance(exc, IterableValidationError):
        for sub, inote in exc.group_exceptions()[0]:
            return _translate(sub, f"{path}[{inote.index}]", source)
    if not isinstance(exc, ValueError | TypeError):
        raise exc  # a bug in fisk-sm, found while structuring: not the input's fault
    return ConfigError(source, path or "(top level)", f"invalid value ({exc})")


def parse_config(
    data: object, *, source: str = "<config>", env: Mapping[str, str] | None = None
) -> AgentConfig:
    """Validate already-parsed YAML ``data`` into an :class:`AgentConfig`.

    ``base_url`` falls back to ``ANTHROPIC_BASE_URL`` from ``env`` (default ``os.environ``).
    """
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(source, "(top level)", f"expected a mapping, got {show(data)}")
    if data.get("llm") is None:
        raise ConfigError(source, "llm.model", "required")
    try:
        config = _converter().structure(data, AgentConfig)
    except _structure_errors() as exc:
        raise _translate(exc, "", source) from exc
    _duplicate_tool(config.tools, source)
    check_mcp_servers(config.mcp_servers, source)
    env_url = (os.environ if env is None else env).get(_ENV_BASE_URL)
    if config.llm.base_url is None and env_url:
        problem = check_base_url(env_url)
        if problem:
            raise ConfigError(source, f"llm.base_url (from {_ENV_BASE_URL})", problem)
        config = attrs.evolve(config, llm=attrs.evolve(config.llm, base_url=env_url))
    return config


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    follow: bool = True,
) -> AgentConfig:
    """Read and validate the YAML file at ``path``; the result's ``path`` is absolute. The file
    is read once, capped and alias-free (`fisk_sm.config.yamlfile`); ``follow=False`` refuses a
    symlink (a path the caller already resolved and checked)."""
    from fisk_sm.config.yamlfile import read_yaml  # and yaml: only a file needs them

    source = str(path)
    data = read_yaml(path, source, follow=follow)
    try:
        config = parse_config(data, source=source, env=env)
    except RecursionError:  # a backstop: read_yaml caps the nesting already
        raise ConfigError(source, "(yaml)", "nested too deeply") from None
    return attrs.evolve(config, path=Path(path).absolute())

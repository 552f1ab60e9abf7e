"""Load ``agent.yaml`` into frozen attrs classes, with one-line errors naming file and field.

Every problem is reported as a :class:`ConfigError` whose ``str()`` is
``"{source}: {field}: {problem}"`` on a single line, e.g.
``agent.yaml: llm.budget.max_tokens: expected an integer, got 'abc'``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import attrs

from fisk_sm.config.errors import ConfigError, check, parse_duration, show
from fisk_sm.config.exec import ExecToolSpec, parse_exec_tool
from fisk_sm.config.harness import HarnessConfig, NatsConfig, RemoteHost
from fisk_sm.config.limits import byte_limit_problem
from fisk_sm.config.mcp import McpServer, check_mcp_servers, structure_argv
from fisk_sm.config.names import (
    base_url_problem,
    check_base_url,
    crash_policy_problem,
    identity_problem,
)
from fisk_sm.config.structure import (
    ConverterHook,
    FieldHooks,
    Located,
    Problem,
    Structurer,
    structure_duration,
    structure_errors,
    structure_timeout,
    translate,
)
from fisk_sm.config.telemetry import TelemetryConfig
from fisk_sm.config.thinking import (
    Thinking,
    resolve_thinking,
    structure_thinking,
    thinking_problem,
)

if TYPE_CHECKING:
    import cattrs

__all__ = [
    "AgentConfig",
    "Budget",
    "ConfigError",
    "LLMConfig",
    "Thinking",
    "ToolLimits",
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


def _default_max_tokens(value: int) -> int:
    return value or 200_000


def _default_max_iterations(value: int) -> int:
    return value or 50


def _negative_problem(value: float) -> str | None:
    return "must not be negative" if value < 0 else None


def _model_problem(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def _provider_problem(value: str) -> str | None:
    if value in PROVIDERS:
        return None
    return f"must be one of {', '.join(PROVIDERS)}, got {show(value)}"


def _tool_ref_problem(value: str) -> str | None:
    if _TOOL_REF_RE.fullmatch(value):
        return None
    return f"expected 'module:function', got {show(value)}"


def _optional_byte_limit_problem(value: int | None) -> str | None:
    return None if value is None else byte_limit_problem(value)


_non_negative = check(_negative_problem)
_check_model = check(_model_problem)
_check_provider = check(_provider_problem)
_check_base_url_field = check(base_url_problem)
_check_tool_ref = check(_tool_ref_problem)
_check_crash_policy = check(crash_policy_problem)
_check_byte_limit = check(_optional_byte_limit_problem)
_check_identity = check(identity_problem)


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


def _check_thinking(llm: LLMConfig, _attribute: object, value: Thinking) -> None:
    problem = thinking_problem(llm.model, llm.budget.max_output_tokens, value)
    if problem:
        raise ConfigError("<config>", "thinking", problem)


@attrs.frozen
class LLMConfig:
    """Which model to call, where, and within which limits."""

    model: str = attrs.field(validator=_check_model)
    provider: str = attrs.field(default="anthropic", validator=_check_provider)
    base_url: str | None = attrs.field(default=None, validator=_check_base_url_field)
    budget: Budget = Budget()
    thinking: Thinking = attrs.field(default=Thinking(), validator=_check_thinking)
    #: Send no prompt-cache breakpoints (they are on by default: the biggest cost lever).
    no_prompt_cache: bool = False

    @functools.cached_property
    def resolved_thinking(self) -> Thinking:
        """The thinking sent: off, adaptive or a budget; "on" takes the model table's form
        (resolved once per config: each request reads it twice)."""
        return resolve_thinking(self.model, self.thinking)

    @property
    def output_cap(self) -> int:
        """``max_output_tokens`` if set, else 8192 without thinking, 16384 with adaptive
        thinking, and with a budget that budget plus 8192 (at least 16384): the API counts the
        thinking in ``max_tokens``, which must be above ``budget_tokens``."""
        if self.budget.max_output_tokens > 0:
            return self.budget.max_output_tokens
        thinking = self.resolved_thinking
        if thinking.mode == "budget":
            return max(16384, thinking.budget_tokens + 8192)
        return 16384 if thinking.enabled else 8192


class ToolLimits(TypedDict):
    """A Python tool's limits as agent.yaml gives them (None: not given)."""

    timeout: float | None
    max_output: int | None
    max_image: int | None


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
    def limits(self) -> ToolLimits:
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


def _structure_tools(conv: cattrs.Converter, value: object) -> object:
    if not isinstance(value, list):
        raise Problem(f"expected a list, got {show(value)}")
    return tuple(_structure_tool(conv, index, item) for index, item in enumerate(value))


def _structure_tool(conv: cattrs.Converter, index: int, item: object) -> ToolSpec | ExecToolSpec:
    """A `python:` entry is a ToolSpec; a `command:` entry an exec tool (checked by exectool)."""
    where = f"tools[{index}]"
    if not isinstance(item, Mapping):
        raise Located(ConfigError("", where, f"expected a mapping, got {show(item)}"))
    if "python" in item:
        try:
            spec: ToolSpec = conv.structure(item, ToolSpec)
        except structure_errors() as exc:
            raise Located(translate(exc, where, "")) from None
        return spec
    if "command" in item or "name" in item:
        try:
            return parse_exec_tool(item, index=index, source="")
        except ConfigError as exc:
            raise Located(exc) from None
    problem = "a tool needs `python: module:function` or `name:` and `command: [...]`"
    raise Located(ConfigError("", where, problem))


def _duplicate_tool(tools: tuple[ToolSpec | ExecToolSpec, ...], source: str) -> None:
    seen: dict[str, int] = {}
    for index, spec in enumerate(tools):
        if isinstance(spec, ExecToolSpec):
            if spec.name in seen:
                field = f"tools[{index}] ({spec.name}).name"
                problem = f"duplicate tool name {spec.name!r} (also tools[{seen[spec.name]}])"
                raise ConfigError(source, field, problem)
            seen[spec.name] = index


#: The fields read in their own way (`fisk_sm.config.structure`): a duration, a timeout, an
#: argv; `AgentConfig.path` is not a YAML key.
_FIELD_HOOKS: FieldHooks = {
    Budget: {"call_timeout": structure_duration},
    AgentConfig: {"path": None},
    ToolSpec: {"timeout": structure_timeout},
    RemoteHost: {"timeout": structure_timeout},
    McpServer: {"command": structure_argv, "timeout": structure_duration},
}
#: The tools, each a ToolSpec or an exec tool by its keys (`_structure_tool`); the thinking,
#: a word or a mapping (`_structure_thinking`).
_TYPE_HOOKS: Mapping[object, ConverterHook] = {
    tuple[ToolSpec | ExecToolSpec, ...]: _structure_tools,
    Thinking: structure_thinking,
}
#: The converter, built by the first `parse_config`.
_STRUCTURER = Structurer(_FIELD_HOOKS, _TYPE_HOOKS)


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
    config = _STRUCTURER.structure(data, AgentConfig, source)
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

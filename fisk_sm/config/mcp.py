"""The `mcp_servers:` block of agent.yaml: MCP (Model Context Protocol) servers as tool sources.

A server is either a program started over stdio (`command`: an argv, never a shell string) or a
streamable HTTP endpoint (`url`: https, or http for loopback only, as for `llm.base_url`). Its
tools are gated unless the declaration says `confirm: false`: an MCP server is foreign code.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from fisk_sm.config.errors import ConfigError, check, show
from fisk_sm.config.limits import MAX_IMAGE, MAX_OUTPUT, byte_limit_problem
from fisk_sm.config.names import (
    base_url_problem,
    crash_policy_problem,
    identity_problem,
    pass_env_problem,
)

__all__ = ["McpServer", "check_mcp_servers", "structure_argv"]


def structure_argv(value: object, _t: object) -> tuple[str, ...]:
    """`command:` as an argv; a string is refused, since nothing here runs a shell."""
    if isinstance(value, str):
        problem = f"expected a list (an argv; no shell runs it), got the string {show(value)}"
        raise ConfigError("<config>", "", problem)
    if not isinstance(value, list) or not value:
        raise ConfigError("<config>", "", f"expected a non-empty list, got {show(value)}")
    for index, element in enumerate(value):
        if not isinstance(element, str) or not element:
            raise ConfigError("<config>", f"[{index}]", f"expected a string, got {show(element)}")
    return tuple(value)


def _pass_env_problem(names: Sequence[str]) -> str | None:
    return next((p for p in map(pass_env_problem, names) if p), None)


def _positive_problem(value: float) -> str | None:
    return None if value > 0 else "must be positive"


def _tidy(tags: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))


@attrs.frozen
class McpServer:
    """One MCP server whose tools join the run's tool set (kind `mcp`)."""

    #: Names the server in messages and in `fisk-sm info`; a tool whose name is taken becomes
    #: `<alias>_<name>`, as for remote tools.
    alias: str = attrs.field(validator=check(identity_problem))
    #: stdio: the program and its arguments, run in `harness.work_dir` in its own process group.
    command: tuple[str, ...] = ()
    #: streamable HTTP: the endpoint.
    url: str | None = attrs.field(default=None, validator=check(base_url_problem))
    #: stdio: secret-looking variables the server may see (never ANTHROPIC_*).
    pass_env: tuple[str, ...] = attrs.field(default=(), validator=check(_pass_env_problem))
    #: Tags of every tool of the server (selection, confirm_tags): MCP has no such concept.
    tags: tuple[str, ...] = attrs.field(default=(), converter=_tidy)
    #: Whether its tools are behind the confirm gate (they carry `ai:confirm`); on unless false.
    confirm: bool = True
    crash_policy: str = attrs.field(
        default="retry",
        validator=check(crash_policy_problem),
    )
    #: Seconds allowed for starting and listing the tools, and for each call.
    timeout: float = attrs.field(default=60.0, validator=check(_positive_problem))
    #: Bytes of text a call's result keeps (its head and tail; `fisk_sm.config.limits`).
    max_output: int = attrs.field(default=MAX_OUTPUT, validator=check(byte_limit_problem))
    #: Bytes of base64 an image may have; a result with a bigger one is an is_error.
    max_image: int = attrs.field(default=MAX_IMAGE, validator=check(byte_limit_problem))

    def __attrs_post_init__(self) -> None:
        if bool(self.command) == (self.url is not None):
            raise ConfigError("<config>", "command", "give exactly one of command (stdio) or url")
        if self.url is not None and self.pass_env:
            raise ConfigError("<config>", "pass_env", "is for a stdio server (command) only")

    @property
    def transport(self) -> str:
        """`stdio` or `http`."""
        return "stdio" if self.command else "http"

    @property
    def where(self) -> str:
        """How messages name the server: `'files' (stdio: npx ...)`."""
        target = " ".join(self.command) if self.command else str(self.url)
        return f"{self.alias!r} ({self.transport}: {target})"


def check_mcp_servers(servers: Sequence[McpServer], source: str) -> None:
    """Refuse two servers with one alias."""
    seen: set[str] = set()
    for index, server in enumerate(servers):
        if server.alias in seen:
            problem = f"alias {server.alias!r} is used more than once"
            raise ConfigError(source, f"mcp_servers[{index}].alias", problem)
        seen.add(server.alias)

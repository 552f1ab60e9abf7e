"""Configuration: frozen attrs classes for agent.yaml and one-line errors naming file and field.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.config.agent import (
        AgentConfig,
        Budget,
        ConfigError,
        LLMConfig,
        load_config,
        parse_config,
    )
    from fisk_sm.config.mcp import McpServer

_EXPORTS = {
    "AgentConfig": "fisk_sm.config.agent",
    "Budget": "fisk_sm.config.agent",
    "ConfigError": "fisk_sm.config.agent",
    "LLMConfig": "fisk_sm.config.agent",
    "load_config": "fisk_sm.config.agent",
    "parse_config": "fisk_sm.config.agent",
    "McpServer": "fisk_sm.config.mcp",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "AgentConfig",
    "Budget",
    "ConfigError",
    "LLMConfig",
    "McpServer",
    "load_config",
    "parse_config",
]

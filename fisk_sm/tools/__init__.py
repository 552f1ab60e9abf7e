"""Tools: Python callables, exec commands, memory, human in the loop, remote; the confirm gate.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.tools.base import Outcome, Tool, ToolBox, ToolError, tool

_EXPORTS = {
    "Outcome": "fisk_sm.tools.base",
    "Tool": "fisk_sm.tools.base",
    "ToolBox": "fisk_sm.tools.base",
    "ToolError": "fisk_sm.tools.base",
    "tool": "fisk_sm.tools.base",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "Outcome",
    "Tool",
    "ToolBox",
    "ToolError",
    "tool",
]

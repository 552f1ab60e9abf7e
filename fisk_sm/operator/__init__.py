"""The operator: asking a person (prompters) and the one terminal sanitizer.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.operator.prompter import (
        Approval,
        NoOperator,
        Prompter,
        ScriptedPrompter,
        TerminalPrompter,
    )

_EXPORTS = {
    "Approval": "fisk_sm.operator.prompter",
    "NoOperator": "fisk_sm.operator.prompter",
    "Prompter": "fisk_sm.operator.prompter",
    "ScriptedPrompter": "fisk_sm.operator.prompter",
    "TerminalPrompter": "fisk_sm.operator.prompter",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "Approval",
    "NoOperator",
    "Prompter",
    "ScriptedPrompter",
    "TerminalPrompter",
]

"""The loop machine: the YAML table, pure guards, the transitions evaluator, diagrams (no I/O).

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.machine.evaluator import GuardCheck, Step

_EXPORTS = {
    "GuardCheck": "fisk_sm.machine.evaluator",
    "Step": "fisk_sm.machine.evaluator",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "GuardCheck",
    "Step",
]

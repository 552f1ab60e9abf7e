"""`Stops`: where `Run.run_to` (and `run_until`, and the stepper's breakpoints) stop a run.

A run stops *before* what a stop names happens: on entering a state (before its action), in
`execute` before a named tool runs (the next pending call is that tool), and at the first state
of iteration N (just after the N-th model call has returned, before its turn is journaled).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from fisk_sm.config.states import States
from fisk_sm.journal.snapshot import RunData

__all__ = ["Stops"]


def _names(tool: str | Iterable[str] | None) -> frozenset[str]:
    if tool is None:
        return frozenset()
    return frozenset((tool,)) if isinstance(tool, str) else frozenset(tool)


def _numbers(iteration: int | Iterable[int] | None) -> frozenset[int]:
    if iteration is None:
        return frozenset()
    return frozenset((iteration,)) if isinstance(iteration, int) else frozenset(iteration)


@attrs.frozen
class Stops:
    """States to stop on entering, tools to stop before, iterations to stop at."""

    states: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()
    iterations: frozenset[int] = frozenset()

    @classmethod
    def of(
        cls,
        states: Iterable[str] = (),
        tool: str | Iterable[str] | None = None,
        iteration: int | Iterable[int] | None = None,
    ) -> Stops:
        """Stops from `run_until`'s arguments: a tool or an iteration, or several of each."""
        return cls(frozenset(states), _names(tool), _numbers(iteration))

    def __bool__(self) -> bool:
        return bool(self.states or self.tools or self.iterations)

    def hit(self, state: str, data: RunData, iteration_before: int) -> str | None:
        """Why a run that has just stepped into `state` (its iteration was `iteration_before`
        before the step) stops here: `state call`, `tool add`, `iteration 3`; None if not."""
        if state in self.states:
            return f"state {state}"
        if state == States.EXECUTE and data.pending:
            name = data.pending[0].name
            if name in self.tools:
                return f"tool {name}"
        for n in sorted(self.iterations):
            if iteration_before < n <= data.iteration:
                return f"iteration {n}"
        return None

"""`Stops`: where `Run.run_to` (and `run_until`, and the stepper's breakpoints) stop a run.

A run stops *before* what a stop names happens: on entering a state (before its action), in
`execute` before a named tool runs (the next pending call is that tool), at the first state of
iteration N (just after the N-th model call has returned, before its turn is journaled), and on
entering `gate` when the gate will ask the operator about the next call (`approval`): nothing
has been asked or journaled yet, so `explain()` can show the gate's decision first.

The conditions of one `Stops` combine as they read: each kind given must hold (AND), and
within a kind any value will do (several states, several tools). Combined with another
condition an iteration is a level (the run is in iteration N), and a tool is matched in the
states given (in `execute` when none is). `any_of` adds alternatives (OR): the run stops where
the conditions hold or any alternative does. The stepper's breakpoints are each an alternative.

`check(states, tools)` refuses a name that is not in the table or the run's tool set, with a
"did you mean" (`run_to` checks before stepping).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable

import attrs

from fisk_sm.config.states import States
from fisk_sm.journal.snapshot import RunData

__all__ = ["ANY_TOOL", "Stops", "unknown_name"]

#: The approval stop for any gated tool (`b approval`, `run_until(approval=True)`).
ANY_TOOL = "*"


def _names(tool: str | Iterable[str] | None) -> frozenset[str]:
    if tool is None:
        return frozenset()
    return frozenset((tool,)) if isinstance(tool, str) else frozenset(tool)


def _numbers(iteration: int | Iterable[int] | None) -> frozenset[int]:
    if iteration is None:
        return frozenset()
    return frozenset((iteration,)) if isinstance(iteration, int) else frozenset(iteration)


def _approvals(approval: bool | str | Iterable[str] | None) -> frozenset[str]:
    if approval is None or approval is False:
        return frozenset()
    if approval is True:
        return frozenset((ANY_TOOL,))
    return _names(approval)


def unknown_name(kind: str, name: str, known: Collection[str]) -> str | None:
    """The error for a `kind` named `name` that is not in `known` (with a "did you mean" when
    a known name is close), None if it is known."""
    if name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {kind} {name!r}{hint}"


#: Whether the gate will ask the operator about the next call (`Gate.decide`), by the run.
AsksFor = Callable[[RunData], bool]


@attrs.frozen
class Stops:
    """States to stop on entering, tools to stop before, iterations to stop at, gated tools
    to stop before the operator is asked about (`*`: any), all of which must hold; or any of
    the alternatives `any_of`."""

    states: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()
    iterations: frozenset[int] = frozenset()
    approvals: frozenset[str] = frozenset()
    any_of: tuple[Stops, ...] = ()

    @classmethod
    def of(
        cls,
        states: Iterable[str] = (),
        tool: str | Iterable[str] | None = None,
        iteration: int | Iterable[int] | None = None,
        approval: bool | str | Iterable[str] | None = None,
        any_of: Iterable[Stops | dict[str, object]] = (),
    ) -> Stops:
        """Stops from `run_until`'s arguments: all the conditions given (AND), or any of the
        alternatives `any_of` (each a `Stops`, or a dict of these same keywords, `states`
        then a list)."""
        alternatives = tuple(
            alt if isinstance(alt, Stops) else cls.of(**alt)  # type: ignore[arg-type]
            for alt in any_of
        )
        return cls(
            frozenset(states), _names(tool), _numbers(iteration), _approvals(approval), alternatives
        )

    def _own(self) -> bool:
        return bool(self.states or self.tools or self.iterations or self.approvals)

    def __bool__(self) -> bool:
        return self._own() or any(self.any_of)

    def check(self, states: Collection[str], tools: Collection[str]) -> None:
        """ValueError naming the first state or tool that is not in `states` (the table's) or
        `tools` (the run's), with a "did you mean"."""
        named = [("state", s, states) for s in sorted(self.states)]
        named += [("tool", t, tools) for t in sorted(self.tools)]
        named += [("tool", t, tools) for t in sorted(self.approvals - {ANY_TOOL})]
        for kind, name, known in named:
            error = unknown_name(kind, name, known)
            if error is not None:
                raise ValueError(error)
        for n in self.iterations:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"not an iteration: {n!r} (a whole number from 1)")
        for alternative in self.any_of:
            alternative.check(states, tools)

    def hit(
        self, state: str, data: RunData, iteration_before: int, asks: AsksFor | None = None
    ) -> str | None:
        """Why a run that has just stepped into `state` (its iteration was `iteration_before`
        before the step) stops here: `state call`, `tool add`, `iteration 3`, `approval
        deploy` (joined by ` and ` when several hold); None if not. `asks` says whether the gate
        will ask about the next call (no approval stop without it)."""
        reason = self._hit_own(state, data, iteration_before, asks) if self._own() else None
        if reason is not None:
            return reason
        for alternative in self.any_of:
            reason = alternative.hit(state, data, iteration_before, asks)
            if reason is not None:
                return reason
        return None

    def _hit_own(
        self, state: str, data: RunData, iteration_before: int, asks: AsksFor | None
    ) -> str | None:
        reasons: list[str] = []
        combined = sum(map(bool, (self.states, self.tools, self.iterations, self.approvals)))
        if self.states:
            if state not in self.states:
                return None
            reasons.append(f"state {state}")
        next_call = data.pending[0].name if data.pending else None
        if self.tools:
            in_place = state in self.states if self.states else state == States.EXECUTE
            if not in_place or next_call not in self.tools:
                return None
            reasons.append(f"tool {next_call}")
        if self.iterations:
            if combined > 1:
                if data.iteration not in self.iterations:
                    return None
                reasons.append(f"iteration {data.iteration}")
            else:
                reached = [
                    n for n in sorted(self.iterations) if iteration_before < n <= data.iteration
                ]
                if not reached:
                    return None
                reasons.append(f"iteration {reached[0]}")
        if self.approvals:
            wanted = ANY_TOOL in self.approvals or next_call in self.approvals
            if state != States.GATE or next_call is None or not wanted:
                return None
            if asks is None or not asks(data):
                return None
            reasons.append(f"approval {next_call}")
        return " and ".join(reasons)

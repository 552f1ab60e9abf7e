"""`explain(run)`: what the next `step()` will do, said before it is taken.

It names the action the table gives the current state, then each exit in the order
`transitions` tries them, with its guard's value now, or "decided after the action" when the
action can change what the guard reads (`action_effects`, derived from the table: a guard's
`reads` meet the action's `changes`): the model call decides `call_failed` and
`call_cancelled`, the boundary poll decides a suspend. An action whose change is certain
(`preview:` in the table: a tool run answers exactly the first pending call) has the guards that
read only what it previews evaluated on the run as it will be. When the values known now settle
the exit, `next` names it. Guards are pure, so evaluating them here changes nothing.

At the confirm gate it also shows the gate's decision for the next call (`gate_view`, from the
gate's own pure `Gate.decide`): ungated, gated by which tag and asked, a remembered `always`, or
denied for want of an operator; waiting in `awaiting_approval`, what is being asked.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import attrs

from fisk_sm.config.agent import Budget
from fisk_sm.config.jsontypes import JSON
from fisk_sm.config.states import States
from fisk_sm.journal.snapshot import RunData, Usage
from fisk_sm.machine.guards import GUARDS, Facts
from fisk_sm.machine.table import Table, TransitionSpec
from fisk_sm.operator.sanitize import sanitize

if TYPE_CHECKING:
    from fisk_sm.loop.harness import Harness
    from fisk_sm.tools.gate import GateDecision

__all__ = [
    "AFTER_ACTION",
    "PREVIEWS",
    "ExitView",
    "Explanation",
    "action_effects",
    "explain",
    "gate_asks",
    "gate_decision_of",
    "gate_view",
]

AFTER_ACTION = "decided after the action"


@functools.cache
def action_effects(table: Table) -> Mapping[str, frozenset[str]]:
    """For each action of `table`, the guards not known until it has run: those whose `reads`
    meet the facts the action `changes`, unless they read only facts it previews. (Derived
    once per table; tests/test_stepper.py checks that what is "known" before a step is what
    the step finds.)"""
    effects: dict[str, frozenset[str]] = {}
    for state in table.states:
        if state.action is None:
            continue
        changes = set(state.changes)
        previewed = {fact for fact, _ in state.preview}
        effects[state.action] = frozenset(
            g.name for g in table.guards if changes & set(g.reads) and not set(g.reads) <= previewed
        )
    return effects


@attrs.frozen
class _Preview:
    """What the guards will read once an action has had the effect it certainly has."""

    data: RunData
    budget: Budget
    suspend_requested: bool
    call_cancelled: bool
    interrupt_requested: bool


def _first_call_answered(run: Facts) -> Facts:
    # `execute_tool` answers exactly the first pending call, whatever the tool does.
    data = attrs.evolve(run.data, pending=list(run.data.pending[1:]))
    return _Preview(
        data, run.budget, run.suspend_requested, run.call_cancelled, run.interrupt_requested
    )


#: How an action certainly changes a fact, by the name the table's `preview:` gives it: the
#: guards that read only previewed facts are evaluated, for real, on the run as it will be.
PREVIEWS: Mapping[str, Callable[[Facts], Facts]] = {"first_call_answered": _first_call_answered}


@attrs.frozen
class ExitView:
    """One exit of the current state: where it goes, its condition as the diagram writes it
    (None for "else"), and whether it holds now (None: decided after the action)."""

    dest: str
    condition: str | None
    holds: bool | None

    def __str__(self) -> str:
        if self.condition is None:
            return f"-> {self.dest} (else)"
        value = AFTER_ACTION if self.holds is None else str(self.holds).lower()
        return f"-> {self.dest} if {self.condition}: {value}"


@attrs.frozen
class Explanation:
    """The run's state, the action stepping will perform, its exits in order, the exit that
    will be taken if it is known now (`next`), the pending tool calls and usage by tier."""

    state: str
    iteration: int
    action: str | None
    doc: str
    exits: tuple[ExitView, ...]
    next: str | None
    pending: tuple[tuple[str, Mapping[str, JSON]], ...]
    usage: Usage
    #: the gate's decision for the next call, or what a waiting approval asks (`gate_view`)
    gate: str | None = None

    def __str__(self) -> str:
        lines = [f"state: {self.state} (iteration {self.iteration})"]
        if self.action is None:
            lines.append("the run has ended")
        else:
            lines.append(f"action: {self.action}: {self.doc}")
            lines.append("exits (the first that holds wins):")
            lines += [f"  {view}" for view in self.exits]
            lines.append(f"next: {self.next or AFTER_ACTION}")
        if self.gate:
            lines.append(f"gate: {sanitize(self.gate, 400)}")
        if self.pending:
            lines.append("pending tool calls:")
            for name, arguments in self.pending:
                lines.append(f"  {sanitize(name, 80)} {sanitize(json.dumps(arguments), 200)}")
        u = self.usage
        lines.append(
            f"usage: input {u.input_tokens}, output {u.output_tokens}, cache read"
            f" {u.cache_read_tokens}, cache create {u.cache_create_tokens} (total {u.total})"
        )
        return "\n".join(lines)


def _holds(
    spec: TransitionSpec,
    run: Facts,
    unknown: frozenset[str],
    guards: Mapping[str, Callable[[Facts], bool]],
) -> bool | None:
    """Whether the exit holds now; None if a guard it needs is decided by the action."""
    needed = [name for name in (spec.guard, spec.unless) if name]
    if any(name in unknown for name in needed):
        return None
    guard = guards[spec.guard](run) if spec.guard else True
    unless = guards[spec.unless](run) if spec.unless else False
    return guard and not unless


def explain(
    run: Facts,
    state: str,
    table: Table,
    guards: Mapping[str, Callable[[Facts], bool]] | None = None,
    gate: str | None = None,
) -> Explanation:
    """What stepping `run` from `state` will do, by `table` and its `guards` (the loop's by
    default: a run passes its machine's), with the `gate` line a run passes (`gate_view`);
    evaluates only pure guards."""
    guards = guards or GUARDS
    spec = table.state(state)
    unknown = action_effects(table).get(spec.action or "", frozenset())
    after = run
    for _fact, how in spec.preview:
        after = PREVIEWS[how](after)
    exits = tuple(
        ExitView(t.dest, t.condition, _holds(t, after, unknown, guards)) for t in table.exits(state)
    )
    chosen: str | None = None
    for view in exits:
        if view.holds is None:
            break
        if view.holds:
            chosen = view.dest
            break
    data = run.data
    pending = tuple((c.name, dict(c.input)) for c in data.pending)
    return Explanation(
        state=state,
        iteration=data.iteration,
        action=spec.action,
        doc=spec.doc,
        exits=exits,
        next=chosen,
        pending=pending,
        usage=data.usage,
        gate=gate,
    )


class _AtGate(Protocol):
    """What the gate's preview reads of a run."""

    state: str
    data: RunData
    harness: Harness


def gate_decision_of(run: _AtGate) -> GateDecision | None:
    """The gate's decision for the first pending call when `run` is in `gate` and will screen
    it (as `check_gate` does: a known tool, not interrupted, not rejected); else None."""
    data, harness = run.data, run.harness
    if run.state != States.GATE or not data.pending:
        return None
    call = data.pending[0]
    tool = harness.tools.tools.get(call.name)
    if tool is None or call.id in data.interrupted:
        return None
    if harness.tools.rejection(call.name, call.input) is not None:
        return None
    return harness.gate.decide(tool, data.allowed)


def gate_asks(run: _AtGate) -> bool:
    """Whether the next step (in `gate`) puts the first pending call to the operator."""
    decision = gate_decision_of(run)
    return decision is not None and decision.asks


def gate_view(run: _AtGate) -> str | None:
    """The gate line of `explain()`: its decision for the next call in `gate`; in
    `awaiting_approval`, the call the operator is asked about; else None."""
    if run.state == States.AWAITING_APPROVAL and run.data.approval is not None:
        pending = run.data.approval
        return (
            f"{pending.name} is gated by {pending.tag}: awaiting the operator's answer"
            f" ({pending.tool_use_id})"
        )
    decision = gate_decision_of(run)
    return None if decision is None else str(decision)

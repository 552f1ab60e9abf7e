"""`explain(run)`: what the next `step()` will do, said before it is taken.

It names the action the table gives the current state, then each exit in the order
`transitions` tries them, with its guard's value now, or "decided after the action" when the
action can change what the guard reads (`ACTION_EFFECTS`): the model call decides `call_failed`
and `call_cancelled`, a tool run decides whether tools are still pending, the boundary poll
decides a suspend. When the values known now settle the exit, `next` names it. Guards are pure,
so evaluating them here changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from fisk_sm.journal.snapshot import Usage
from fisk_sm.machine.guards import GUARDS, Facts
from fisk_sm.machine.table import Table, TransitionSpec
from fisk_sm.operator.sanitize import sanitize

__all__ = ["ACTION_EFFECTS", "AFTER_ACTION", "ExitView", "Explanation", "explain"]

AFTER_ACTION = "decided after the action"

#: For each action of the table, the guards whose inputs it may change: a guard listed for the
#: current state's action is not known until the action has run. (tests/test_stepper.py checks
#: that every action is listed and that what is "known" before a step is what the step finds.)
ACTION_EFFECTS: Mapping[str, frozenset[str]] = {
    "check_boundary": frozenset({"suspend_requested"}),
    "call_model": frozenset(
        {
            "call_cancelled",
            "call_failed",
            "chat_call_failed",
            "chat_turn_ended",
            "chat_turn_stopped",
            "iteration_cap_reached",
            "over_budget",
            "turn_is_final",
            "turn_unusable",
        }
    ),
    "journal_turn": frozenset(
        {"chat_turn_ended", "tools_pending", "turn_is_final", "turn_unusable"}
    ),
    # it records an unusable turn as the error
    "decide_turn": frozenset({"call_failed", "chat_call_failed"}),
    "account_tokens": frozenset(),
    # what a tool returns cannot change these; which calls stay pending is previewed below
    "check_gate": frozenset({"approval_pending"}),
    "await_approval": frozenset({"approval_pending"}),
    "execute_tool": frozenset({"chat_turn_ended", "turn_is_final", "turn_unusable"}),
    "feed_back_results": frozenset(),
    # the user's answer: a follow-up (which grows the cap), the end of input, or a suspend
    "await_input": frozenset(
        {
            "chat_turn_stopped",
            "input_ended",
            "iteration_cap_reached",
            "suspend_requested",
            "turn_is_final",
            "chat_turn_ended",
        }
    ),
}


@attrs.frozen
class _Preview:
    """What the guards will read once an action has had the effect it certainly has."""

    data: Any
    budget: Any
    suspend_requested: bool
    call_cancelled: bool
    interrupt_requested: bool


def _first_call_answered(run: Facts) -> Facts:
    # `execute_tool` answers exactly the first pending call, whatever the tool does.
    data = attrs.evolve(run.data, pending=list(run.data.pending[1:]))
    return _Preview(
        data, run.budget, run.suspend_requested, run.call_cancelled, run.interrupt_requested
    )


#: Actions whose effect on the guards' inputs is certain: their exits are evaluated, with the
#: real guards, on a preview of the run after the action.
PREVIEWS: Mapping[str, Callable[[Facts], Facts]] = {"execute_tool": _first_call_answered}


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
    pending: tuple[tuple[str, Mapping[str, Any]], ...]
    usage: Usage

    def __str__(self) -> str:
        lines = [f"state: {self.state} (iteration {self.iteration})"]
        if self.action is None:
            lines.append("the run has ended")
        else:
            lines.append(f"action: {self.action}: {self.doc}")
            lines.append("exits (the first that holds wins):")
            lines += [f"  {view}" for view in self.exits]
            lines.append(f"next: {self.next or AFTER_ACTION}")
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


def _holds(spec: TransitionSpec, run: Facts, unknown: frozenset[str]) -> bool | None:
    """Whether the exit holds now; None if a guard it needs is decided by the action."""
    needed = [name for name in (spec.guard, spec.unless) if name]
    if any(name in unknown for name in needed):
        return None
    guard = GUARDS[spec.guard](run) if spec.guard else True
    unless = GUARDS[spec.unless](run) if spec.unless else False
    return guard and not unless


def explain(run: Facts, state: str, table: Table) -> Explanation:
    """What stepping `run` from `state` will do, by `table`; evaluates only pure guards."""
    spec = next(s for s in table.states if s.name == state)
    unknown = ACTION_EFFECTS.get(spec.action or "")
    if unknown is None:  # an action not listed may change anything
        unknown = table.guard_names
    preview = PREVIEWS.get(spec.action or "")
    after = run if preview is None else preview(run)
    exits = tuple(
        ExitView(t.dest, t.condition, _holds(t, after, unknown)) for t in table.exits(state)
    )
    chosen: str | None = None
    for view in exits:
        if view.holds is None:
            break
        if view.holds:
            chosen = view.dest
            break
    data = run.data
    pending = tuple((str(c.get("name")), dict(c.get("input") or {})) for c in data.pending)
    return Explanation(
        state=state,
        iteration=data.iteration,
        action=spec.action,
        doc=spec.doc,
        exits=exits,
        next=chosen,
        pending=pending,
        usage=data.usage,
    )

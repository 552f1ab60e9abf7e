"""The loop machine: the YAML table evaluated by one shared `transitions` Machine.

Theory of operation
-------------------
Everything that decides where a run goes next lives in `states/agent_loop.yaml` and in this
module; none of it does I/O. A step of a run is three moves:

1. the run awaits the *action* of its current state (`fisk_sm.loop.actions`, which does the I/O:
   the model call, a tool, the journal);
2. the run fires the one *trigger* of that state here; the exits of the state are tried in
   table order, and the first whose guard holds (`fisk_sm.machine.guards`, pure predicates) wins;
3. `transitions` sets the new state on the run and runs the *entry hooks* named in the table
   (`fisk_sm.loop.hooks`), which emit typed events.

One `transitions` Machine, built once from the table, serves every run: runs are never added to
it as models (that would cost a Machine's worth of bound methods per run and keep every run
alive). `fire_with_transitions(run)` fires a trigger for a run through `transitions` itself with
`Event.trigger(run)`, the "unbound model" pattern.

The hot path, `fire(run)`, evaluates the very same exits from *routes* compiled from the table
when the machine is built: per source state, an ordered tuple of (guard, unless, destination),
with guards and entry hooks already resolved to functions. `transitions` spends about 9 µs per
trigger on machinery we do not use (EventData, queued processing, exit callbacks, debug logging);
the routes take under 1 µs. A test fires both paths for every state and every combination of
guard outcomes and checks that they always agree, so the routes cannot drift from the Machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
from transitions import EventData, Machine

from fisk_sm.machine.table import Table, TableError

__all__ = ["LoopMachine", "Route", "Stateful", "Step", "build_machine"]

# transitions logs every transition at INFO; a library must stay quiet.
logging.getLogger("transitions").setLevel(logging.WARNING)


class Stateful(Protocol):
    """What the machine needs of a run: its current state's name."""

    state: str


@attrs.frozen
class Step:
    """What one `step()` did: the state it left, the trigger fired and where it arrived."""

    source: str
    trigger: str
    destination: str


Predicate = Callable[[Any], bool]
Hook = Callable[[Any], None]


@attrs.frozen
class Route:
    """One exit compiled for the hot path: taken when `guard` holds and `unless` does not."""

    guard: Predicate | None
    unless: Predicate | None
    dest: str
    hooks: tuple[Hook, ...]


@attrs.frozen
class LoopMachine:
    """The table, the shared `transitions` Machine built from it, and the compiled routes."""

    table: Table
    machine: Machine
    triggers: Mapping[str, str]
    terminal: frozenset[str]
    actions: Mapping[str, str]
    routes: Mapping[str, tuple[Route, ...]]

    def fire(self, run: Stateful) -> None:
        """Fire the trigger of the run's state: the first exit whose guards hold wins, and
        the destination's entry hooks run."""
        for route in self.routes[run.state]:
            if route.guard is not None and not route.guard(run):
                continue
            if route.unless is not None and route.unless(run):
                continue
            run.state = route.dest
            for hook in route.hooks:
                hook(run)
            return
        raise TableError(f"no exit of {run.state!r} holds")  # pragma: no cover - last is else

    def fire_with_transitions(self, run: Stateful) -> Step:
        """The same transition fired through `transitions` itself (slower; for checking)."""
        source = run.state
        trigger = self.triggers[source]
        self.machine.events[trigger].trigger(run)
        return Step(source, trigger, run.state)

    def is_terminal(self, state: str) -> bool:
        """Whether `state` ends a run."""
        return state in self.terminal


def _on_model(fn: Callable[[Any], Any]) -> Callable[[EventData], Any]:
    # transitions hands callbacks its EventData (send_event=True); ours take the run alone.
    def call(event: EventData) -> Any:
        return fn(event.model)

    call.__name__ = getattr(fn, "__name__", "callback")
    return call


def build_machine(
    table: Table, guards: Mapping[str, Predicate], hooks: Mapping[str, Hook]
) -> LoopMachine:
    """Build the shared machine; every guard and hook the table names must be given."""
    missing = sorted(table.guard_names - set(guards)) + sorted(table.hook_names - set(hooks))
    if missing:
        raise TableError(f"the table names unknown guards or hooks: {', '.join(missing)}")
    states = [
        {"name": s.name, "on_enter": [_on_model(hooks[h]) for h in s.on_enter], "final": s.terminal}
        for s in table.states
    ]
    transitions = []
    for t in table.transitions:
        spec: dict[str, Any] = {"trigger": t.trigger, "source": t.source, "dest": t.dest}
        if t.guard:
            spec["conditions"] = [_on_model(guards[t.guard])]
        if t.unless:
            spec["unless"] = [_on_model(guards[t.unless])]
        transitions.append(spec)
    machine = Machine(
        model=None,
        states=states,
        transitions=transitions,
        initial=table.initial,
        send_event=True,
        auto_transitions=False,
        ignore_invalid_triggers=False,
    )
    triggers = {s.name: table.trigger_of(s.name) for s in table.states if not s.terminal}
    actions = {s.name: s.action for s in table.states if s.action}
    entry = {s.name: tuple(hooks[h] for h in s.on_enter) for s in table.states}
    routes = {
        source: tuple(
            Route(
                guards[t.guard] if t.guard else None,
                guards[t.unless] if t.unless else None,
                t.dest,
                entry[t.dest],
            )
            for t in table.exits(source)
        )
        for source in triggers
    }
    return LoopMachine(table, machine, triggers, frozenset(table.terminal_states), actions, routes)

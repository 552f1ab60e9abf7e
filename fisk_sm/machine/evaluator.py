"""The loop machine: the YAML table evaluated by one shared `transitions` Machine.

Theory of operation
-------------------
Everything that decides where a run goes next lives in `states/agent_loop.yaml` and in this
module; none of it does I/O. A step of a run is three moves:

1. the run awaits the *action* of its current state (`fisk_sm.loop.actions`, which does the I/O:
   the model call, a tool, the journal);
2. the run fires the one *trigger* of that state through `transitions`, which tries the exits of
   the state in table order; the first whose guard holds (`fisk_sm.machine.guards`, pure
   predicates registered as the transitions' conditions) wins;
3. `transitions` sets the new state on the run and runs the destination's `on_enter` callbacks:
   the *entry hooks* named in the table (`fisk_sm.loop.hooks`), which emit typed events.

`transitions` is the only evaluator. One Machine, built once from the table with no model,
serves every run: a run is handed to `Event.trigger(run, fire)` on each fire (the "unbound
model" pattern) and is never added to the Machine, so no run costs a Machine's worth of bound
methods and none is kept alive by it. `transitions` sets `run.state`, which is why a run must be
a plain object (a slotted attrs class cannot take the attribute).

What a fire reports. Each guard is registered as a condition wrapped so that, when
`transitions` evaluates it, it appends (exit, guard, value) to the `Fire` record passed as the
trigger's argument; a machine-wide `before_state_change` callback notes the exit taken from
`EventData.transition`. `Step` is built from that record, so it reports what `transitions` did
and no guard is ever evaluated a second time.

Speed. Out of the box `transitions` spends about 10 µs per trigger, and the loop fires 7 per
iteration: most of the engine's cost. Profiled (cProfile; `bench/loop_overhead.py --profile`),
it is configured thus. The Machine runs with `send_event=True` (callbacks read the run from
`EventData`), `queued=False` (a fire never nests) and no `prepare`/`before`/`after`,
`prepare_event`, `finalize_event` or exit callbacks, each of which is one more loop over
callbacks per transition. The speed subclasses (`_State`, `_Condition`, `_Transition`, `_Event`,
`_Machine`) are `transitions`' own classes with the methods of a fire made cheaper for this
configuration, which brings a fire to about 4 µs (`bench/loop_overhead.py`, "transitions
itself"): `get_state` looks a `str` name up directly (the base class tests for an `Enum` first);
callbacks and conditions are called directly (the base class resolves each one again, in case it
is a name); state entry, exit and the exits' `execute` drop the log calls around every callback;
and the exception, finalize and prepare handlers the Machine is built without are skipped. A name
given as a callback, or a handler someone adds, takes the base class's path.
`fisk_sm.machine.contract` checks each override against every `transitions` release allowed.
So a fire logs nothing: the `transitions` logger's calls were all in the methods overridden.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Generic, Protocol, TypeAlias, TypeVar

import attrs
from transitions import Event, EventData, Machine, State, Transition
from transitions.core import Condition

from fisk_sm.machine.table import Table, TableError, TransitionSpec

if TYPE_CHECKING:
    from transitions.core import Callback

    from fisk_sm.machine.guards import Facts

__all__ = [
    "Fire",
    "Guard",
    "GuardCheck",
    "Hook",
    "LoopMachine",
    "Predicate",
    "Stateful",
    "Step",
    "build_machine",
]

#: The model object a machine's guards (`G`) or entry hooks (`M`) are given: a live run, or the
#: replay's stand-in for one (`fisk_sm.machine.reading.ReplayRun`).
G = TypeVar("G")
M = TypeVar("M")
R_co = TypeVar("R_co", covariant=True)
#: A guard over the runs of type `G`.
Guard: TypeAlias = Callable[[G], bool]
#: A loop guard: a pure predicate over what a guard may read (`fisk_sm.machine.guards`). The
#: loop's machines hold these (`explain` evaluates them on a run, or on a run as it will be).
Predicate: TypeAlias = Callable[["Facts"], bool]
#: An entry hook: the run, and the fire that brought it in (None for the state it starts in).
Hook: TypeAlias = Callable[[M, "Fire | None"], None]


class _State(State):
    """A `transitions` State that runs its callbacks without logging around them."""

    def enter(self, event_data: EventData) -> None:
        event_data.machine.callbacks(self.on_enter, event_data)

    def exit(self, event_data: EventData) -> None:
        if self.on_exit:  # the table gives no state exit callbacks
            event_data.machine.callbacks(self.on_exit, event_data)


class _Condition(Condition):
    """A `transitions` Condition that calls its guard directly (build_machine gives callables;
    the base class resolves each one again on every check)."""

    def check(self, event_data: EventData) -> bool:
        func = self.func
        if isinstance(func, str):  # pragma: no cover - build_machine registers no names
            return super().check(event_data)
        return bool(func(event_data) == self.target)


class _Transition(Transition):
    """A `transitions` Transition that executes as the base class does, without its four
    debug log calls per fire (a third of the evaluator's own time at the loop's rate), and
    changes state with direct lookups of the table's `str` names."""

    condition_cls = _Condition

    def execute(self, event_data: EventData) -> bool:
        machine = event_data.machine
        if self.prepare:  # the table gives no prepare callbacks
            machine.callbacks(self.prepare, event_data)
        for condition in self.conditions:
            if not condition.check(event_data):
                return False
        machine.callbacks(itertools.chain(machine.before_state_change, self.before), event_data)
        if self.dest:
            self._change_state(event_data)
        if self.after or machine.after_state_change:  # the table gives neither
            machine.callbacks(itertools.chain(self.after, machine.after_state_change), event_data)
        return True

    def _change_state(self, event_data: EventData) -> None:
        # what the base class does (exit, set the model's state, note it, enter, on_final),
        # with the source and destination looked up once, by name
        machine = event_data.machine
        machine.get_state(self.source).exit(event_data)
        dest = machine.get_state(self.dest or "")
        setattr(event_data.model, machine.model_attribute, dest.value)
        event_data.state = dest
        dest.enter(event_data)
        if dest.final and machine.on_final:  # the Machine is built without on_final
            machine.callbacks(machine.on_final, event_data)


class _Event(Event):
    """A `transitions` Event that finds the run's state and tries its exits as the base class
    does, without the exception and finalize handlers the Machine is built without."""

    def _trigger(self, event_data: EventData) -> bool:
        machine = self.machine
        if machine.on_exception or machine.finalize_event:  # pragma: no cover - none given
            return super()._trigger(event_data)
        event_data.state = machine.get_model_state(event_data.model)
        if self._is_valid_source(event_data.state):
            self._process(event_data)
        return bool(event_data.result)

    def _process(self, event_data: EventData) -> bool:
        machine = self.machine
        if machine.prepare_event:  # pragma: no cover - the Machine is built without
            machine.callbacks(machine.prepare_event, event_data)
        for transition in self.transitions[event_data.state.name]:
            event_data.transition = transition
            if transition.execute(event_data):
                event_data.result = True
                break
        return bool(event_data.result)


class _Machine(Machine):
    """The `transitions` Machine with `str` state lookups and callbacks that do not log."""

    state_cls = _State
    transition_cls = _Transition
    event_cls = _Event

    def get_state(self, state: str | Enum) -> State:
        # one lookup for the str names of this table; the base class tests for an Enum first
        found = self.states.get(state) if isinstance(state, str) else None
        return found if found is not None else super().get_state(state)

    def callbacks(self, funcs: Iterable[Callback], event_data: EventData) -> None:
        for func in funcs:
            if isinstance(func, str):  # pragma: no cover - build_machine registers no names
                self.callback(func, event_data)
            else:
                func(event_data)  # send_event=True: a callback takes the EventData


class _Fired(Protocol[R_co]):
    """The `EventData` transitions hands this machine's callbacks (`send_event=True`), as the
    machine uses it: the run the trigger was fired for (`LoopMachine.fire`), and the trigger's
    arguments, the `Fire` alone (none when `LoopMachine.enter` runs a state's entry hooks)."""

    @property
    def model(self) -> R_co: ...
    @property
    def args(self) -> Sequence[Fire]: ...


class Stateful(Protocol):
    """What the machine needs of a run: its current state's name (which transitions sets)."""

    state: str


@attrs.frozen
class GuardCheck:
    """One guard `transitions` evaluated while choosing an exit, and what it returned.

    `dest` names the exit (its destination state); `unless` is true for an `unless:` guard,
    which must be false for the exit to be taken.
    """

    dest: str
    guard: str
    value: bool
    unless: bool = False

    @property
    def passed(self) -> bool:
        """Whether this check let its exit through."""
        return self.value != self.unless


@attrs.frozen
class Step:
    """What one `step()` did: the state it left, the trigger fired and where it arrived.

    `guard` is the condition of the exit taken, as the table and the diagram write it
    (`over_budget`, `not x`), or None when it was the state's unguarded "else" exit. `tried`
    holds the guard checks of the exits tried before it, in the order `transitions` evaluated
    them; each of those exits failed on its last check.
    """

    source: str
    trigger: str
    destination: str
    guard: str | None = None
    tried: tuple[GuardCheck, ...] = ()


class Fire:
    """The record of one trigger, filled in by the callbacks while `transitions` fires it."""

    __slots__ = ("checks", "taken")

    def __init__(self) -> None:
        self.checks: list[tuple[TransitionSpec, str, bool, bool]] = []
        self.taken: TransitionSpec | None = None


@attrs.frozen
class LoopMachine(Generic[G]):
    """The table and the shared `transitions` Machine built from it, whose guards take `G`."""

    table: Table
    machine: Machine
    triggers: Mapping[str, str]
    terminal: frozenset[str]
    actions: Mapping[str, str]
    #: the transitions `Event` each non-terminal state fires, looked up once per fire
    trigger_events: Mapping[str, Event]
    #: the guard functions by name (what `explain` evaluates, as the fires do)
    guards: Mapping[str, Guard[G]] = attrs.field(factory=dict)

    def fire(self, run: Stateful) -> Fire:
        """Fire the trigger of the run's state through `transitions`: the first exit whose
        guards hold wins and the destination's entry hooks run. Returns what it evaluated."""
        fire = Fire()
        if not self.trigger_events[run.state].trigger(run, fire):  # pragma: no cover
            raise TableError(f"no exit of {run.state!r} holds")  # the table's last exit is else
        return fire

    def describe(self, source: str, fire: Fire) -> Step:
        """The `Step` a fire from `source` took, from the fire's record."""
        taken = fire.taken
        if taken is None:  # pragma: no cover - fire() raises first
            raise TableError(f"no exit of {source!r} was taken")
        tried = tuple(
            GuardCheck(dest=spec.dest, guard=guard, value=value, unless=unless)
            for spec, guard, value, unless in fire.checks
            if spec is not taken
        )
        return Step(
            source=source,
            trigger=taken.trigger,
            destination=taken.dest,
            guard=taken.condition,
            tried=tried,
        )

    def step(self, run: Stateful) -> Step:
        """Fire the run's trigger and say what it did."""
        source = run.state
        return self.describe(source, self.fire(run))

    def enter(self, run: Stateful) -> None:
        """Run the entry hooks of the run's current state through `transitions`, as on a
        transition into it: for the state a run starts or resumes in."""
        state = self.machine.get_state(run.state)
        state.enter(EventData(state, None, self.machine, run, (), {}))

    def is_terminal(self, state: str) -> bool:
        """Whether `state` ends a run."""
        return state in self.terminal


def _hook(fn: Hook[M]) -> Callable[[_Fired[M]], None]:
    # transitions hands callbacks its EventData (send_event=True); a hook gets the run and the
    # Fire, whose `taken` exit is already noted (before_state_change runs before the entry).
    def enter(event: _Fired[M]) -> None:
        args = event.args
        fn(event.model, args[0] if args else None)

    enter.__name__ = getattr(fn, "__name__", "hook")
    return enter


def _condition(
    fn: Guard[G], spec: TransitionSpec, name: str, unless: bool
) -> Callable[[_Fired[G]], bool]:
    # The check is noted as transitions makes it, on the Fire passed to trigger(run, fire).
    def check(event: _Fired[G]) -> bool:
        value = bool(fn(event.model))
        event.args[0].checks.append((spec, name, value, unless))
        return value

    check.__name__ = name
    return check


def build_machine(
    table: Table, guards: Mapping[str, Guard[G]], hooks: Mapping[str, Hook[M]]
) -> LoopMachine[G]:
    """Build the shared machine; every guard the table declares and every hook it names must
    be given (a `TableError` names the ones that are not)."""
    missing = sorted(table.guard_names - set(guards))
    if missing:
        raise TableError(f"the table declares guard(s) with no function: {', '.join(missing)}")
    missing = sorted(table.hook_names - set(hooks))
    if missing:
        raise TableError(f"the table names unknown hook(s): {', '.join(missing)}")
    states = [
        {"name": s.name, "on_enter": [_hook(hooks[h]) for h in s.on_enter], "final": s.terminal}
        for s in table.states
    ]
    transitions = []
    for t in table.transitions:
        spec: dict[str, object] = {"trigger": t.trigger, "source": t.source, "dest": t.dest}
        if t.guard:
            spec["conditions"] = [_condition(guards[t.guard], t, t.guard, False)]
        if t.unless:
            spec["unless"] = [_condition(guards[t.unless], t, t.unless, True)]
        transitions.append(spec)
    # transitions' own Transition objects, mapped back to the table's exits once built
    taken: dict[object, TransitionSpec] = {}

    def note_taken(event: EventData) -> None:
        # runs once the exit's conditions held, before the state changes and the destination's
        # entry hooks run: EventData.transition is the exit transitions is taking
        event.args[0].taken = taken[event.transition]  # type: ignore[index]

    machine = _Machine(
        model=None,
        states=states,
        transitions=transitions,
        initial=table.initial,
        send_event=True,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        before_state_change=[note_taken],
    )
    triggers = {s.name: table.trigger_of(s.name) for s in table.states if not s.terminal}
    for source, trigger in triggers.items():
        built = machine.events[trigger].transitions[source]
        taken.update(zip(built, table.exits(source), strict=True))
    return LoopMachine(
        table=table,
        machine=machine,
        triggers=triggers,
        terminal=frozenset(table.terminal_states),
        actions={s.name: s.action for s in table.states if s.action},
        trigger_events={source: machine.events[t] for source, t in triggers.items()},
        guards={name: guards[name] for name in table.guard_names},
    )

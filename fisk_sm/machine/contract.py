"""What the evaluator relies on in `transitions`, checked against the `transitions` imported.

`fisk_sm.machine.evaluator` subclasses transitions' `State`, `Condition`, `Transition`, `Event`
and `Machine` for speed (`_State`, `_Condition`, `_Transition`, `_Event`, `_Machine`) and calls
some of their methods directly. Nothing in
`transitions` promises those methods stay as they are across releases, so a release that renamed
one, or changed its parameters, would break runs rather than an install. `problems()` says what
no longer holds:

* every method a speed subclass defines exists in its transitions base class with the same
  signature (parameter names, kinds and defaults; annotations aside), and every class attribute
  it sets overrides one of the base class (`state_cls` must stay a subclass of the base's);
* the base methods the evaluator calls keep the signatures it calls them with (`BASE_CALLS`),
  `Event.trigger` among them, which must stay public: each run's trigger is fired through it;
* a machine built from the shipped table still steps (no guard holds, so every fire takes its
  state's last, unguarded exit) and still runs entry hooks, through the subclasses above.

`tests/test_transitions_contract.py` runs this against every release pyproject.toml allows, one
wheel at a time, with:

    PYTHONPATH=WHEEL:REPO python -m fisk_sm.machine.contract

which prints the `transitions` it imported and each problem, and exits 1 if there is one.
"""

from __future__ import annotations

import inspect
import sys

import transitions
from transitions import Event, EventData, Machine, MachineError, State, Transition
from transitions.core import Condition

from fisk_sm.machine import evaluator
from fisk_sm.machine.table import TableError, load_table

__all__ = ["BASE_CALLS", "SUBCLASSES", "Shape", "problems", "shape"]

#: One parameter as the contract compares it: name, kind and default (annotations aside).
Shape = tuple[tuple[str, str, str], ...]

#: Each speed subclass and the transitions class it extends.
SUBCLASSES: tuple[tuple[type, type], ...] = (
    (evaluator._State, State),
    (evaluator._Condition, Condition),
    (evaluator._Transition, Transition),
    (evaluator._Event, Event),
    (evaluator._Machine, Machine),
)


# The signatures the evaluator calls base methods with, written as the base class writes them.
def _trigger(self: object, model: object, *args: object, **kwargs: object) -> None: ...
def _event_data(
    self: object,
    state: object,
    event: object,
    machine: object,
    model: object,
    args: object,
    kwargs: object,
) -> None: ...
def _is_valid_source(self: object, state: object) -> None: ...
def _get_model_state(self: object, model: object) -> None: ...
def _callback(self: object, func: object, event_data: object) -> None: ...


#: Base methods the evaluator calls and does not override: (class, method, expected signature).
BASE_CALLS: tuple[tuple[type, str, object], ...] = (
    (Event, "trigger", _trigger),  # LoopMachine.fire: trigger(run, fire), run not registered
    (EventData, "__init__", _event_data),  # LoopMachine.enter builds one positionally
    (Event, "_is_valid_source", _is_valid_source),  # _Event._trigger
    (Machine, "get_model_state", _get_model_state),  # _Event._trigger
    (Machine, "callback", _callback),  # _Machine.callbacks, for a callback given by name
)

#: The keywords `build_machine` passes to the Machine.
MACHINE_KEYWORDS = (
    "model",
    "states",
    "transitions",
    "initial",
    "send_event",
    "auto_transitions",
    "ignore_invalid_triggers",
    "before_state_change",
)


def shape(fn: object) -> Shape:
    """The parameters of `fn` as (name, kind, default repr), which is what must match."""
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    return tuple(
        (p.name, p.kind.name, "" if p.default is inspect.Parameter.empty else repr(p.default))
        for p in signature.parameters.values()
    )


def _plain(fn: object) -> str:
    # the signature as the contract sees it, for messages: no annotations
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=empty))


def _defined(cls: type) -> dict[str, object]:
    # What the subclass itself sets, leaving out what Python writes into every class body.
    return {
        name: value
        for name, value in vars(cls).items()
        if not (name.startswith("__") and name.endswith("__")) or inspect.isfunction(value)
    }


def _override_problems(sub: type, base: type) -> list[str]:
    where = f"{sub.__name__} (over transitions.{base.__name__})"
    if not issubclass(sub, base):
        return [f"{where}: not a subclass of transitions.{base.__name__}"]
    found = []
    for name, value in _defined(sub).items():
        if not hasattr(base, name):
            found.append(f"{where}.{name}: transitions.{base.__name__} has no {name}")
            continue
        inherited = getattr(base, name)
        if inspect.isfunction(value):
            if not callable(inherited):
                found.append(f"{where}.{name}: not a method in transitions.{base.__name__}")
            elif shape(value) != shape(inherited):
                found.append(
                    f"{where}.{name}{_plain(value)}: transitions has {name}{_plain(inherited)}"
                )
        elif isinstance(value, type) and not (
            isinstance(inherited, type) and issubclass(value, inherited)
        ):
            found.append(f"{where}.{name}: not a subclass of the base's {inherited!r}")
    return found


def _call_problems() -> list[str]:
    found = []
    if Event.trigger.__name__.startswith("_") or transitions.Event is not Event:
        found.append("transitions.Event.trigger is not public")  # pragma: no cover
    for cls, name, expected in BASE_CALLS:
        method = getattr(cls, name, None)
        if method is None:
            found.append(f"transitions.{cls.__name__}.{name}: missing")
        elif shape(method) != shape(expected):
            found.append(
                f"transitions.{cls.__name__}.{name}{_plain(method)}: the evaluator "
                f"calls {name}{_plain(expected)}"
            )
    parameters = inspect.signature(Machine.__init__).parameters
    found += [
        f"transitions.Machine(): no {k}= keyword" for k in MACHINE_KEYWORDS if k not in parameters
    ]
    return found


class _Run:
    """The least a run is to the machine: an object transitions can set `state` on."""

    def __init__(self, state: str) -> None:
        self.state = state


def _smoke_problems() -> list[str]:
    # Every guard false: each fire takes the last exit its state lists, which is unguarded.
    entered: list[str] = []
    try:
        table = load_table()
        guards = {name: (lambda run: False) for name in table.guard_names}
        hooks = {name: (lambda run, fire: entered.append(run.state)) for name in table.hook_names}
        machine = evaluator.build_machine(table, guards, hooks)
        run = _Run(table.initial)
        machine.enter(run)
        step = machine.step(run)
    # what a drifted transitions raises here (a method gone or with other parameters, a value
    # of another shape), reported as the finding rather than raised
    except (AttributeError, TypeError, LookupError, ValueError, MachineError, TableError) as exc:
        return [f"a machine built from the table does not step: {type(exc).__name__}: {exc}"]
    last = table.exits(table.initial)[-1]
    if (step.source, step.destination, run.state) != (table.initial, last.dest, last.dest):
        return [f"stepping from {table.initial!r} gave {step!r}, run in {run.state!r}"]
    if entered[:1] != [table.initial] or entered[-1:] != [last.dest]:
        return [f"entry hooks ran in {entered!r}"]
    return []


def problems() -> list[str]:
    """What the evaluator relies on that the imported `transitions` no longer provides."""
    found = [p for sub, base in SUBCLASSES for p in _override_problems(sub, base)]
    return found + _call_problems() + _smoke_problems()


def main() -> int:
    """Print the `transitions` imported and each problem; 1 if there is one."""
    print(f"transitions {transitions.__version__} {transitions.__file__}")
    found = problems()
    for problem in found:
        print(f"BROKEN {problem}")
    if not found:
        overrides = sum(len(_defined(sub)) for sub, _ in SUBCLASSES)
        print(f"ok: {overrides} overrides, {len(BASE_CALLS)} base calls, one step")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""The loop table: `states/agent_loop.yaml` read into frozen records and checked.

This module reads the YAML file (its only I/O) and checks that the table is well formed: every
transition joins known states, each non-terminal state has an action and exactly one trigger,
and its last exit is unguarded so that some exit always holds. It also checks that the table's
states are exactly the names code uses (`fisk_sm.config.states`), so that a state renamed
in the YAML alone is an error naming it, at load, rather than a run that never reaches it.
`fisk_sm.machine.evaluator` evaluates the table.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs

from fisk_sm.config.states import STATE_NAMES

__all__ = ["StateSpec", "Table", "TableError", "TransitionSpec", "load_table", "table_path"]

_HERE = Path(__file__).resolve().parent
# Installed wheel: force-included as fisk_sm/_states; checkout or editable install: ../states.
_PACKAGE = _HERE.parent
_CANDIDATES = (
    _PACKAGE / "_states" / "agent_loop.yaml",
    _PACKAGE.parent / "states" / "agent_loop.yaml",
)


class TableError(ValueError):
    """The state table is malformed; the message names the file and the entry."""


@attrs.frozen
class StateSpec:
    """One state: the action run when stepped in it, and the hooks run on entering it."""

    name: str
    action: str | None = None
    on_enter: tuple[str, ...] = ()
    terminal: bool = False
    doc: str = ""


@attrs.frozen
class TransitionSpec:
    """One guarded exit. `guard` must hold and `unless` must not; neither means "else"."""

    trigger: str
    source: str
    dest: str
    guard: str | None = None
    unless: str | None = None

    @property
    def condition(self) -> str | None:
        """The exit's guard as written on the diagram (`g`, `not u`, `g and not u`); None
        for the unguarded "else" exit."""
        parts = [self.guard] if self.guard else []
        if self.unless:
            parts.append(f"not {self.unless}")
        return " and ".join(parts) or None

    @property
    def label(self) -> str:
        """The edge label used by the diagrams: `trigger [guard]`."""
        condition = self.condition
        return f"{self.trigger} [{condition}]" if condition else self.trigger


@attrs.frozen
class Table:
    """The whole machine as data."""

    name: str
    initial: str
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]

    def exits(self, source: str) -> tuple[TransitionSpec, ...]:
        """The exits of `source`, in the order they are tried."""
        return tuple(t for t in self.transitions if t.source == source)

    def trigger_of(self, source: str) -> str:
        """The one trigger fired after the action of `source` has run."""
        return self.exits(source)[0].trigger

    @property
    def terminal_states(self) -> tuple[str, ...]:
        """The names of the states a run ends in."""
        return tuple(s.name for s in self.states if s.terminal)

    @property
    def guard_names(self) -> frozenset[str]:
        """Every guard the table names."""
        names = {t.guard for t in self.transitions} | {t.unless for t in self.transitions}
        return frozenset(n for n in names if n)

    @property
    def action_names(self) -> frozenset[str]:
        """Every action the table names."""
        return frozenset(s.action for s in self.states if s.action)

    @property
    def hook_names(self) -> frozenset[str]:
        """Every entry hook the table names."""
        return frozenset(h for s in self.states for h in s.on_enter)


def table_path() -> Path:
    """Where the table is read from: the installed copy, else the checkout's `states/`."""
    for candidate in _CANDIDATES:
        if candidate.is_file():
            return candidate
    raise TableError(
        f"states/agent_loop.yaml not found (looked in {', '.join(map(str, _CANDIDATES))})"
    )


@functools.cache
def load_table(path: Path | None = None) -> Table:
    """Read and check the table (cached: every run shares it)."""
    import yaml  # here, not at import: the table is read when the first run is made

    source = path or table_path()
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TableError(f"{source}: {exc}") from None
    return _check(_build(raw, source), source)


def _build(raw: Any, source: Path) -> Table:
    try:
        states = tuple(_record(StateSpec, s) for s in raw["states"])
        transitions = tuple(_record(TransitionSpec, t) for t in raw["transitions"])
        return Table(raw["name"], raw["initial"], states, transitions)
    except (KeyError, TypeError) as exc:
        raise TableError(f"{source}: malformed table: {exc}") from None


def _record(cls: Any, raw: dict[str, Any]) -> Any:
    fields = {f.name for f in attrs.fields(cls)}
    extra = set(raw) - fields
    if extra:
        raise TypeError(f"unknown key(s) {sorted(extra)} in {raw}")
    if "on_enter" in raw:
        raw = {**raw, "on_enter": tuple(raw["on_enter"])}
    return cls(**raw)


def _check(table: Table, source: Path) -> Table:
    names = [s.name for s in table.states]
    problems: list[str] = []
    if len(set(names)) != len(names):
        problems.append("duplicate state names")
    if table.initial not in names:
        problems.append(f"initial state {table.initial!r} is not a state")
    problems += [
        f"state {name!r} is named in code (fisk_sm.config.states) but not in the table"
        for name in STATE_NAMES
        if name not in names
    ]
    problems += [
        f"state {name!r} is in the table but not named in code (fisk_sm.config.states)"
        for name in names
        if name not in STATE_NAMES
    ]
    for t in table.transitions:
        for end in (t.source, t.dest):
            if end not in names:
                problems.append(f"transition {t.label!r} names unknown state {end!r}")
    for spec in table.states:
        exits = table.exits(spec.name)
        if spec.terminal:
            if exits or spec.action:
                problems.append(f"terminal state {spec.name!r} has an action or exits")
            continue
        if not spec.action:
            problems.append(f"state {spec.name!r} has no action")
        if not exits:
            problems.append(f"state {spec.name!r} has no exits")
        elif len({t.trigger for t in exits}) != 1:
            problems.append(f"state {spec.name!r} must fire exactly one trigger")
        elif exits[-1].guard or exits[-1].unless:
            problems.append(f"the last exit of {spec.name!r} must be unguarded")
    if problems:
        raise TableError(f"{source}: " + "; ".join(problems))
    return table

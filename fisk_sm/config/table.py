"""The loop table: `states/agent_loop.yaml` read into frozen records and checked.

This module reads the YAML file (its only I/O) and checks that the table is well formed: every
transition joins known states and names declared guards, each non-terminal state has an action
and exactly one trigger, and its last exit is unguarded so that some exit always holds. Every
fact a guard reads or an action changes is declared under `facts:`, every guard under
`guards:` (its doc, the facts it reads, how a journal replay decides it), and each state says
what its action may change, what it journals and whether a fold may leave a run there: the
rest of the package derives `explain`, the journal path and the fold's terminal states from
these records, so the table is the one place the machine's meaning is written.

It also checks that every state code names (`fisk_sm.config.states`) is in the table, so that a
state renamed in the YAML alone is an error naming it, at load, rather than a run that never
reaches it; a table may declare more states than code names (an extended copy of it).

The table sits in `config` (the bottom layer), not in `machine`: the journal's fold, below the
machine, needs its terminal states. `fisk_sm.machine.table` is its public name;
`fisk_sm.machine.evaluator` evaluates it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import attrs
from attrs import AttrsInstance

from fisk_sm.config.states import STATE_NAMES

__all__ = [
    "GuardSpec",
    "JournalSpec",
    "Replay",
    "StateSpec",
    "Table",
    "TableError",
    "TransitionSpec",
    "load_table",
    "table_path",
]

_HERE = Path(__file__).resolve().parent
# Installed wheel: force-included as fisk_sm/_states; checkout or editable install: ../states.
_PACKAGE = _HERE.parent
_CANDIDATES = (
    _PACKAGE / "_states" / "agent_loop.yaml",
    _PACKAGE.parent / "states" / "agent_loop.yaml",
)

#: How a journal replay can decide a guard (besides `{terminal: state}`): the words of the
#: table's language that `fisk_sm.machine.path` implements.
REPLAY_KINDS = ("turn", "at_prompt", "stopped_at_prompt")
#: The records a replay can read at a state (`journals:`), as `fisk_sm.journal.records` has them.
RECORDS = (
    "assistant",
    "approval_requested",
    "approval_answered",
    "tool_started",
    "tool_result",
    "user",
)
#: The kinds of run a `journals:` entry can be limited to.
RUN_KINDS = ("chat", "one_shot")

_T = TypeVar("_T", bound=AttrsInstance)


class TableError(ValueError):
    """The state table is malformed; the message names the file and the entry."""


@attrs.frozen
class Replay:
    """How a replay of a journal decides a guard: `kind` is `turn` (the real guard, on the
    replayed turn), `terminal` (it holds when the next record is the terminal record of
    `terminal`; with `cut` set, one that does or does not say a suspend-now cut a call),
    `at_prompt` or `stopped_at_prompt` (a chat's next records show it at its prompt)."""

    kind: str
    terminal: str | None = None
    cut: bool | None = None


@attrs.frozen
class GuardSpec:
    """One guard: what it says, the facts it reads, and how a journal replay decides it."""

    name: str
    doc: str
    reads: tuple[str, ...]
    replay: Replay


@attrs.frozen
class JournalSpec:
    """A record a state's action journals (read there by a replay); `runs` limits it to a
    chat's or a one-shot run's journal (None: either)."""

    record: str
    runs: str | None = None

    def read_in(self, chat: bool) -> bool:
        """Whether a replay of a chat's (`chat`) or a one-shot run's journal reads it here."""
        return self.runs is None or self.runs == ("chat" if chat else "one_shot")


@attrs.frozen
class StateSpec:
    """One state: the action run when stepped in it, and the hooks run on entering it.

    `changes` are the facts the action may change; `preview` the facts it certainly changes
    in a way known beforehand (fact, how); `journals` the records it appends, in order;
    `resume` whether a fold may leave a run here, unless `resume_unless` holds on the turn.
    """

    name: str
    action: str | None = None
    on_enter: tuple[str, ...] = ()
    terminal: bool = False
    doc: str = ""
    changes: tuple[str, ...] = ()
    preview: tuple[tuple[str, str], ...] = ()
    journals: tuple[JournalSpec, ...] = ()
    resume: bool = False
    resume_unless: str | None = None


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
    guards: tuple[GuardSpec, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()

    def exits(self, source: str) -> tuple[TransitionSpec, ...]:
        """The exits of `source`, in the order they are tried."""
        return tuple(t for t in self.transitions if t.source == source)

    def trigger_of(self, source: str) -> str:
        """The one trigger fired after the action of `source` has run."""
        return self.exits(source)[0].trigger

    def state(self, name: str) -> StateSpec:
        """The state named `name` (KeyError if there is none)."""
        for spec in self.states:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def guard(self, name: str) -> GuardSpec:
        """The declaration of guard `name` (KeyError if there is none)."""
        for spec in self.guards:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def terminal_states(self) -> tuple[str, ...]:
        """The names of the states a run ends in."""
        return tuple(s.name for s in self.states if s.terminal)

    @property
    def guard_names(self) -> frozenset[str]:
        """Every guard the table declares (each transition's guards are among them)."""
        return frozenset(g.name for g in self.guards)

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
    """Read and check the table at `path` (the loop's own by default); cached: every run of
    a table shares it. Raises `TableError` naming the file and the entry."""
    import yaml  # here, not at import: the table is read when the first run is made

    source = path or table_path()
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TableError(f"{source}: {exc}") from None
    return _check(_build(raw, source), source)


def _build(raw: object, source: Path) -> Table:
    # The parsed YAML is read as it is declared: a mapping, lists, strings (a TypeError, an
    # AttributeError or a KeyError names the entry). `_check` then checks what the names name.
    where = "the table"
    try:
        table = _fields(raw, {"name", "initial", "facts", "guards", "states", "transitions"}, where)
        where = "facts"
        facts = tuple((str(k), str(v)) for k, v in _mapping(table.get("facts", {})).items())
        where = "guards"
        guards = tuple(_guard(name, g) for name, g in _mapping(table.get("guards", {})).items())
        where = "states"
        states = tuple(_state(s) for s in _list(table["states"]))
        where = "transitions"
        transitions = tuple(_record(TransitionSpec, t) for t in _list(table["transitions"]))
        where = "the table"
        name, initial = _text(table["name"], "name"), _text(table["initial"], "initial")
        return Table(name, initial, states, transitions, guards, facts)
    except (KeyError, TypeError, AttributeError) as exc:
        raise TableError(f"{source}: malformed {where}: {exc}") from None


def _mapping(raw: object) -> Mapping[object, object]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected a mapping, found {raw!r}")
    return raw


def _list(raw: object) -> list[object]:
    if not isinstance(raw, list):
        raise TypeError(f"expected a list, found {raw!r}")
    return raw


def _text(raw: object, entry: str) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"{entry} must be a string, found {raw!r}")
    return raw


def _texts(raw: object, entry: str) -> tuple[str, ...]:
    """A list of strings (None or absent: none)."""
    if raw is not None and not isinstance(raw, list):
        raise TypeError(f"{entry} must be a list, found {raw!r}")
    return tuple(_text(item, entry) for item in raw or ())


def _fields(raw: object, known: set[str], entry: str) -> dict[str, object]:
    """The entries of the mapping `raw`, whose keys must all be `known`."""
    mapping = _mapping(raw)
    extra = set(mapping) - known
    if extra:
        raise TypeError(f"unknown key(s) {sorted(map(str, extra))} in {entry}")
    return {key: value for key, value in mapping.items() if isinstance(key, str)}


def _record(cls: type[_T], raw: object) -> _T:
    # the values as the YAML has them: `_check` checks the names they hold
    fields = _fields(raw, {f.name for f in attrs.fields(cls)}, str(raw))
    return cls(**fields)


def _guard(name: object, raw: object) -> GuardSpec:
    entry = f"guard {name!r}"
    fields = _fields(raw, {"doc", "reads", "replay"}, entry)
    replay = fields.get("replay")
    if isinstance(replay, Mapping):
        how = _fields(replay, {"terminal", "cut"}, f"the replay of {entry}")
        cut = how.get("cut")
        if cut is not None and not isinstance(cut, bool):
            raise TypeError(f"the replay of {entry}: cut must be true or false")
        spec = Replay("terminal", str(how["terminal"]), cut)
    elif replay in REPLAY_KINDS:
        spec = Replay(str(replay))
    else:
        raise TypeError(f"{entry}: replay must be one of {list(REPLAY_KINDS)} or {{terminal: S}}")
    reads = _texts(fields.get("reads"), f"the reads of {entry}")
    return GuardSpec(str(name), str(fields.get("doc", "")), reads, spec)


def _state(raw: object) -> StateSpec:
    entry = f"state {_mapping(raw).get('name')!r}"
    known = {f.name for f in attrs.fields(StateSpec)} - {"resume_unless"}
    values = _fields(raw, known, entry)
    for key in ("on_enter", "changes"):
        if key in values:
            values[key] = _texts(values[key], f"the {key} of {entry}")
    if "preview" in values:
        values["preview"] = tuple((str(k), str(v)) for k, v in _mapping(values["preview"]).items())
    if "journals" in values:
        values["journals"] = tuple(_journal(j, entry) for j in _list(values["journals"] or []))
    resume = values.get("resume", False)
    if isinstance(resume, Mapping):
        unless = _fields(resume, {"unless"}, f"the resume of {entry}")
        values["resume"], values["resume_unless"] = True, str(unless["unless"])
    elif not isinstance(resume, bool):
        raise TypeError(f"{entry}: resume must be true, false or {{unless: guard}}")
    return _record(StateSpec, values)


def _journal(raw: object, entry: str) -> JournalSpec:
    if isinstance(raw, str):
        return JournalSpec(raw)
    fields = _fields(raw, {"record", "runs"}, f"a journals entry of {entry}")
    runs = fields.get("runs")
    return JournalSpec(str(fields["record"]), None if runs is None else str(runs))


def _check(table: Table, source: Path) -> Table:
    problems = _check_states(table) + _check_declarations(table)
    if problems:
        raise TableError(f"{source}: " + "; ".join(problems))
    return table


def _check_states(table: Table) -> list[str]:
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
    return problems


def _check_declarations(table: Table) -> list[str]:
    """Every guard, fact, record and terminal state a declaration names is declared."""
    facts = {name for name, _ in table.facts}
    guards = table.guard_names
    terminal = set(table.terminal_states)
    problems = [
        f"transition {t.label!r} names guard {name!r}, not declared under guards:"
        for t in table.transitions
        for name in (t.guard, t.unless)
        if name and name not in guards
    ]
    for g in table.guards:
        problems += [
            f"guard {g.name!r} reads undeclared fact {f!r}" for f in g.reads if f not in facts
        ]
        if g.replay.kind == "terminal" and g.replay.terminal not in terminal:
            problems.append(
                f"guard {g.name!r} is replayed by {g.replay.terminal!r}, not a terminal state"
            )
    for s in table.states:
        entry = f"state {s.name!r}"
        problems += [f"{entry} changes undeclared fact {f!r}" for f in s.changes if f not in facts]
        problems += [
            f"{entry} previews {f!r}, which it does not change"
            for f, _ in s.preview
            if f not in s.changes
        ]
        problems += [
            f"{entry} journals unknown record {j.record!r} (one of {', '.join(RECORDS)})"
            for j in s.journals
            if j.record not in RECORDS or (j.runs is not None and j.runs not in RUN_KINDS)
        ]
        if s.resume_unless is not None and s.resume_unless not in guards:
            problems.append(f"{entry} resumes unless undeclared guard {s.resume_unless!r}")
        if s.resume and s.terminal:
            problems.append(f"terminal {entry} cannot be a resume state")
    return problems

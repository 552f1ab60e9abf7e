"""The loop table: `states/agent_loop.yaml` read into frozen records and checked.

This module reads the YAML file (its only I/O) into the records of `fisk_sm.config.table_records`
and has `fisk_sm.config.table_check` check that the table is well formed, whenever it loads one.
Every fact a guard reads or an action changes is declared under `facts:`, every guard under
`guards:` (its doc, the facts it reads, how a journal replay decides it), and each state says
what its action may change, what it journals and whether a fold may leave a run there: the
rest of the package derives `explain`, the journal path and the fold's terminal states from
these records, so the table is the one place the machine's meaning is written. A table may
declare more states than code names (an extended copy of it).

The table sits in `config` (the bottom layer), not in `machine`: the journal's fold, below the
machine, needs its terminal states. This module and `fisk_sm.machine.table` are its public
names; `fisk_sm.machine.evaluator` evaluates it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import attrs
from attrs import AttrsInstance

from fisk_sm.config.table_check import check
from fisk_sm.config.table_records import (
    GuardSpec,
    JournalSpec,
    Replay,
    StateSpec,
    Table,
    TableError,
    TransitionSpec,
)

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

_T = TypeVar("_T", bound=AttrsInstance)


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
    return check(_build(raw, source), source)


def _build(raw: object, source: Path) -> Table:
    # The parsed YAML is read as it is declared: a mapping, lists, strings (a TypeError, an
    # AttributeError or a KeyError names the entry). `check` then checks what the names name.
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
    # the values as the YAML has them: `check` checks the names they hold
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

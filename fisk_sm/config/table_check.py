"""The loop table's well-formedness checks, run on every table `fisk_sm.config.table` loads.

Every transition joins known states and names declared guards; each non-terminal state has an
action, exactly one trigger, and an unguarded last exit, so that some exit always holds; every
fact, guard, record and terminal state a declaration names is declared. Every state code names
(`fisk_sm.config.states`) must be in the table too: a state renamed in the YAML alone is an
error naming it, at load, rather than a run that never reaches it.
"""

from __future__ import annotations

from pathlib import Path

from fisk_sm.config.states import STATE_NAMES
from fisk_sm.config.table_records import Table, TableError

__all__ = ["RECORDS", "RUN_KINDS", "check"]

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


def check(table: Table, source: Path) -> Table:
    """`table`, if it is well formed; else a `TableError` naming `source` and every problem."""
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

"""How a journal replay reads the loop table: the replay machine and what each state reads.

`fisk_sm.machine.path` replays a journal through a private `transitions` Machine built from
the table. Each guard is decided as the table's `replay:` says: the real guard on the replayed
turn (`turn`), the terminal record ahead (`{terminal: S}`, `cut`), or, for a chat, the records
ahead showing it at its prompt (`at_prompt`, `stopped_at_prompt`). Which records each state's
action journals (`journals:`), where a replay may rest (`resume:`) and which action counts a
model call (it `changes` the iteration) come from the table too: `reading(table, guards)`
derives all of it once per table and guard functions.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import attrs

from fisk_sm.config.states import States
from fisk_sm.journal.fold import AT_INPUT
from fisk_sm.journal.records import Assistant, Record, Terminal, User
from fisk_sm.journal.snapshot import RunData
from fisk_sm.machine.evaluator import Guard, LoopMachine, Predicate, build_machine
from fisk_sm.machine.guards import CALL_CANCELLED
from fisk_sm.machine.table import Table, TableError

__all__ = ["Reading", "ReplayRun", "reading"]


@attrs.frozen
class Reading:
    """How the table says its journals read, derived once per table and guards: the replay
    machine, where a replay may rest (`resume:`), the records each state's action journals
    (per kind of run: chat or not), the states whose action counts a model call (it `changes`
    the iteration) and the guards a cut call's record decides (`cut: true`)."""

    machine: LoopMachine[ReplayRun]
    resting: frozenset[str]
    rest_unless: Mapping[str, Guard[ReplayRun]]
    reads: Mapping[tuple[str, bool], frozenset[str]]
    counting: frozenset[str]
    cut: frozenset[str]


class ReplayRun:
    """The model object the replay machine fires: a state, the replayed turn, the next record."""

    def __init__(self, state: str, data: RunData) -> None:
        self.state = state
        self.data = data
        self.ahead: Record | None = None
        self.records: Sequence[Record] = ()  # the journal, and where the replay is in it
        self.at = 0


def _noop(run: object, fire: object) -> None:
    """Entry hooks emit events; a replay emits none."""


def _evidence(reason: str, cut: bool | None) -> Callable[[ReplayRun], bool]:
    """A guard that holds when the next record is a `reason` terminal record (and, unless
    `cut` is None, one that does or does not say a suspend-now cut a call)."""

    def holds(run: ReplayRun) -> bool:
        ahead = run.ahead
        if not (isinstance(ahead, Terminal) and ahead.reason == reason):
            return False
        return cut is None or (ahead.message == CALL_CANCELLED) == cut

    holds.__name__ = f"next_record_is_{reason}" + ("_of_a_cut_call" if cut else "")
    return holds


def _at_prompt(run: ReplayRun) -> bool:
    """A chat's next record shows it at its prompt: a follow-up, the record of a suspend
    there, or the end of a plain chat."""
    ahead = run.ahead
    if not run.data.chat:
        return False
    if isinstance(ahead, User):
        return True
    return isinstance(ahead, Terminal) and (
        ahead.message == AT_INPUT or ahead.reason == States.COMPLETED
    )


def _stopped_at_boundary(run: ReplayRun) -> bool:
    """A chat at its prompt whose turn stopped at this boundary, not in a failed call next:
    the next turn's `iteration` counts no call in between."""
    if not _at_prompt(run):
        return False
    later = itertools.islice(run.records, run.at, None)
    turn = next((r for r in later if isinstance(r, Assistant)), None)
    return turn is None or turn.iteration <= run.data.iteration + 1


@functools.cache
def reading(table: Table, real: frozenset[tuple[str, Predicate]]) -> Reading:
    """The replay of `table`'s journals: each guard as its `replay:` says (the `real` guard
    functions for those replayed on the turn)."""
    functions, guards = dict(real), dict[str, Guard[ReplayRun]]()
    for spec in table.guards:
        replay = spec.replay
        if replay.kind == "turn":
            if spec.name not in functions:
                raise TableError(f"{table.name}: no function for guard {spec.name!r}")
            # A guard replayed on the turn reads only the turn (`replay: turn` in the table),
            # which a ReplayRun carries as a live run does: its `data`.
            guards[spec.name] = cast("Guard[ReplayRun]", functions[spec.name])
        elif replay.kind == "terminal":
            guards[spec.name] = _evidence(str(replay.terminal), replay.cut)
        else:
            guards[spec.name] = _at_prompt if replay.kind == "at_prompt" else _stopped_at_boundary
    rest_unless = {}
    for state in table.states:
        if state.resume_unless is not None:
            if table.guard(state.resume_unless).replay.kind != "turn":
                raise TableError(
                    f"{table.name}: {state.name!r} resumes unless a guard not on the turn"
                )
            rest_unless[state.name] = guards[state.resume_unless]
    return Reading(
        machine=build_machine(table, guards, dict.fromkeys(table.hook_names, _noop)),
        resting=frozenset(s.name for s in table.states if s.resume),
        rest_unless=rest_unless,
        reads={
            (s.name, chat): frozenset(j.record for j in s.journals if j.read_in(chat))
            for s in table.states
            for chat in (False, True)
        },
        counting=frozenset(s.name for s in table.states if "iteration" in s.changes),
        cut=frozenset(g.name for g in table.guards if g.replay.cut),
    )

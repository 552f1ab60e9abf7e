"""The names of the loop's states: the one place code spells them.

`states/agent_loop.yaml` is the machine; this module only lists its state names for the code that
has to name a state (the fold's resume state, the terminal messages, the command line's exit
code). `fisk_sm.config.table` checks, whenever it loads a table, that every name in
`STATE_NAMES` is a state of it, so renaming a state in the YAML alone fails at load with an
error naming it; a table may declare more states (an extended copy of the loop's table), which
only the table names.

The names are plain `str`s, not an `Enum`: `transitions` reads an Enum-typed state by its member
name, and a run's state must compare, hash and print as the YAML spells it. This module sits in
the bottom layer because the journal (below the machine) names states too.
"""

from __future__ import annotations

from typing import Final

__all__ = ["STATE_NAMES", "States"]


class States:
    """Every state of the loop table, by name (a namespace; not instantiated)."""

    # the boundary and the model call
    SUSPEND_CHECK: Final = "suspend_check"
    CALL: Final = "call"
    JOURNAL: Final = "journal"
    # the turn's verdict
    DECIDE: Final = "decide"
    BUDGET_CHECK: Final = "budget_check"
    # its tools: each call is screened by the confirm gate, may wait for an answer, then runs
    GATE: Final = "gate"
    AWAITING_APPROVAL: Final = "awaiting_approval"
    EXECUTE: Final = "execute"
    FEED_BACK: Final = "feed_back"
    # a chat: after each answer (or a stopped or failed turn) the run waits for the next prompt
    AWAITING_INPUT: Final = "awaiting_input"
    # the ends: a run stopped here can only be resumed (suspended) or inspected
    COMPLETED: Final = "completed"
    SUSPENDED: Final = "suspended"
    FAILED: Final = "failed"
    # the budgets
    BUDGET_EXHAUSTED: Final = "budget_exhausted"
    ITERATIONS_EXHAUSTED: Final = "iterations_exhausted"


#: Every state name code knows, in the order `States` lists them.
STATE_NAMES: Final[tuple[str, ...]] = tuple(
    value for key, value in vars(States).items() if key.isupper()
)

"""The loop table (`states/agent_loop.yaml`) as frozen records: its public name.

The records and the loader live in `fisk_sm.config.table`, in the bottom layer, because the
journal's fold (below the machine) needs the table's terminal states; this module keeps the name
everything above imports them by. `load_table(path)` reads another table (an extended copy of
the loop's); `fisk_sm.machine.evaluator.build_machine` evaluates one.
"""

from __future__ import annotations

from fisk_sm.config.table import (
    GuardSpec,
    JournalSpec,
    Replay,
    StateSpec,
    Table,
    TableError,
    TransitionSpec,
    load_table,
    table_path,
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

"""The Operate mode's table of runs, and the text of its detail pane.

`RunsTable` keeps every run it was told of (`note`, `load`) in a dict and applies the changes to
its rows only when asked (`flush`, on the app's render tick): a row's cells are rebuilt, and
only the cells whose text (or sort key) changed are updated; rows come and go as they match the
filter or not; the rows are sorted again only when a row came or its sort key changed. So a
thousand runs at fifty events a second cost a few cell updates a tick, never a repaint per event.
Every cell is `Content` made from the API's text by `fisk_sm.tui.text` (a `str` cell would be
read as markup by the DataTable).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from textual.content import Content, Span
from textual.widgets import DataTable

from fisk_sm.cli.ctl_format import age
from fisk_sm.client.records import Run
from fisk_sm.operator.sanitize import sanitize
from fisk_sm.tui.text import line, plain

__all__ = ["COLUMNS", "RunsTable", "describe"]

#: The columns: key, label, width (fixed: a live table must not jump as its values change).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("name", "name", 34),
    ("status", "status", 20),
    ("state", "state", 18),
    ("tokens", "tokens", 9),
    ("age", "age", 5),
    ("tool", "pending tool", 14),
)
#: What a cell's text may hold at most (a column shows less; the rest is for sorting).
CELL_CHARS = 200
#: The most states of a path the detail pane shows (the last ones), and transcript entries.
PATH_STATES = 60
ENTRY_CHARS = 400

Order = tuple[object, ...]


class Cell(Content):
    """A cell's content, with the key its column sorts by (`order`)."""

    __slots__ = ("order",)

    def __init__(self, text: str, order: Order, style: str = "") -> None:
        super().__init__(text, [Span(0, len(text), style)] if style and text else None)
        self.order = order

    def same(self, other: Cell) -> bool:
        """Whether `other` shows and sorts the same."""
        return self.plain == other.plain and self.order == other.order and self.spans == other.spans


def _tool(run: Run) -> str:
    return run.approval.tool if run.approval is not None else ""


#: Each column's sort key of a run, and whether its natural order is descending (the newest,
#: the most tokens and the pending approvals first). Ties go by run id: the order is total.
SORTS: dict[str, tuple[Callable[[Run], Order], bool]] = {
    "age": (lambda r: (r.created, r.run_id), True),
    "name": (lambda r: (sanitize(r.name, CELL_CHARS).casefold(), r.run_id), False),
    "status": (lambda r: (r.status, r.run_id), False),
    "state": (lambda r: (r.state, r.run_id), False),
    "tokens": (lambda r: (r.tokens.total, r.run_id), True),
    "tool": (lambda r: (_tool(r) != "", _tool(r), r.run_id), True),
}
SORT_CYCLE = ("age", "name", "status", "state", "tokens", "tool")


def matches(run: Run, needle: str) -> bool:
    """Whether the filter `needle` (case-folded) is in the run's name, status, state or tool."""
    if not needle:
        return True
    return any(needle in text.casefold() for text in (run.name, run.status, run.state, _tool(run)))


class RunsTable(DataTable[Cell]):
    """The runs, one row each (keyed by run id), filtered and sorted; updated by `flush`."""

    DEFAULT_CSS = "RunsTable { height: 1fr; }"

    def __init__(self, clock: Callable[[], float], id: str | None = None) -> None:
        super().__init__(cursor_type="row", id=id)
        self.clock = clock
        #: Every run known, by id; when each was last heard of (`clock`), for its age.
        self.runs: dict[str, Run] = {}
        self.heard: dict[str, float] = {}
        #: How many times each run was noted (see `note_unless`).
        self.notes: dict[str, int] = {}
        #: The cells of the rows shown, by run id.
        self.cells: dict[str, tuple[Cell, ...]] = {}
        self.dirty: set[str] = set()
        self.rebuild = True
        self.needle = ""
        self.sort_column = SORT_CYCLE[0]
        self.reverse = False

    def on_mount(self) -> None:
        """The columns."""
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)  # fisk-sm's own labels: no markup

    # -- what the app tells it ---------------------------------------------------------------

    def note(self, run: Run) -> None:
        """A run as it is now (from an event or a listing): shown at the next `flush`."""
        self.runs[run.run_id] = run
        self.heard[run.run_id] = self.clock()
        self.notes[run.run_id] = self.notes.get(run.run_id, 0) + 1
        self.dirty.add(run.run_id)

    def note_unless(self, run: Run, notes: int) -> None:
        """A run as a request's answer gave it, unless the run was noted since the request
        went (when it had `notes`): an event may have overtaken the answer, and the event
        stream is the order of the changes."""
        if self.notes.get(run.run_id, 0) == notes:
            self.note(run)

    def load(self, runs: Iterable[Run]) -> None:
        """Every run as it is now (a listing): the runs not in it are forgotten."""
        self.runs.clear()
        for run in runs:
            self.note(run)
        self.heard = {k: v for k, v in self.heard.items() if k in self.runs}
        self.rebuild = True

    def filter(self, text: str) -> None:
        """Show only the runs whose name, status, state or pending tool holds `text`."""
        needle = text.strip().casefold()
        if needle != self.needle:
            self.needle, self.rebuild = needle, True

    def cycle_sort(self, reverse: bool = False) -> str:
        """Sort by the next column (or, with `reverse`, the other way); its description."""
        if reverse:
            self.reverse = not self.reverse
        else:
            at = SORT_CYCLE.index(self.sort_column)
            self.sort_column, self.reverse = SORT_CYCLE[(at + 1) % len(SORT_CYCLE)], False
        self.rebuild = True
        return self.sort_text()

    def sort_text(self) -> str:
        """The sort, as the bar says it: `age ↓`."""
        descending = SORTS[self.sort_column][1] != self.reverse
        if self.sort_column == "age":  # sorted by the time created: the ages go the other way
            descending = not descending
        return f"{self.sort_column} {'↓' if descending else '↑'}"

    def highlighted(self) -> str | None:
        """The run id of the row under the cursor (None if there is no row)."""
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return key if key in self.cells else None

    # -- the rows ------------------------------------------------------------------------------

    def row_of(self, run: Run) -> tuple[Cell, ...]:
        """The cells of a run's row."""
        return tuple(self.cell(run, key) for key, _, _ in COLUMNS)

    def cell(self, run: Run, key: str) -> Cell:
        """The cell of a run in the column `key`."""
        order = SORTS[key][0](run)
        if key == "tokens":
            return Cell(f"{run.tokens.total:,}", order)
        if key == "age":
            now = self.clock()
            seconds = max(0.0, run.age_seconds + now - self.heard.get(run.run_id, now))
            return Cell(age(seconds), order)
        if key == "name":
            return Cell(sanitize(run.name or run.run_id, CELL_CHARS), order)
        if key == "status":
            return Cell(sanitize(run.status, CELL_CHARS), order, "bold" * (run.status == "parked"))
        text = run.state if key == "state" else _tool(run)
        return Cell(sanitize(text, CELL_CHARS), order, "bold" * (key == "tool"))

    def flush(self) -> set[str]:
        """Apply the changes noted since the last flush: the ids of the runs whose rows changed
        (every shown run's after a rebuild). The row under the cursor stays the same run if it
        is still shown."""
        current = self.highlighted()
        if self.rebuild:
            self._rebuild()
            changed = set(self.cells)
        else:
            changed = self._apply()
        if changed and current in self.cells:
            index = self.get_row_index(current)
            if index != self.cursor_row:
                self.move_cursor(row=index)
        return changed

    def ages(self) -> None:
        """Bring the age column up to date (the rows whose age's text changed)."""
        at = [key for key, _, _ in COLUMNS].index("age")
        for run_id, cells in self.cells.items():
            fresh = self.cell(self.runs[run_id], "age")
            if not cells[at].same(fresh):
                self.update_cell(run_id, "age", fresh)
                self.cells[run_id] = (*cells[:at], fresh, *cells[at + 1 :])

    def _ordered(self, runs: Iterable[Run]) -> list[Run]:
        order, descending = SORTS[self.sort_column]
        return sorted(runs, key=order, reverse=descending != self.reverse)

    def _rebuild(self) -> None:
        self.rebuild, self.dirty = False, set()
        self.clear()
        self.cells = {}
        for run in self._ordered(r for r in self.runs.values() if matches(r, self.needle)):
            cells = self.row_of(run)
            self.add_row(*cells, key=run.run_id)
            self.cells[run.run_id] = cells

    def _apply(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        resort = False
        changed: set[str] = set()
        for run_id in dirty:
            run, shown = self.runs.get(run_id), self.cells.get(run_id)
            if run is None or not matches(run, self.needle):
                if shown is not None:
                    self.remove_row(run_id)
                    del self.cells[run_id]
                    changed.add(run_id)
                continue
            cells = self.row_of(run)
            if shown is None:
                self.add_row(*cells, key=run_id)
                resort = True
            else:
                for (key, _, _), old, new in zip(COLUMNS, shown, cells, strict=True):
                    if not old.same(new):
                        self.update_cell(run_id, key, new)
                        resort = resort or (key == self.sort_column and old.order != new.order)
            self.cells[run_id] = cells
            changed.add(run_id)
        if resort:
            descending = SORTS[self.sort_column][1] != self.reverse
            self.sort(self.sort_column, key=_order_of, reverse=descending)
        return changed


def _order_of(cell: Cell) -> Order:
    return cell.order


def _json_line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _bold(text: str) -> Content:
    return plain(text, "bold")


def describe(run: Run, full: Run | None) -> Content:
    """The detail pane of `run` (its listing record, the freshest): its counters, its pending
    approval; and, from `full` (`client.run`, when fetched), the states it went through and its
    transcript. Each of the API's strings is one sanitized line."""
    t, bold = run.tokens, _bold
    parts: list[Content] = [
        line(run.name or run.run_id, 300, "bold") + plain("  ") + line(run.run_id, 100),
        bold("status ") + line(run.status, 60) + bold("  state ") + line(run.state, 100)
        + bold("  iteration ") + plain(str(run.iteration))
        + bold("  outcome ") + line(run.outcome or "—", 100),
        bold("tokens ") + plain(
            f"total {t.total:,} · input {t.input:,} · output {t.output:,}"
            f" · cache read {t.cache_read:,} · cache write {t.cache_creation:,}"
        ) + bold("  created ") + line(run.created, 60),
    ]  # fmt: skip
    if run.approval is not None:
        a = run.approval
        parts.append(
            bold("pending ") + line(f"{a.tool} [{a.tag}] {_json_line(dict(a.input))}", 1000)
        )
    if run.answer:
        parts.append(bold("answer ") + line(run.answer, 1000))
    if full is None or full.run_id != run.run_id:
        parts.append(plain("loading the run…", "italic"))
        return Content("\n").join(parts)
    path = list(full.path)
    shown = " → ".join(sanitize(state, 80) for state in path[-PATH_STATES:])
    more = f"… {len(path) - PATH_STATES} more → " if len(path) > PATH_STATES else ""
    parts.append(bold(f"path ({len(path)}) ") + line(more + shown, 4000))
    parts.append(bold(f"transcript ({len(full.transcript)} entries)"))
    for entry in full.transcript:
        who = f"{entry.role} {entry.kind}" + (f" {entry.name}" if entry.name else "")
        style = "red" if entry.is_error else ""
        parts.append(plain("  ") + line(who, 80, "bold") + plain(": ") + line(
            entry.text, ENTRY_CHARS, style
        ))  # fmt: skip
    return Content("\n").join(parts)

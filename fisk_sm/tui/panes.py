"""The panes every loop screen has: the machine, the gauges and the event log.

The machine pane is drawn from the loop's own table (states/agent_loop.yaml, as the diagrams
are): each state with its exits, the current one lit, the ones entered so far marked. The
gauges show the tokens per tier against the budget and the iterations against the limit. The
event log shows each event as the line UI words it (`LineUI`, with `trace`): one meaning per
event, whichever UI shows it.
"""

from __future__ import annotations

import io

from rich.text import Text
from textual.content import Content
from textual.widgets import RichLog, Static

from fisk_sm.cli.lineui import LineUI
from fisk_sm.config.agent import Budget
from fisk_sm.config.table_records import Table
from fisk_sm.events.types import Event, RunEnded
from fisk_sm.events.usage import Usage
from fisk_sm.operator.sanitize import sanitize

__all__ = ["EventLog", "Gauges", "MachinePane", "machine_content"]


def machine_content(table: Table, current: str | None, entered: set[str]) -> Content:
    """The table as lines: `▶` the current state, `✓` a state entered before, then its exits."""
    exits: dict[str, list[str]] = {}
    for transition in table.transitions:
        dests = exits.setdefault(transition.source, [])
        if transition.dest not in dests:
            dests.append(transition.dest)
    width = max(len(state.name) for state in table.states)
    parts: list[tuple[str, str] | str] = []
    for state in table.states:
        name = state.name
        if name == current:
            mark, style = "▶", "reverse bold"
        elif name in entered:
            mark, style = "✓", "bold"
        else:
            mark, style = " ", ""
        parts.append((f"{mark} {name.ljust(width)}", style))
        parts.append(
            (" → " + " · ".join(exits.get(name, ())) if name in exits else " (end)", "dim")
        )
        parts.append("\n")
    return Content.assemble(*parts[:-1])


class MachinePane(Static):
    """The machine, with the run's place on it."""

    def __init__(self, table: Table, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.table = table
        self.current: str | None = None
        self.entered: set[str] = set()

    def on_mount(self) -> None:
        """Draw the table before the first state is entered."""
        self.border_title = f"machine: {self.table.name}"
        self.update(machine_content(self.table, self.current, self.entered))

    def enter(self, state: str) -> None:
        """Light `state` (the one left stays marked as entered)."""
        if self.current is not None:
            self.entered.add(self.current)
        self.current = state
        self.update(machine_content(self.table, self.current, self.entered))


def _bar(used: int, limit: int, width: int = 20) -> str:
    filled = min(width, used * width // limit) if limit else 0
    return "█" * filled + "░" * (width - filled)


class Gauges(Static):
    """Tokens per tier against the budget, and iterations against the limit."""

    def __init__(self, budget: Budget, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.budget = budget
        self.usage = Usage()
        self.iteration = 0

    def on_mount(self) -> None:
        """Draw the empty gauges."""
        self.border_title = "budget"
        self.show()

    def set(self, usage: Usage, iteration: int) -> None:
        """Show the run's totals so far."""
        self.usage, self.iteration = usage, iteration
        self.show()

    def show(self) -> None:
        """Redraw."""
        u, b = self.usage, self.budget
        self.update(
            Content(
                f"tokens     {_bar(u.total, b.max_tokens)} {u.total:,} / {b.max_tokens:,}\n"
                f"  input {u.input_tokens:,} · output {u.output_tokens:,}"
                f" · cache read {u.cache_read_tokens:,}"
                f" · cache create {u.cache_create_tokens:,}\n"
                f"iterations {_bar(self.iteration, b.max_iterations)}"
                f" {self.iteration} / {b.max_iterations}"
            )
        )


class EventLog(RichLog):
    """The event log: each event as the line UI's `trace` words it, one line each."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(markup=False, wrap=False, max_lines=2000, id=id)
        self.words = io.StringIO()
        self.lineui = LineUI(out=io.StringIO(), err=self.words, trace=True)

    def on_mount(self) -> None:
        """Name the pane."""
        self.border_title = "events"

    def add(self, event: Event) -> None:
        """Log `event` (in the line UI's words; a run's end as its state and why: the answer
        is the transcript's, the totals the gauges')."""
        if isinstance(event, RunEnded):
            told = f": {event.message}" if event.message else ""
            self.write(Text(sanitize(f"run ended: {event.state}{told}", 1000), no_wrap=True))
            return
        self.lineui.emit(event)
        said = self.words.getvalue()
        self.words.seek(0)
        self.words.truncate()
        for text in said.splitlines():
            self.write(Text(sanitize(text, 1000), no_wrap=True))

"""`fisk-sm tui`'s Operate mode: the runs of a `fisk-sm supervise`, live, and the operator's
answers to them.

The screen is a table of the supervisor's runs (`RunsTable`: filtered with `/`, sorted with `s`),
the highlighted run's detail (its counters, the states it went through, its transcript), a
status line and the keys. It follows `client.events()` in a worker: the stream is opened after
an event id of no boot, so its first event is a gap, the moment it is subscribed; then (and
after any gap or drop) the runs are listed again. An event only updates a dict and marks its
run dirty; a render tick applies the changes to the table, a few cells at a time. The detail is
fetched (`client.run`) in a worker when the highlight moves, and again after the run's events.

An approval is answered in `ApprovalDialog`, which shows the call's input whole before the key
is pressed; an abort asks first. A refusal of the client is one line in the status bar.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ClassVar, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Input, Static

from fisk_sm.client.errors import BadAnswer, ClientError
from fisk_sm.client.records import Run, StreamEvent
from fisk_sm.operator.prompter import Approval
from fisk_sm.supervisor.host.desk import NAMES
from fisk_sm.tui.dialogs import ApprovalDialog, ConfirmDialog
from fisk_sm.tui.runs_table import RunsTable, describe
from fisk_sm.tui.text import line, plain

__all__ = ["Control", "OperateApp", "operate"]

#: The supervisor's events whose data is the run's `Run` JSON.
RUN_EVENTS = frozenset({"RunSubmitted", "RunParked", "RunUpdated"})
#: An event id of no boot: a stream opened after it starts with a gap (reload, subscribed).
NO_BOOT = "0-0"
#: How often the table takes the changes (s); how often the detail of a busy run is fetched.
TICK = 0.1
DETAIL_EVERY = 0.5

CSS = """
#bar { height: 1; }
#filter { width: 1fr; height: 1; border: none; padding: 0 1; }
#counts { width: auto; padding: 0 1; color: $text-muted; }
#detail { height: 14; border-top: solid $primary; padding: 0 1; }
#status { height: 1; padding: 0 1; background: $panel; }
"""


class Control(Protocol):
    """What the Operate mode asks of the control API (`fisk_sm.client.AsyncClient` is one)."""

    async def runs(self) -> list[Run]: ...
    async def run(self, run_id: str) -> Run: ...
    async def answer(self, run_id: str, tool_use_id: str, answer: str) -> Run: ...
    async def suspend(self, run_id: str) -> Run: ...
    async def resume(self, run_id: str) -> Run: ...
    async def abort(self, run_id: str) -> Run: ...
    def events(
        self, run: str | None = None, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]: ...


class OperateApp(App[int]):
    """The runs of the supervisor `control` talks to, live, and the operator's keys."""

    TITLE = "fisk-sm operate"
    CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "approve", "approve"),
        Binding("u", "act('suspend')", "suspend"),
        Binding("r", "act('resume')", "resume"),
        Binding("x", "abort", "abort"),
        Binding("s", "sort", "sort"),
        Binding("S", "sort(True)", "reverse", show=False),
        Binding("slash", "find", "filter"),
        Binding("R", "reload", "reload"),
        Binding("q", "quit", "quit"),
    ]

    class Loaded(Message):
        """The runs were listed (at the start, after a gap, on `R`): how many."""

        def __init__(self, count: int) -> None:
            super().__init__()
            self.count = count

    class Sent(Message):
        """The supervisor took a request: `action` (once, always, deny, suspend, resume, abort)
        on a run; `run` is the run as it answered."""

        def __init__(self, action: str, run: Run) -> None:
            super().__init__()
            self.action, self.run = action, run

    class Refused(Message):
        """A request (or the event stream) failed: what was asked, and the error's line."""

        def __init__(self, action: str, error: str) -> None:
            super().__init__()
            self.action, self.error = action, error

    def __init__(
        self, control: Control, *, clock: Callable[[], float] = time.monotonic, tick: float = TICK
    ) -> None:
        super().__init__()
        self.control, self.clock, self.tick = control, clock, tick
        self.current: str | None = None  # the highlighted run
        self.full: Run | None = None  # its `client.run` record, when fetched
        self.stale = False  # its detail wants fetching again
        self.fetched = float("-inf")  # when it was last fetched (clock)
        self.counts = ""  # what the bar says of the table
        #: The widgets (held: a tick or a worker may come while the screen is torn down).
        self.table = RunsTable(clock, id="runs")
        self._filter = Input(placeholder="/ filter: name, status, state, tool", id="filter")
        self._counts = Static(id="counts")
        self._detail = Static(id="detail-text")
        self._status = Static(plain("connecting…"), id="status")

    def compose(self) -> ComposeResult:
        """The header, the filter and counts, the table, the detail, the status, the keys."""
        yield Header()
        with Horizontal(id="bar"):
            yield self._filter
            yield self._counts
        yield self.table
        with VerticalScroll(id="detail"):
            yield self._detail
        yield self._status
        yield Footer()

    def on_mount(self) -> None:
        """Blink off, the focus on the table, the ticks, and the event stream followed."""
        self._filter.cursor_blink = False
        self.table.focus()
        self.set_interval(self.tick, self.flush)
        self.set_interval(1.0, self._ages)
        self.action_reload()

    # -- the runs ------------------------------------------------------------------------------

    def action_reload(self) -> None:
        """List the runs, then follow the event stream (started afresh)."""
        self.run_worker(self._follow(), group="events", exclusive=True, exit_on_error=False)

    async def _follow(self) -> None:
        await self._reload()  # at once, for the operator; again once subscribed (the gap)
        try:
            async for event in self.control.events(last_event_id=NO_BOOT):
                if event.lost_events:
                    await self._reload()
                elif event.name in RUN_EVENTS:
                    self._noted(event)
                elif event.run_id is not None and event.run_id == self.current:
                    self.stale = True
        except ClientError as exc:
            self._refused("events", f"{exc} (R follows them again)")

    def _noted(self, event: StreamEvent) -> None:
        try:
            self.table.note(event.run())
        except BadAnswer as exc:  # one event the client cannot read: said, and skipped
            self._refused("events", str(exc))

    async def _reload(self) -> None:
        try:
            runs = await self.control.runs()
        except ClientError as exc:
            self._refused("runs", str(exc))
            return
        self.table.load(runs)
        self.say(f"{len(runs)} runs listed")
        self.post_message(self.Loaded(len(runs)))

    def flush(self) -> None:
        """The render tick: the changes noted go to the table; the detail follows."""
        table = self.table
        if not table.is_attached:
            return  # the app is closing
        changed = table.flush()
        counts = f"{table.row_count}/{len(table.runs)} runs · sort {table.sort_text()}"
        if counts != self.counts:
            self.counts = counts
            self._counts.update(plain(counts))
        highlighted = table.highlighted()
        if highlighted != self.current:
            self.select(highlighted)
        elif self.current is not None and self.current in changed:
            self.stale = True
            self.show_detail()
        if self.current is not None and self.stale and self.clock() - self.fetched >= DETAIL_EVERY:
            self.fetch(self.current)

    def _ages(self) -> None:
        if self.table.is_attached:
            self.table.ages()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The highlight moved: show that run (the row under the cursor now)."""
        self.select(self.table.highlighted())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a row: its approval."""
        self.action_approve()

    def select(self, run_id: str | None) -> None:
        """Show `run_id`'s detail (fetched in a worker)."""
        if run_id == self.current:
            return
        self.current, self.full = run_id, None
        self.show_detail()
        if run_id is not None:
            self.fetch(run_id)

    def fetch(self, run_id: str) -> None:
        """Fetch a run's full record (path, transcript) in a worker: the last asked wins."""
        self.stale, self.fetched = False, self.clock()
        self.run_worker(self._fetch(run_id), group="detail", exclusive=True, exit_on_error=False)

    async def _fetch(self, run_id: str) -> None:
        try:
            full = await self.control.run(run_id)
        except ClientError as exc:
            self._refused("run", str(exc))
            return
        if run_id == self.current:
            self.full = full
            self.show_detail()

    def show_detail(self) -> None:
        """The highlighted run's detail, from its listing record and its full one."""
        run = self.table.runs.get(self.current) if self.current is not None else None
        text = describe(run, self.full) if run is not None else plain("no run")
        self._detail.update(text)

    # -- the operator's keys ---------------------------------------------------------------------

    def action_find(self) -> None:
        """Focus the filter box."""
        self._filter.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        """The filter changed: the table follows at the next tick."""
        self.table.filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the filter: back to the table."""
        self.table.focus()

    def action_sort(self, reverse: bool = False) -> None:
        """Sort by the next column (`s`), or the other way round (`S`)."""
        self.say(f"sorted by {self.table.cycle_sort(reverse)}")

    def _highlighted(self) -> Run | None:
        run_id = self.table.highlighted()
        run = self.table.runs.get(run_id) if run_id is not None else None
        if run is None:
            self.say("no run is highlighted")
        return run

    def action_approve(self) -> None:
        """The highlighted run's pending approval, in a dialog that shows the input whole."""
        run = self._highlighted()
        if run is None:
            return
        approval = run.approval
        if approval is None:
            self.say(f"{run.name or run.run_id}: no approval is pending")
            return

        def answered(answer: Approval | None) -> None:
            if answer is None:
                self.say("not answered")
                return
            word = NAMES[answer]
            send = self.control.answer
            self._send(word, run.run_id, lambda: send(run.run_id, approval.tool_use_id, word))

        dialog = ApprovalDialog(approval.tool, approval.tag, approval.input, run.run_id)
        self.push_screen(dialog, answered)

    def action_act(self, action: str) -> None:
        """Suspend or resume the highlighted run."""
        run = self._highlighted()
        if run is not None:
            call = self.control.suspend if action == "suspend" else self.control.resume
            self._send(action, run.run_id, lambda: call(run.run_id))

    def action_abort(self) -> None:
        """Abort the highlighted run, once confirmed."""
        run = self._highlighted()
        if run is None:
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._send("abort", run.run_id, lambda: self.control.abort(run.run_id))
            else:
                self.say("not aborted")

        self.push_screen(ConfirmDialog(f"abort the run {run.name or run.run_id}?"), confirmed)

    def _send(self, action: str, run_id: str, request: Callable[[], Awaitable[Run]]) -> None:
        notes = self.table.notes.get(run_id, 0)

        async def send() -> None:
            try:
                run = await request()
            except ClientError as exc:
                self._refused(action, str(exc))
                return
            self.table.note_unless(run, notes)
            self.say(f"{action}: sent for {run.name or run.run_id}")
            self.post_message(self.Sent(action, run))

        self.run_worker(send(), group="requests", exit_on_error=False)

    async def action_quit(self) -> None:
        """Leave (exit status 0)."""
        self.exit(0)

    # -- the status line -------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """One line in the status bar (sanitized: it may quote the API)."""
        self._status.update(line(text, 1000))

    def _refused(self, action: str, error: str) -> None:
        self.say(f"{action}: {error}")
        self.post_message(self.Refused(action, error))


async def operate(url: str | None = None, token: str | None = None) -> int:
    """Run the Operate mode against the supervisor at `url` with `token` (each found as
    `fisk-sm ctl` finds it when None) until the operator quits; its exit status (a bad URL
    or token: one line on stderr and `ctl`'s exit status, before the screen opens)."""
    from fisk_sm.client.aio import AsyncClient
    from fisk_sm.operator.sanitize import say

    try:
        client = AsyncClient(url, token)
    except ClientError as exc:
        say(f"fisk-sm tui: {exc}")
        return exc.exit_code
    async with client:
        return await OperateApp(client).run_async() or 0

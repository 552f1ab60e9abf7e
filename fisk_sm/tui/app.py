"""The loop's screen: the machine, the transcript, the gauges and the event log, live.

`LoopApp` is the screen every local mode shares (run, chat and step): it opens its run through
an `Opener` the command line gives it (so it knows nothing of flags, stores or sessions),
hands the run its `TuiEvents` sink, its streamed-text callback and its `TuiPrompter`, and
draws what arrives. `RunApp` drives the run to its end; `fisk_sm.tui.chat` and
`fisk_sm.tui.step` add the chat's input box and the debugger's keys.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

import attrs
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Static

from fisk_sm.config.agent import Budget
from fisk_sm.config.states import States
from fisk_sm.config.table_records import Table
from fisk_sm.events.types import (
    MessageReceived,
    RunEnded,
    RunResumed,
    StateEntered,
    ToolCalled,
    ToolFinished,
)
from fisk_sm.events.usage import Usage
from fisk_sm.loop.run import Run
from fisk_sm.tui.panes import EventLog, Gauges, MachinePane
from fisk_sm.tui.prompter import TuiPrompter
from fisk_sm.tui.sink import EventPosted, TextStreamed, TuiEvents
from fisk_sm.tui.text import line
from fisk_sm.tui.transcript import Transcript

__all__ = ["EXIT_ABORTED", "LoopApp", "Opener", "RunApp", "Wiring", "exit_code"]

#: A run abandoned before its end (as `fisk-sm run` exits on a second signal).
EXIT_ABORTED = 130

CSS = """
#left { width: 62; }
#machine { height: auto; border: round $primary; padding: 0 1; text-wrap: nowrap;
           text-overflow: ellipsis; }
#gauges { height: auto; border: round $primary; padding: 0 1; }
#transcript { height: 2fr; border: round $primary; }
#events { height: 1fr; border: round $primary; }
#status { height: 1; padding: 0 1; background: $boost; }
"""


@attrs.frozen
class Wiring:
    """What a run opened for the screen is given: its events sink (with the streamed-text
    callback, `events.on_text`) and its operator."""

    events: TuiEvents
    prompter: TuiPrompter


#: Opens the run to show: given the wiring and the prompt (None to resume), the run, started
#: or resumed; the app closes it (`Run.aclose`).
Opener = Callable[[Wiring, str | None], Awaitable[Run]]


def exit_code(state: str | None) -> int:
    """The exit status of a run that ended in `state` (None: it did not end)."""
    if state is None:
        return EXIT_ABORTED
    return 0 if state in (States.COMPLETED, States.SUSPENDED) else 1


class LoopApp(App[int]):
    """The panes of a local run, fed by its events."""

    TITLE = "fisk-sm"
    CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit_run", "quit"),
        Binding("ctrl+q", "quit_run", "quit", show=False, priority=True),
        Binding("ctrl+c", "suspend", "suspend", priority=True),
    ]

    def __init__(
        self,
        opener: Opener,
        table: Table,
        budget: Budget,
        prompt: str | None = None,
        *,
        journaled: bool = False,
    ) -> None:
        super().__init__()
        self.opener = opener
        #: the prompt of a new run (None for a resumed one)
        self.prompt = prompt
        self.table, self.budget, self.journaled = table, budget, journaled
        self.sink = TuiEvents()
        self.prompter = TuiPrompter(self)
        self.run_: Run | None = None
        self.usage = Usage()
        #: the state the run ended in (None while it runs, or if it never ran)
        self.ended: str | None = None

    @property
    def wiring(self) -> Wiring:
        """The wiring the opener gets."""
        return Wiring(self.sink, self.prompter)

    def compose(self) -> ComposeResult:
        """Header; the machine and the gauges left, the transcript and the log right."""
        yield Header()
        with Horizontal():
            with Vertical(id="left"):
                yield MachinePane(self.table, id="machine")
                yield Gauges(self.budget, id="gauges")
                yield from self.left_panes()
            with Vertical(id="right"):
                yield Transcript(id="transcript")
                yield from self.right_panes()
                yield EventLog(id="events")
        yield from self.bottom()
        yield Static(id="status")
        yield Footer()

    def left_panes(self) -> ComposeResult:
        """More panes under the gauges (a mode's own)."""
        yield from ()

    def right_panes(self) -> ComposeResult:
        """More panes under the transcript (a mode's own)."""
        yield from ()

    def bottom(self) -> ComposeResult:
        """Widgets above the status line (a mode's own)."""
        yield from ()

    def on_mount(self) -> None:
        """Post the run's output here, and start it."""
        self.sink.attach(self)
        self.run_worker(self.drive(), name="run", group="run", exclusive=True)

    async def drive(self) -> None:
        """Open the run and drive it (a mode's own way)."""
        raise NotImplementedError

    async def open_run(self, prompt: str | None) -> Run:
        """Open the run (`opener`) and show where it stands."""
        self.status("opening the run")
        run = await self.opener(self.wiring, prompt)
        self.run_ = run
        self.usage = run.data.usage
        self.query_one(Gauges).set(run.data.usage, run.data.iteration)
        self.status(f"run {run.data.run_id}")
        return run

    async def run_to_end(self, run: Run) -> str:
        """Run `run` to its end and close it; the state it ended in."""
        try:
            state = await run.run()
        finally:
            await run.aclose()
        self.ended = state
        return state

    def status(self, text: str) -> None:
        """Say `text` on the status line."""
        self.query_one("#status", Static).update(line(text, 500))

    def on_text_streamed(self, message: TextStreamed) -> None:
        """The model's text, as much as came since the last time."""
        self.query_one(Transcript).stream(message.buffer.take())

    def on_event_posted(self, message: EventPosted) -> None:
        """One event of the run, to the panes that show it."""
        event = message.event
        self.query_one(EventLog).add(event)
        transcript = self.query_one(Transcript)
        if isinstance(event, StateEntered):
            self.query_one(MachinePane).enter(event.state)
            if event.state == States.AWAITING_INPUT and event.source is not None:
                transcript.answer()  # a chat's turn is answered: its answer, to be read
        elif isinstance(event, MessageReceived):
            transcript.stream(self.sink.buffer.take())  # what is left of it, first
            transcript.model_text(event.text)
            self.usage = self.usage + event.usage
            self.query_one(Gauges).set(self.usage, event.iteration)
        elif isinstance(event, ToolCalled):
            transcript.tool_call(event.name, event.input)
        elif isinstance(event, ToolFinished):
            transcript.tool_result(event.output, is_error=event.is_error)
        elif isinstance(event, RunResumed):
            transcript.resumed(event.messages)
        elif isinstance(event, RunEnded):
            self.usage = event.usage
            self.query_one(Gauges).set(event.usage, event.iteration)
            if event.state == States.COMPLETED:
                transcript.answer()
            told = f": {event.message}" if event.message else ""
            self.status(f"{event.state}{told} · q quits")

    def action_suspend(self) -> None:
        """Ctrl-C: suspend a journaled run now (a model call is cut, a tool finishes), as the
        first signal does in `fisk-sm run`; abort one that is not journaled."""
        run = self.run_
        if run is None or run.finished:
            return
        if self.journaled:
            run.request_suspend(now=True)
            self.status("suspending at the next loop boundary")
        else:
            self.workers.cancel_group(self, "run")
            self.status("aborted · q quits")

    async def action_quit_run(self) -> None:
        """Quit: a journaled run still going is suspended first; one that is not, aborted."""
        run = self.run_
        if run is not None and not run.finished and self.journaled:
            run.request_suspend(now=True)
            self.status("suspending, then quitting")
            await self.workers.wait_for_complete()
        else:
            self.workers.cancel_group(self, "run")
        self.exit(exit_code(self.ended))


class RunApp(LoopApp):
    """`fisk-sm tui -c agent.yaml [PROMPT]`: one run to its end (or `--resume ID`)."""

    async def drive(self) -> None:
        """Open the run, show its prompt, and run it to its end."""
        run = await self.open_run(self.prompt)
        if self.prompt is not None:
            self.query_one(Transcript).prompt(self.prompt)
        await self.run_to_end(run)

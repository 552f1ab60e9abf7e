"""`fisk-sm tui --step`: the debugger, the stepper's commands as keys.

`s` takes one transition; `n` runs to the next loop boundary (or a breakpoint); `c` runs to a
breakpoint (or the end); `e` shows the explanation of the next step in full (the exits in
order, the guards each reads, which one holds), `u` suspends now, and `q` quits, leaving a
journaled session suspended. Breakpoints are listed in their pane (every state, `approval`,
`tool:NAME` for each tool, `approval:NAME` for each gated one) and toggled there with space.
After every stop the step pane shows the record of the last step (the exit taken and its guard)
and what the next one will do (`Run.explain`, as `fisk-sm step` shows it). A gated call asks
its approval in a dialog, as in every mode.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import SelectionList, Static

from fisk_sm.cli.step import breakpoint_stops
from fisk_sm.config.states import States
from fisk_sm.loop.run import Run
from fisk_sm.loop.stops import Stops
from fisk_sm.tui.app import LoopApp
from fisk_sm.tui.text import block, plain
from fisk_sm.tui.transcript import Transcript

__all__ = ["StepApp"]

STEP_CSS = """
#breakpoints { height: 1fr; border: round $primary; }
#step { height: auto; max-height: 14; border: round $accent; padding: 0 1; }
"""


def breakpoint_names(run: Run) -> list[str]:
    """Every breakpoint the pane offers: the states, `approval`, and per tool `tool:NAME`."""
    tools = sorted(run.harness.tools.tools)
    return [
        *(state.name for state in run.machine.table.states),
        "approval",
        *(f"tool:{name}" for name in tools),
    ]


class StepApp(LoopApp):
    """The debugger's screen: the panes, the breakpoints and the step pane."""

    CSS = LoopApp.CSS + STEP_CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "step", "step"),
        Binding("n", "next", "next"),
        Binding("c", "continue", "continue"),
        Binding("e", "explain", "explain"),
        Binding("u", "suspend", "suspend"),
    ]

    def left_panes(self) -> ComposeResult:
        """The breakpoints, filled once the run is open."""
        points: SelectionList[str] = SelectionList(id="breakpoints")
        points.border_title = "breakpoints (space toggles)"
        yield points

    def right_panes(self) -> ComposeResult:
        """The step pane: the last step, and the next."""
        pane = Static(id="step")
        pane.border_title = "step"
        yield pane

    @property
    def busy(self) -> bool:
        """Whether a step (or a run to a stop) is under way."""
        return any(w.group == "step" and not w.is_finished for w in self.workers)

    async def drive(self) -> None:
        """Open the run and stop before its first step."""
        run = await self.open_run(self.prompt)
        if self.prompt is not None:
            self.query_one(Transcript).prompt(self.prompt)
        points = self.query_one(SelectionList)
        points.add_options([(name, name) for name in breakpoint_names(run)])
        self.stopped("ready")

    @property
    def breakpoints(self) -> Stops:
        """The breakpoints selected, as one `Stops` (each its own alternative)."""
        run = self.run_
        assert run is not None
        found = [breakpoint_stops(run, spec) for spec in self.query_one(SelectionList).selected]
        return Stops(any_of=tuple(s for s in found if isinstance(s, Stops)))

    def stopped(self, record: str) -> None:
        """Show the last step's record and what the next one will do."""
        run = self.run_
        if run is None:
            return
        told = str(run.explain()).splitlines() if not run.finished else []
        nxt = told[0] if told else f"the run has ended in {run.state}"
        self.query_one("#step", Static).update(plain(record, "bold") + "\n" + block(nxt))
        self.status(f"{run.state} · iteration {run.data.iteration}")
        if run.finished:
            self.ended = run.state

    def _go(self, what: str) -> None:
        run = self.run_
        if run is None or self.busy:
            return
        if run.finished:
            self.stopped(f"the run has ended in {run.state}; q quits")
            return
        self.run_worker(self._move(run, what), name=what, group="step")

    async def _move(self, run: Run, what: str) -> None:
        if what == "step":
            step = await run.step()
            via = f" [{step.guard}]" if step.guard else ""
            record = f"stepped: {step.source} --{step.trigger}{via}--> {step.destination}"
            for check in step.tried:  # the exits tried before it, each failed on this check
                unless = "unless " if check.unless else ""
                record += f"\n  tried {check.dest}: {unless}{check.guard} = {check.value}"
        else:
            stops = self.breakpoints
            if what == "next":
                stops = Stops(any_of=(stops, Stops(frozenset({States.SUSPEND_CHECK}))))
            reason = await run.run_to(stops)
            record = f"stopped: {reason}" if reason else f"ran to {run.state}"
        self.stopped(record)

    def action_step(self) -> None:
        """One transition."""
        self._go("step")

    def action_next(self) -> None:
        """To the next loop boundary (or a breakpoint)."""
        self._go("next")

    def action_continue(self) -> None:
        """To a breakpoint, or the end."""
        self._go("continue")

    def action_explain(self) -> None:
        """The next step's explanation, in full."""
        run = self.run_
        if run is not None and not run.finished:
            self.query_one("#step", Static).update(block(str(run.explain())))

    def action_suspend(self) -> None:
        """Suspend now: the run ends `suspended` at the next boundary (journaled), or is
        abandoned (not journaled: nothing to resume)."""
        run = self.run_
        if run is None or run.finished or self.busy:
            return
        run.request_suspend(now=True)
        self.run_worker(self._move(run, "continue"), name="suspend", group="step")

    async def action_quit_run(self) -> None:
        """Quit: a journaled session is suspended first (resumable); the run is closed."""
        run = self.run_
        if run is not None and not run.finished and self.journaled and not self.busy:
            run.request_suspend(now=True)
            await run.run()
            self.ended = run.state
        if run is not None:
            await run.aclose()
        await super().action_quit_run()

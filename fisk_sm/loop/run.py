"""`Run`: one agent run, stepped one transition at a time.

A `Run` is the model object of the shared loop machine. It holds the current state and the
resumable data (`RunData`), plus the rebuilt infrastructure (`Harness`). `await run.step()` does
exactly one transition: the action of the current state, then the one trigger whose guards pick
the exit, then the entry hooks. `await run.run()` steps to a terminal state. `run.sync()` gives a
blocking facade for a plain debugger prompt.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from fisk_sm.config.agent import AgentConfig, Budget
from fisk_sm.events.types import Events, RunStarted, WarningRaised
from fisk_sm.journal.base import Journal
from fisk_sm.journal.records import Meta, Terminal
from fisk_sm.journal.snapshot import RunData, Snapshot
from fisk_sm.loop.actions import ACTIONS
from fisk_sm.loop.fingerprint import fingerprint
from fisk_sm.loop.harness import Harness
from fisk_sm.loop.hooks import HOOKS
from fisk_sm.machine.evaluator import LoopMachine, Step, build_machine
from fisk_sm.machine.guards import GUARDS, terminal_message
from fisk_sm.machine.table import load_table
from fisk_sm.model.anthropic import ModelClient
from fisk_sm.operator.prompter import Prompter
from fisk_sm.tools.base import Tool

__all__ = ["Run", "RunFinished", "SyncRun", "loop_machine"]


class RunFinished(RuntimeError):
    """`step()` was called on a run that is already in a terminal state."""


@functools.cache
def loop_machine() -> LoopMachine:
    """The one machine every run shares."""
    return build_machine(load_table(), GUARDS, HOOKS)


def new_run_id() -> str:
    """A fresh run id (time-ordered prefix, random tail)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


class Run:
    """One run of the agent loop. Not an attrs class: `transitions` sets `state` on it."""

    def __init__(
        self, data: RunData, harness: Harness, state: str | None = None, *, seq: int = 0
    ) -> None:
        self.machine = loop_machine()
        self.state: str = state or self.machine.table.initial
        self.data = data
        self.harness = harness
        self.suspend_requested = False
        self.resumed = False
        self._seq = seq
        self._started_at: float | None = None

    @classmethod
    def create(
        cls,
        config: AgentConfig,
        prompt: str,
        *,
        model: ModelClient | None = None,
        tools: Iterable[Tool] = (),
        journal: Journal | None = None,
        events: Events | None = None,
        run_id: str | None = None,
        should_suspend: Callable[[], bool] | None = None,
        prompter: Prompter | None = None,
    ) -> Run:
        """A new run of `config` on `prompt`; infrastructure not given is built from config.

        `prompter` answers the confirm gate and the ask_human_* tools (default: nobody, so
        gated tools are denied).
        """
        harness = Harness.build(
            config,
            model=model,
            tools=tools,
            journal=journal,
            events=events,
            should_suspend=should_suspend,
            prompter=prompter,
        )
        return cls(RunData.begin(run_id or new_run_id(), prompt), harness)

    @property
    def budget(self) -> Budget:
        """The run's budget, from config."""
        return self.harness.config.llm.budget

    @property
    def finished(self) -> bool:
        """Whether the run is in a terminal state."""
        return self.machine.is_terminal(self.state)

    @property
    def outcome(self) -> str | None:
        """Why the run ended (None while running, on a final answer, or on a suspend)."""
        return terminal_message(self.state, self.data, self.budget) if self.finished else None

    def next_seq(self) -> int:
        """Reserve the next journal seq."""
        self._seq += 1
        return self._seq

    def elapsed(self) -> float:
        """Seconds since the first step."""
        return 0.0 if self._started_at is None else time.monotonic() - self._started_at

    def request_suspend(self) -> None:
        """Stop at the next loop boundary (never mid-tool); the run ends `suspended`."""
        self.suspend_requested = True

    async def _begin(self) -> None:
        self._started_at = time.monotonic()
        harness = self.harness
        if harness.journal.last_seq == 0:
            data = self.data
            await harness.journal.append(Meta.new(data.run_id, fingerprint(harness), data.prompt))
            self._seq = 1
        harness.events.emit(
            RunStarted(
                self.data.run_id,
                harness.config.llm.model,
                tuple(harness.tools.tools),
                harness.config.llm.thinking.enabled,
                self.resumed,
            )
        )
        for kind, name, detail in harness.warnings:
            harness.events.emit(WarningRaised(self.data.run_id, kind, name, detail))
        HOOKS["state_entered"](self)

    async def step(self) -> Step:
        """Exactly one transition: the state's action, then its trigger; returns what it did."""
        source = self.state
        await self._advance()
        return Step(source, self.machine.triggers[source], self.state)

    async def _advance(self) -> None:
        machine = self.machine
        action = machine.actions.get(self.state)
        if action is None:
            raise RunFinished(f"run {self.data.run_id} already ended in {self.state!r}")
        if self._started_at is None:
            await self._begin()
        await ACTIONS[action](self)
        machine.fire(self)
        if self.state in machine.terminal:
            terminal = Terminal(self.next_seq(), self.state, self.outcome)
            await self.harness.journal.append(terminal)

    async def run(self) -> str:
        """Step until a terminal state; returns its name."""
        terminal = self.machine.terminal
        while self.state not in terminal:
            await self._advance()
        return self.state

    async def run_until(self, *states: str) -> str:
        """Step until the run enters one of `states` (or ends); returns the state reached."""
        while not self.finished:
            await self._advance()
            if self.state in states:
                break
        return self.state

    def snapshot(self) -> Snapshot:
        """A frozen copy of the state and the resumable data; JSON-ready (`to_json`)."""
        status = self.state if self.finished else "open"
        return Snapshot.of(
            self.state, self.data, status=status, outcome=self.outcome, seq=self._seq
        )

    @classmethod
    def restore(cls, snapshot: Snapshot, harness: Harness) -> Run:
        """A run continuing from `snapshot` on freshly built infrastructure.

        The harness's journal is either the run's own journal, written up to `snapshot.seq`,
        or an empty one, which then records the run from this point on (its meta first).
        """
        written = harness.journal.last_seq
        if written not in (0, snapshot.seq):
            raise ValueError(
                f"cannot restore {snapshot.run_id} at seq {snapshot.seq} onto a journal"
                f" written up to seq {written}"
            )
        return cls(snapshot.data(), harness, snapshot.state, seq=written)

    def answer(self) -> str:
        """The final answer's text (empty unless completed)."""
        return self.data.answer() if self.state == "completed" else ""

    def sync(self) -> SyncRun:
        """A blocking facade for a plain debugger prompt."""
        return SyncRun(self)


class SyncRun:
    """Blocking `step()`/`run()` over a `Run`, on a private event loop: `(Pdb) r.step()`."""

    def __init__(self, run: Run) -> None:
        self.run_ = run
        self._runner = asyncio.Runner()

    def step(self) -> Step:
        """One transition."""
        return self._runner.run(self.run_.step())

    def run(self) -> str:
        """To a terminal state."""
        return self._runner.run(self.run_.run())

    def run_until(self, *states: str) -> str:
        """Until one of `states`."""
        return self._runner.run(self.run_.run_until(*states))

    @property
    def state(self) -> str:
        """The current state."""
        return self.run_.state

    def snapshot(self) -> Snapshot:
        """A frozen copy of the run."""
        return self.run_.snapshot()

    def close(self) -> None:
        """Close the private event loop."""
        self._runner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run_, name)

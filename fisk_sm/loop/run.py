"""`Run`: one agent run, stepped one transition at a time.

A `Run` is the model object of the shared loop machine (`loop_machine()`: one `transitions`
Machine for every run, handed the run on each fire). It holds the current state and the
resumable data (`RunData`), plus the rebuilt infrastructure (`Harness`). `await run.step()` does
exactly one transition: the action of the current state, then the one trigger whose guards pick
the exit, then the entry hooks; it returns a `Step` naming the exit and the guards tried.
`await run.run()` steps to a terminal state; `run_until`/`run_to` stop before a state, a tool
or an iteration (`fisk_sm.loop.stops`). `run.explain()` says what the next step will do
(`fisk_sm.loop.explain`), and `run.sync()` gives a blocking facade for a debugger prompt, from
any thread, even one running a loop (`fisk_sm.loop.sync`).

Importing this module defines the class and nothing more: the loop's modules (the actions, the
harness, the machine, the records, the configuration and attrs classes under them) are imported
by the first run made (`Run.__init__`, through `loop_machine()`), not by `from fisk_sm import Run`,
which would otherwise pay for them whether or not it ever makes a run ([13/19]).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from fisk_sm.config.states import States

if TYPE_CHECKING:
    from pathlib import Path

    from fisk_sm.config.agent import AgentConfig, Budget
    from fisk_sm.journal.snapshot import RunData, Snapshot
    from fisk_sm.loop.actions import InputSource
    from fisk_sm.loop.explain import Explanation
    from fisk_sm.loop.harness import Harness, RunOptions
    from fisk_sm.loop.stops import Stops
    from fisk_sm.loop.sync import SyncRun
    from fisk_sm.machine.evaluator import Fire, LoopMachine, Predicate, Step
    from fisk_sm.machine.guards import Facts
    from fisk_sm.machine.table import Table

__all__ = ["Run", "RunFinished", "SyncRun", "loop_machine", "machine_for"]


def __getattr__(name: str) -> object:
    """`SyncRun`, still importable from here (it lives in `fisk_sm.loop.sync`), on first use."""
    if name == "SyncRun":
        from fisk_sm.loop.sync import SyncRun

        return SyncRun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RunFinished(RuntimeError):
    """`step()` was called on a run that is already in a terminal state."""


@functools.cache
def loop_machine() -> LoopMachine[Facts]:
    """The one machine every run shares (built, and the machine's modules imported, by the
    first run)."""
    return machine_for()


def machine_for(
    table: Table | Path | None = None, guards: Mapping[str, Predicate] | None = None
) -> LoopMachine[Facts]:
    """A machine for another table (a `Table`, or the path of one: `load_table(path)`), whose
    guards are the loop's plus `guards` (an extended table's own); the loop's table by default.

    Build it once and give it to every run of it (`Run.create(..., machine=m)`); `run.explain()`
    and `session_path(records, m.table, m.guards)` read the same table and guards. Raises
    `TableError` naming a guard the table declares with no function, or a preview it names
    that `fisk_sm.loop.explain` does not know."""
    from fisk_sm.loop.hooks import HOOKS
    from fisk_sm.machine.evaluator import build_machine
    from fisk_sm.machine.guards import GUARDS
    from fisk_sm.machine.table import Table, TableError, load_table

    if table is not None and not isinstance(table, Table):
        table = load_table(table)
    if table is None:  # the loop's own (tests/test_table.py checks its previews)
        table = load_table()
    else:  # another table's previews are checked here (explain is imported for it)
        from fisk_sm.loop.explain import PREVIEWS

        unknown = [
            (s.name, how) for s in table.states for _, how in s.preview if how not in PREVIEWS
        ]
        if unknown:
            raise TableError(
                f"{table.name}: state {unknown[0][0]!r} names unknown preview {unknown[0][1]!r}"
            )
    return build_machine(table, {**GUARDS, **(guards or {})}, HOOKS)


@functools.cache
def _actions() -> Mapping[str, Callable[[Run], Awaitable[None]]]:
    """The states' actions by name (`fisk_sm.loop.actions`, and the harness, the model and the
    tools under it), imported by the first run; then each `Run` holds them, so that a step
    looks them up without an import."""
    from fisk_sm.loop.actions import ACTIONS

    return ACTIONS


def new_run_id() -> str:
    """A fresh run id (time-ordered prefix, random tail)."""
    import uuid  # here, not at import: uuid imports `platform`, some 10 ms a new run alone needs

    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


class Run:
    """One run of the agent loop. Not an attrs class: `transitions` sets `state` on it."""

    def __init__(
        self,
        data: RunData,
        harness: Harness,
        state: str | None = None,
        *,
        seq: int = 0,
        machine: LoopMachine[Facts] | None = None,
    ) -> None:
        from fisk_sm.loop.inflight import InFlight

        #: the loop's shared machine, or one built once by `machine_for` from another table
        self.machine = machine or loop_machine()
        self._actions = _actions()
        self.state: str = state or self.machine.table.initial
        self.data = data
        self.harness = harness
        self.suspend_requested = False
        self.call_cancelled = False
        self.interrupt_requested = False
        #: Where a chat run's next prompt comes from (`awaiting_input`); None: nobody, so a
        #: chat waiting for input suspends.
        self.input: InputSource | None = None
        self.in_flight = InFlight()
        self.call_latency_ms: int | None = None  # `fisk_sm.loop.actions.call_model` sets it
        self.resumed = False
        self._seq = seq
        self._started_at: float | None = None
        #: Whether the terminal record is journaled (a run in a terminal state is `finished`
        #: from the transition on, and `ended` once that record is written).
        self.ended = False

    @classmethod
    def create(
        cls,
        config: AgentConfig,
        prompt: str,
        options: RunOptions | None = None,
        *,
        run_id: str | None = None,
        chat: bool = False,
        machine: LoopMachine[Facts] | None = None,
    ) -> Run:
        """A new run of `config` on `prompt`; what `options` leaves out is built from config.
        A `chat` run waits in `awaiting_input` after each turn for a follow-up from `input`.
        `machine` (from `machine_for`) runs it by another table; the loop's by default."""
        from fisk_sm.journal.snapshot import RunData
        from fisk_sm.loop.harness import Harness

        harness = Harness.build(config, options)
        data = RunData.begin(run_id or new_run_id(), prompt)
        data.chat = chat
        return cls(data, harness, machine=machine)

    async def aclose(self) -> None:
        """Release what the run holds: its journal (a session's lock and file) and, if the
        harness built the model, its share of the SDK client; idempotent.

        The run's data stays readable (`snapshot()`, `answer()`); a closed file journal takes
        no more records.
        """
        await self.harness.aclose()

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
        """Why the run ended (None while running, on a final answer, or on a suspend at a
        boundary; a suspend-now that cut a model call says so)."""
        from fisk_sm.machine.guards import terminal_message  # loaded with the machine

        return terminal_message(self.state, self) if self.finished else None

    def next_seq(self) -> int:
        """Reserve the next journal seq."""
        self._seq += 1
        return self._seq

    def elapsed(self) -> float:
        """Seconds since the first step."""
        return 0.0 if self._started_at is None else time.monotonic() - self._started_at

    def request_suspend(self, *, now: bool = False) -> None:
        """Stop at the next loop boundary (never mid-tool); the run ends `suspended`.

        With `now=True` a model request in flight is cancelled too (from any thread), and no
        new one starts: the `call` state then exits to `suspended` at once (`call_cancelled`),
        nothing of the cancelled call is journaled, and a resume calls the model again. A tool
        that is running still finishes: elsewhere `now` changes nothing.

        A run waiting for the operator's answer (`awaiting_approval`) stops waiting either way:
        the approval stays pending (journaled as asked, never denied), the run ends `suspended`
        and a resume asks again. So does a chat waiting for its next prompt (`awaiting_input`):
        it ends `suspended` at the prompt, and a resume returns there without a model call.
        """
        self.suspend_requested = True
        if now or self.state in (States.AWAITING_APPROVAL, States.AWAITING_INPUT):
            self.in_flight.cancel()

    def end_input(self) -> None:
        """End a chat at its prompt: it leaves `awaiting_input` for `completed`
        (`input_ended`). A journaled chat is suspended instead (`request_suspend`), so that it
        stays resumable."""
        self.data.input_ended = True
        if self.state == States.AWAITING_INPUT:
            self.in_flight.cancel()

    def request_interrupt(self) -> None:
        """Stop a chat's turn at the next loop boundary (never mid-tool, never mid-call) and
        wait for the next prompt there (`chat_turn_stopped`); a one-shot run ignores it."""
        self.interrupt_requested = True

    async def _begin(self) -> None:
        # Once per run. The events and the records are loaded already (the actions import
        # them); the fingerprint module (and hashlib under it) come with the first run's meta.
        from fisk_sm.events.types import RunStarted, WarningRaised
        from fisk_sm.journal.records import Meta
        from fisk_sm.loop.fingerprint import fingerprint

        self._started_at = time.monotonic()
        harness = self.harness
        await harness.prepare()  # what needs the loop (a JetStream memory index), before warnings
        if harness.journal.last_seq == 0:
            data = self.data
            meta = Meta.new(data.run_id, fingerprint(harness), data.prompt, interactive=data.chat)
            await harness.journal.append(meta)
            self._seq = 1
        run_id = self.data.run_id
        started = RunStarted(
            run_id=run_id,
            model=harness.config.llm.model,
            tools=tuple(harness.tools.tools),
            thinking=harness.config.llm.thinking.enabled,
            resumed=self.resumed,
        )
        harness.events.emit(started)
        for kind, name, detail in harness.warnings:
            warning = WarningRaised(run_id=run_id, warning=kind, name=name, detail=detail)
            harness.events.emit(warning)
        self.machine.enter(self)  # the state it starts or resumes in has its entry hooks too

    async def step(self) -> Step:
        """Exactly one transition: the state's action, then its trigger. Returns what it did:
        the exit taken, its guard, and the guards of the exits tried before it."""
        source = self.state
        fire = await self._advance()
        return self.machine.describe(source, fire)

    async def advance(self) -> None:
        """`step()` without its report: one transition, for a driver that does not read the
        `Step` (a supervisor), which is then never built."""
        await self._advance()

    async def _advance(self) -> Fire:
        machine = self.machine
        action = machine.actions.get(self.state)
        if action is None:
            raise RunFinished(f"run {self.data.run_id} already ended in {self.state!r}")
        if self._started_at is None:
            await self._begin()
        await self._actions[action](self)
        fire = machine.fire(self)
        if self.state in machine.terminal:
            from fisk_sm.journal.records import Terminal  # loaded: the actions import it

            terminal = Terminal(seq=self.next_seq(), reason=self.state, message=self.outcome)
            await self.harness.journal.append(terminal)
            self.ended = True
        return fire

    async def run(self) -> str:
        """Step until a terminal state; returns its name."""
        terminal = self.machine.terminal
        while self.state not in terminal:
            await self._advance()
        return self.state

    async def run_until(
        self,
        *states: str,
        tool: str | Iterable[str] | None = None,
        iteration: int | Iterable[int] | None = None,
        approval: bool | str | Iterable[str] | None = None,
        any_of: Iterable[Stops | dict[str, object]] = (),
    ) -> str:
        """Step until the run enters one of `states`, is in `execute` about to run `tool`,
        reaches `iteration`, or is about to ask the operator to approve a call (of any gated
        tool with `approval=True`, or of the tools named), all that are given holding (AND);
        or until any of the alternatives `any_of` holds (OR; each a `Stops` or a dict of these
        keywords). It steps at least once; a name not in the table or the run's tools is a
        ValueError with a "did you mean". Returns the state reached. See `fisk_sm.loop.stops`."""
        from fisk_sm.loop.stops import Stops

        await self.run_to(Stops.of(states, tool, iteration, approval, any_of))
        return self.state

    async def run_to(self, stops: Stops) -> str | None:
        """Step at least once, until one of `stops` (or the end); returns why it stopped
        (`state execute`, `tool add`, `iteration 3`), None if the run ended first. ValueError
        (before any step) for a state or tool that neither the table nor the run has."""
        from fisk_sm.loop.explain import gate_asks

        stops.check([s.name for s in self.machine.table.states], self.harness.tools.tools)
        while not self.finished:
            before = self.data.iteration
            await self._advance()
            reason = stops.hit(self.state, self.data, before, lambda _data: gate_asks(self))
            if reason is not None:
                return reason
        return None

    def explain(self) -> Explanation:
        """What the next `step()` will do: the action, each exit with its guard's value now
        (or "decided after the action"), the pending tool calls and usage by tier. `str()` of
        it is a readable report."""
        from fisk_sm.loop.explain import explain, gate_view

        table, guards = self.machine.table, self.machine.guards
        return explain(self, self.state, table, guards, gate=gate_view(self))

    def snapshot(self) -> Snapshot:
        """A frozen copy of the state and the resumable data; JSON-ready (`to_json`)."""
        from fisk_sm.journal.snapshot import Snapshot

        status = self.state if self.finished else "open"
        return Snapshot.of(
            self.state, self.data, status=status, outcome=self.outcome, seq=self._seq
        )

    @classmethod
    def restore(
        cls, snapshot: Snapshot, harness: Harness, *, machine: LoopMachine[Facts] | None = None
    ) -> Run:
        """A run continuing from `snapshot` on freshly built infrastructure.

        Build the harness from the same config the run was started with::

            harness = Harness.build(config, RunOptions(tools=[...], events=..., prompter=...))
            run = Run.restore(Snapshot.from_json(text), harness)

        The harness's journal is either the run's own journal, written up to `snapshot.seq`
        (`RunOptions(journal=await FileStore(dir).open_async(run_id))`), or an empty one (the
        default, an in-memory journal), which then records the run from this point on, its meta
        first. To resume a checkpointed session, `resume_session` does all of this for you and
        checks the fingerprint too.
        """
        written = harness.journal.last_seq
        if written not in (0, snapshot.seq):
            raise ValueError(
                f"cannot restore {snapshot.run_id} at seq {snapshot.seq} onto a journal"
                f" written up to seq {written}"
            )
        return cls(snapshot.data(), harness, snapshot.state, seq=written, machine=machine)

    def answer(self) -> str:
        """The final answer's text (empty unless completed)."""
        return self.data.answer() if self.state == States.COMPLETED else ""

    def sync(self) -> SyncRun:
        """A blocking facade for a debugger prompt, even inside a running loop (`SyncRun`);
        `close()` it when done."""
        from fisk_sm.loop.sync import SyncRun

        return SyncRun(self)

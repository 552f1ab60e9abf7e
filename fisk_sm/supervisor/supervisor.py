"""`Supervisor`: many checkpointed runs on one event loop, with bounded concurrency.

Theory of operation. Every run is a session in one `FileStore` (`start_session`,
`resume_session`), driven by a task of its own that steps it one transition at a time. A shared
`asyncio.Semaphore(concurrency)` is held only around a step in `call` (a model request) or
`execute` (a tool): a run that is parked at the approval desk, queued, or passing through any
other state holds no slot. All runs share the loop's one SDK client (`fisk_sm.model.clients`).

What a restart must do is kept in the registry (`fisk_sm.supervisor.registry`): a shutdown
suspends every run now (a model call in flight is cancelled, a tool finishes) and marks those
runs `shutdown_suspended`; an operator's suspend and abort are marked before they take effect.
On start, the runs whose last mark allows it are resumed, unless their journal ended or waits
for an approval: those are listed, and resumed when an operator resumes or answers them.

A suspend-now that finds a run waiting for a slot stops the wait: in `call` the run steps
without one (the cancelled call is never made, the run ends `suspended`); in `execute` the task
stops before the tool starts, leaving the journal open there (a resume runs the tool).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import attrs

from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.errors import one_line
from fisk_sm.config.states import States
from fisk_sm.config.text import refuse_unencodable
from fisk_sm.events.types import Fanout
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.actions import Inbox
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run, new_run_id
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.desk import ApprovalDesk, DeskPrompter
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.registry import (
    ABORTED,
    OPERATOR_SUSPENDED,
    RESUMED,
    SHUTDOWN_SUSPENDED,
    Registry,
    RegistryEntry,
)
from fisk_sm.supervisor.view.book import RunViews, resumes
from fisk_sm.supervisor.view.hub import EventHub, RunSink
from fisk_sm.supervisor.view.tracked import ENDED, Tracked

__all__ = ["SLOT_STATES", "Conflict", "NotFound", "Supervisor"]

#: The states whose step holds a concurrency slot: a model request, a tool.
SLOT_STATES = frozenset({States.CALL, States.EXECUTE})


class RunRegistry(Protocol):
    """What a supervisor asks of its registry (`Registry`; a cluster keeps none of its own)."""

    def load(self) -> dict[str, RegistryEntry]: ...

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry: ...

    async def mark(self, disposition: str, *run_ids: str) -> None: ...


class Supervisor(RunViews):
    """Drives many checkpointed runs of `config` in `store` on the running loop (the read
    side, listings and events, is `RunViews`).

    `registry_dir` holds the registry (default: `store.directory / "supervisor"`); a
    `JetStreamStore` needs a `registry` given (`fisk_sm.supervisor.cluster`). With
    `config_dirs`, every config but the supervisor's own is confined to them, on a submit and
    again on a restart or a takeover (the file may have changed since).
    """

    def __init__(
        self,
        config: AgentConfig,
        store: FileStore | JetStreamStore,
        *,
        concurrency: int = 16,
        registry_dir: Path | None = None,
        options: RunOptions | None = None,
        registry: RunRegistry | None = None,
        config_dirs: ConfigDirs | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.config = config
        self.config_dirs = config_dirs
        self.store = store
        self.concurrency = concurrency
        self.options = options or RunOptions()
        if registry is None:
            if not isinstance(store, FileStore):
                raise TypeError("a supervisor of a JetStream store needs a registry given")
            registry = Registry(registry_dir or store.directory / "supervisor")
        self.registry = registry
        self.hub = EventHub()
        self.desk = ApprovalDesk(self._desk_changed)
        self.runs: dict[str, Tracked] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._configs: dict[str, AgentConfig] = {}
        self.closing = False

    # -- driving ----------------------------------------------------------------------------

    def _options(self, run_id: str, sink: RunSink) -> RunOptions:
        prompter = DeskPrompter(self.desk, run_id)
        opts = self.options
        events = sink if opts.events is None else Fanout((sink, opts.events))
        return RunOptions(model=opts.model, tools=opts.tools, events=events, prompter=prompter)

    def _track(self, entry: RegistryEntry, config: AgentConfig) -> Tracked:
        sink = RunSink(entry.run_id, self.hub, self._changed)
        tracked = Tracked(entry, config, sink)
        self.runs[entry.run_id] = tracked
        return tracked

    def _launch(self, tracked: Tracked, run: Run) -> None:
        if run.data.chat:  # it waits in awaiting_input for what `say` posts
            run.input = Inbox()
        tracked.run, tracked.error, tracked.queued = run, None, True
        tracked.stopping = asyncio.Event()
        tracked.task = asyncio.ensure_future(self._drive(tracked, run))

    async def _slot(self, tracked: Tracked) -> bool:
        """Wait for a concurrency slot; False (and no slot) if a suspend-now stopped the wait."""
        tracked.queued = True
        if tracked.stopping.is_set():
            return False
        acquire = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(tracked.stopping.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not acquire.done():
                acquire.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquire
        if acquire.cancelled():
            return False
        tracked.queued = False
        return True

    async def _drive(self, tracked: Tracked, run: Run) -> None:
        """Step `run` to its end (or until a suspend-now stops it before a tool)."""
        try:
            while not run.finished:
                if run.state not in SLOT_STATES:
                    await run.step()
                    continue
                if await self._slot(tracked):
                    try:
                        await run.step()
                    finally:
                        self._slots.release()
                elif run.state == States.CALL:
                    await run.step()  # a cancelled call makes no request: the run suspends
                else:
                    break  # before a tool starts: the journal stays open in `execute`
        # A boundary: this task drives one run of many, so whatever stops it (a failing disk,
        # a refused journal, a bug) fails this run only, and says why in its `error`.
        except Exception as exc:
            self._failed(tracked, exc)
        finally:
            tracked.snapshot = run.snapshot()
            # Stopped before a tool, or suspended (a parked run's suspend journals that it
            # waits for its approval still, which the run's own state does not say): the
            # journal's fold is the truth, as a restart and every other supervisor read it.
            if not run.finished or run.state == States.SUSPENDED:
                with contextlib.suppress(JournalError, OSError, ValueError):
                    tracked.snapshot = await self.snapshot_of(run.data.run_id)
            if run.finished:
                self.desk.forget(run.data.run_id)
            await run.aclose()
            tracked.queued = False
            await self._stopped(tracked, run)
            self._changed(run.data.run_id)

    def _failed(self, tracked: Tracked, exc: Exception) -> None:
        """A step raised: the run stops here, and says why."""
        tracked.error = one_line(exc)

    async def _stopped(self, tracked: Tracked, run: Run) -> None:
        """The task driving `run` is done (a cluster gives the run's lease up here)."""

    async def _config(self, path: str) -> AgentConfig:
        if not path or (self.config.path is not None and Path(path) == self.config.path):
            return self.config
        found = self._configs.get(path)
        if found is None:
            load = load_config if self.config_dirs is None else self.config_dirs.load
            found = self._configs[path] = await asyncio.to_thread(load, path)
        return found

    async def submit(
        self, prompt: str, name: str | None = None, config: str | None = None
    ) -> Tracked:
        """Start a new run on `prompt` (of agent.yaml `config`, else the supervisor's)."""
        return await self._submit(prompt, name, config, chat=False)

    async def submit_chat(
        self, prompt: str, name: str | None = None, config: str | None = None
    ) -> Tracked:
        """Start a new chat on `prompt`: after each answer it waits for a follow-up (`say`)."""
        return await self._submit(prompt, name, config, chat=True)

    async def _submit(
        self, prompt: str, name: str | None, config: str | None, *, chat: bool
    ) -> Tracked:
        refuse_unencodable(prompt, "prompt")  # UnencodableText, a ValueError: HTTP 400
        if self.closing:
            raise Conflict("the supervisor is shutting down")
        agent = await self._config(config or "")
        run_id = new_run_id()
        config_path = str(agent.path) if agent.path is not None else ""
        entry = await self.registry.submitted(run_id, name or run_id, config_path)
        tracked = self._track(entry, agent)
        try:
            options = self._options(run_id, tracked.sink)
            run = await start_session(agent, prompt, self.store, options, run_id=run_id, chat=chat)
        except BaseException:
            del self.runs[run_id]
            await self.registry.mark(ABORTED, run_id)
            raise
        self._launch(tracked, run)
        self.publish("RunSubmitted", tracked)
        return tracked

    async def _resume(self, tracked: Tracked) -> None:
        run_id = tracked.entry.run_id
        try:
            run = await resume_session(
                tracked.config, run_id, self.store, self._options(run_id, tracked.sink)
            )
        # A boundary: `start` resumes every run at once, and one that cannot resume (its tools
        # no longer load, its journal is refused, an MCP server is gone) must fail alone.
        except Exception as exc:
            tracked.error = one_line(exc)
            self._changed(run_id)
            return
        self._launch(tracked, run)
        self._changed(run_id)

    def _mark(self, tracked: Tracked, disposition: str) -> None:
        tracked.entry = attrs.evolve(tracked.entry, disposition=disposition)

    # -- operator actions -------------------------------------------------------------------

    async def suspend(self, run_id: str) -> Tracked:
        """Suspend a live run now (an operator's: a restart does not resume it)."""
        tracked = self.get(run_id)
        # A run that reached its end is not running, even while its task is still closing.
        if not tracked.live or tracked.run is None or tracked.run.finished:
            raise Conflict(f"run {run_id} is not running (status {tracked.status})")
        await self.registry.mark(OPERATOR_SUSPENDED, run_id)
        self._mark(tracked, OPERATOR_SUSPENDED)
        self._stop(tracked)
        return tracked

    async def say(self, run_id: str, text: str) -> Tracked:
        """Post a follow-up to a chat run waiting for its next prompt (`awaiting_input`)."""
        refuse_unencodable(text, "text")  # UnencodableText, a ValueError: HTTP 400
        tracked = self.get(run_id)
        run = tracked.run
        if not tracked.live or run is None or run.state != States.AWAITING_INPUT:
            raise Conflict(f"run {run_id} is not waiting for input (state {tracked.state})")
        if not isinstance(run.input, Inbox):  # pragma: no cover - _launch gives every chat one
            raise Conflict(f"run {run_id} is not a chat")
        run.input.put(text)
        return tracked

    async def resume(self, run_id: str) -> Tracked:
        """Resume a suspended or parked run that no task drives."""
        tracked = self.get(run_id)
        if tracked.live:
            raise Conflict(f"run {run_id} is already running")
        if tracked.status not in ("suspended", "parked") or self.closing:
            raise Conflict(f"run {run_id} cannot be resumed (status {tracked.status})")
        await self.registry.mark(RESUMED, run_id)
        self._mark(tracked, RESUMED)
        await self._resume(tracked)
        return tracked

    async def abort(self, run_id: str) -> Tracked:
        """Stop a run for good: suspended now if live, never resumed, status `aborted`."""
        tracked = self.get(run_id)
        if tracked.status in ("aborted", *ENDED):
            raise Conflict(f"run {run_id} has ended (status {tracked.status})")
        await self.registry.mark(ABORTED, run_id)
        self._mark(tracked, ABORTED)
        if tracked.live:
            self._stop(tracked)
        self._changed(run_id)
        return tracked

    async def answer(self, run_id: str, tool_use_id: str, approval: Approval) -> Tracked:
        """Answer a pending approval, once (a later answer: `AlreadyAnswered`); a parked
        session that no task drives is resumed, and its renewed question finds the answer."""
        tracked, desk = self.get(run_id), self.desk
        pending = tracked.approval
        asked = pending is not None and pending.tool_use_id == tool_use_id
        if desk.waiting(run_id, tool_use_id) or (asked and tracked.live):
            desk.claim(run_id, tool_use_id, approval)  # before any await: the first one wins
            desk.answer(run_id, tool_use_id, approval)  # else the run finds it when it asks
            return tracked
        if not asked:  # answered (here, or as its journal says), or never asked
            await desk.refuse_answered(run_id, tool_use_id, self.records_of)
            raise NotFound(f"run {run_id} has no pending approval {tool_use_id!r}")
        if tracked.status != "parked" or self.closing:
            raise Conflict(f"run {run_id} cannot take an answer (status {tracked.status})")
        desk.claim(run_id, tool_use_id, approval)
        try:
            await desk.refuse_answered(run_id, tool_use_id, self.records_of, own=True)
            await self.registry.mark(RESUMED, run_id)
            self._mark(tracked, RESUMED)
            if not tracked.live:  # an operator's resume may have started it meanwhile
                await self._resume(tracked)
        finally:
            if not tracked.live:  # the answer never reached the run: it is pending again
                desk.release(run_id, tool_use_id)
        return tracked

    def _stop(self, tracked: Tracked) -> None:
        if tracked.run is not None:
            tracked.run.request_suspend(now=True)
        tracked.stopping.set()

    # -- start and shutdown -----------------------------------------------------------------

    async def start(self) -> list[str]:
        """Load the registry; resume the runs a shutdown suspended or whose owner died.
        Returns the ids resumed."""
        entries = await asyncio.to_thread(self.registry.load)
        resumed = []
        for entry in entries.values():
            try:
                config = await self._config(entry.config)
            except (ValueError, OSError) as exc:  # ConfigError, NotAllowed; the file: log only
                say(f"fisk-sm supervise: run {entry.run_id}: {one_line(exc)}")
                tracked = self._track(entry, self.config)
                tracked.error = "cannot load its config (see the supervisor's log)"
                continue
            tracked = self._track(entry, config)
            try:
                tracked.snapshot = await self.snapshot_of(entry.run_id)
            except (JournalError, OSError, ValueError) as exc:  # a missing or refused journal
                tracked.error = one_line(exc)
                continue
            if resumes(tracked):
                resumed.append(entry.run_id)
        await asyncio.gather(*(self._resume(self.runs[r]) for r in resumed))
        return resumed

    async def shutdown(self, on_stopped: Callable[[], None] | None = None) -> list[str]:
        """Suspend every live run now, wait for them, mark them for the next start; returns
        the ids marked `shutdown_suspended`."""
        self.closing = True
        live = [t for t in self.runs.values() if t.live]
        for tracked in live:
            self._stop(tracked)
        await asyncio.gather(*(t.task for t in live if t.task is not None), return_exceptions=True)
        marked = [t.entry.run_id for t in live if t.entry.resumable]
        await self.registry.mark(SHUTDOWN_SUSPENDED, *marked)
        if on_stopped is not None:
            on_stopped()
        self.hub.close()
        return marked

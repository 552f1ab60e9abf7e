"""`Host`: many checkpointed runs on one event loop, with bounded concurrency (the public name
is `fisk_sm.supervisor.Supervisor`).

Theory of operation. Every run is a session in one store, driven by a task of its own
(`fisk_sm.supervisor.host.drive`) that holds one of the host's `Slots` only around a model
request or a tool. All runs share the loop's one SDK client (`fisk_sm.model.clients`).

What a restart must do is kept in the registry (`fisk_sm.supervisor.host.registry`, through
`ownership`): a shutdown suspends every run now (a model call in flight is cancelled, a tool
finishes) and marks those runs `shutdown_suspended`; an operator's suspend and abort are marked
before they take effect. On start (`adopt` of every entry), the runs whose last mark allows it
are resumed, unless their journal ended or waits for an approval: those are listed, and resumed
when an operator resumes or answers them. A resumed journal continues by the crash rules: a
tool started without its result is retried, failed or asked by the config's `crash_policy`.

The read side (rows, listings, events) is the host's `book` (`fisk_sm.supervisor.view.book`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.errors import one_line
from fisk_sm.config.text import refuse_unencodable
from fisk_sm.events.types import Fanout
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.journal.records import Record
from fisk_sm.loop.actions import Inbox
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run, new_run_id
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.host.control import LocalControl
from fisk_sm.supervisor.host.desk import ApprovalDesk, DeskPrompter
from fisk_sm.supervisor.host.drive import drive, let_go
from fisk_sm.supervisor.host.ending import end_chat, post
from fisk_sm.supervisor.host.ownership import FileOwnership, Intake, Ownership
from fisk_sm.supervisor.host.registry import Registry, RunRegistry
from fisk_sm.supervisor.host.slots import SLOT_STATES, Slots
from fisk_sm.supervisor.host.starting import recorded_start
from fisk_sm.supervisor.interface import HostControl
from fisk_sm.supervisor.view.book import Leftover, RunBook, resumes
from fisk_sm.supervisor.view.entry import (
    ABORTED,
    OPERATOR_SUSPENDED,
    RESUMED,
    SHUTDOWN_SUSPENDED,
    RegistryEntry,
)
from fisk_sm.supervisor.view.hub import EventHub, RunSink
from fisk_sm.supervisor.view.tracked import ENDED, Tracked

__all__ = ["SLOT_STATES", "Conflict", "Host", "NotFound", "Supervisor"]


class Host:
    """Drives many checkpointed runs of `config` in `store` on the running loop (the read
    side, rows, listings and events, is its `book`).

    `registry_dir` holds the registry (default: `store.directory / "supervisor"`); a
    `JetStreamStore` needs a `registry` or an `ownership` given (a cluster member's: lease,
    `intake` and `book` parts, `host.cluster_setup`); `ownership` decides who drives a run. With
    `config_dirs`, every config but the host's own is confined to them, on a submit and again
    on a restart or a takeover (the file may have changed since). `hub` carries the runs'
    events (default: a new `EventHub`).
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
        ownership: Ownership | None = None,
        hub: EventHub | None = None,
        intake: Intake | None = None,
        book: RunBook | None = None,
    ) -> None:
        self.slots = Slots(concurrency)
        self.config = config
        self.config_dirs = config_dirs
        self.store = store
        self.concurrency = concurrency
        self.options = options or RunOptions()
        if ownership is None:
            if registry is None:
                if not isinstance(store, FileStore):
                    raise TypeError("a supervisor of a JetStream store needs a registry given")
                registry = Registry(registry_dir or store.directory / "supervisor")
            ownership = FileOwnership(registry)
        self.ownership = ownership
        self.registry = ownership.registry
        self.book = book or RunBook(hub or EventHub(), store)
        self.desk = ApprovalDesk(self.book.changed, ownership.shared)
        self.intake = intake
        self._configs: dict[str, AgentConfig] = {}
        self.closing = False

    # -- the read side: the `book`'s, kept here for library users -------------------------

    @property
    def hub(self) -> EventHub:
        """The runs' events."""
        return self.book.hub

    @property
    def runs(self) -> dict[str, Tracked]:
        """Every run this host knows, by id."""
        return self.book.runs

    async def refresh(self) -> None:
        """Bring the runs of other supervisors up to date (a cluster's; here, nothing)."""
        await self.book.refresh()

    def get(self, run_id: str) -> Tracked:
        """The run `run_id`; `InvalidIdError` for a malformed id, `NotFound` for an unknown."""
        return self.book.get(run_id)

    def listing(self) -> list[Tracked]:
        """Every run, newest first."""
        return self.book.listing()

    def approvals(self) -> list[dict[str, Any]]:
        """Every pending approval, as the API's `Approval` JSON."""
        return self.book.approvals()

    def leftover(self) -> Leftover:
        """What the runs no task drives wait for (after a shutdown: what the next start finds)."""
        return self.book.leftover()

    async def records_of(self, run_id: str) -> list[Record]:
        """The journal of `run_id`, read off the loop."""
        return await self.book.records_of(run_id)

    # -- driving ----------------------------------------------------------------------------

    def _options(self, run_id: str, sink: RunSink) -> RunOptions:
        prompter = DeskPrompter(self.desk, run_id)
        opts = self.options
        events = sink if opts.events is None else Fanout((sink, opts.events))
        return RunOptions(model=opts.model, tools=opts.tools, events=events, prompter=prompter)

    def _track(self, entry: RegistryEntry, config: AgentConfig) -> Tracked:
        sink = RunSink(entry.run_id, self.hub, self.book.changed)
        tracked = self.book.tracked(entry, config, sink)
        self.runs[entry.run_id] = tracked
        return tracked

    def _launch(self, tracked: Tracked, run: Run) -> None:
        if run.data.chat:  # it waits in awaiting_input for what `say` posts
            run.input = Inbox()
        tracked.run, tracked.error, tracked.queued = run, None, True
        tracked.stopping = asyncio.Event()
        tracked.task = asyncio.ensure_future(drive(self, tracked, run))
        tracked.task.add_done_callback(partial(let_go, tracked, run))

    def _failed(self, tracked: Tracked, exc: Exception) -> None:
        """A step raised: the run stops here, and says why (unless it was lost, not failed)."""
        if not self.ownership.refused(tracked, exc):
            tracked.error = one_line(exc)

    async def _stopped(self, tracked: Tracked, run: Run) -> None:
        """The task driving `run` is done (a cluster gives the run's lease up here)."""
        await self.ownership.give_up(tracked, run)

    async def _config(self, path: str) -> AgentConfig:
        if not path or (self.config.path is not None and Path(path) == self.config.path):
            return self.config
        found = self._configs.get(path)
        if found is None:
            load = load_config if self.config_dirs is None else self.config_dirs.load
            found = self._configs[path] = await asyncio.to_thread(load, path)
        return found

    async def submit(
        self,
        prompt: str,
        name: str | None = None,
        config: str | None = None,
        *,
        run_id: str | None = None,
    ) -> Tracked:
        """Start a new run on `prompt` (of agent.yaml `config`, else the supervisor's), as
        `run_id` if given (a new id else). Idempotent for a given `run_id`: a run this host has
        is returned as it is, and one whose session exists already (its first host died after
        starting it) is adopted (`adopt`), not started again."""
        return await self._submit(prompt, name, config, chat=False, run_id=run_id)

    async def submit_chat(
        self,
        prompt: str,
        name: str | None = None,
        config: str | None = None,
        *,
        run_id: str | None = None,
    ) -> Tracked:
        """Start a new chat on `prompt`: after each answer it waits for a follow-up (`say`)."""
        return await self._submit(prompt, name, config, chat=True, run_id=run_id)

    async def _submit(
        self, prompt: str, name: str | None, config: str | None, *, chat: bool, run_id: str | None
    ) -> Tracked:
        if self.intake is not None:  # a cluster's: on the work queue
            return await self.intake.submit(self, prompt, name, config, chat=chat, run_id=run_id)
        refuse_unencodable(prompt, "prompt")  # UnencodableText, a ValueError: HTTP 400
        if self.closing:
            raise Conflict("the supervisor is shutting down")
        known = self.runs.get(run_id) if run_id is not None else None
        if known is not None:  # submitted here already (a resend)
            return known
        agent = await self._config(config or "")
        run_id = run_id or new_run_id()
        config_path = str(agent.path) if agent.path is not None else ""
        tracked = self._track(
            RegistryEntry(run_id, name or run_id, config_path, time.time()), agent
        )
        options = self._options(run_id, tracked.sink)
        start = start_session(agent, prompt, self.store, options, run_id=run_id, chat=chat)
        try:  # the registry's line and the session at once (`starting`)
            tracked.entry, run = await recorded_start(self.registry, tracked.entry, start)
        except BaseException:
            del self.runs[run_id]
            raise
        if run is None:  # started by a host that died since: its journal goes on
            del self.runs[run_id]
            await self.adopt([tracked.entry])
            return self.get(run_id)
        self._launch(tracked, run)
        self.book.publish("RunSubmitted", tracked)
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
            self.book.changed(run_id)
            return
        self._launch(tracked, run)
        self.book.changed(run_id)

    def _mark(self, tracked: Tracked, disposition: str) -> None:
        tracked.entry = attrs.evolve(tracked.entry, disposition=disposition)

    # -- operator actions -------------------------------------------------------------------

    async def suspend(self, run_id: str) -> Tracked:
        """Suspend a live run now (an operator's: a restart does not resume it)."""
        await self.refresh()
        if run_id not in self.runs and (owner := self.ownership.elsewhere(run_id)):
            raise Conflict(f"run {run_id} is driven by {owner}: suspend it there")
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
        return post(self.get(run_id), text)

    async def resume(self, run_id: str) -> Tracked:
        """Resume a suspended or parked run that no task drives (a cluster's: or failed)."""
        await self.refresh()
        tracked = self.get(run_id)
        if await tracked.driven():
            raise Conflict(f"run {run_id} is already running")
        if tracked.status not in self.ownership.resumable or self.closing:
            raise Conflict(f"run {run_id} cannot be resumed (status {tracked.status})")
        if await self.ownership.claim(self, run_id):
            return self.get(run_id)
        await self.registry.mark(RESUMED, run_id)
        self._mark(tracked, RESUMED)
        await self._resume(tracked)
        return tracked

    async def abort(self, run_id: str) -> Tracked:
        """Stop a run for good: suspended now if live, never resumed, status `aborted`."""
        await self.refresh()
        tracked = self.get(run_id)
        if tracked.status in ("aborted", *ENDED):
            raise Conflict(f"run {run_id} has ended (status {tracked.status})")
        if not tracked.live and await self.ownership.abort(run_id):  # its lease held `aborted`
            return tracked
        await self.registry.mark(ABORTED, run_id)
        self._mark(tracked, ABORTED)
        if tracked.live:
            self._stop(tracked)
        self.book.changed(run_id)
        return tracked

    async def answer(self, run_id: str, tool_use_id: str, approval: Approval) -> Tracked:
        """Answer a pending approval, once (a later answer: `AlreadyAnswered`)."""
        return await self.ownership.answer(self, run_id, tool_use_id, approval)

    async def end(self, run_id: str) -> Tracked:
        """Ask a chat to end as `completed` at its (next) prompt (`ending.end_chat`)."""
        return end_chat(self.get(run_id))

    def control(self) -> HostControl:
        """The control API's view of this supervisor (`build_app(supervisor)`)."""
        return LocalControl(self)

    def _stop(self, tracked: Tracked) -> None:
        if tracked.run is not None:
            tracked.run.request_suspend(now=True)
        tracked.stopping.set()

    # -- start and shutdown -----------------------------------------------------------------

    async def start(self) -> list[str]:
        """Load the registry; resume the runs a shutdown suspended or whose owner died.
        Returns the ids resumed."""
        if self.intake is not None:  # a cluster's: its runs come from the queue and the leases
            await self.intake.start(self)
        entries = await asyncio.to_thread(self.registry.load)
        return await self.adopt(entries.values())

    async def adopt(self, entries: Iterable[RegistryEntry]) -> list[str]:
        """Take these runs in (a start's, or a dead worker's runs): each is folded from its
        journal and resumed if its registry entry and journal allow it (`resumes`: not ended,
        not waiting for an approval, not suspended by an operator), else only listed. A journal
        left mid-step by a process that died goes on by the crash rules: a tool started
        without its result is retried, failed or asked (`crash_policy`), so at most that one
        tool runs twice. A run a task drives here already is left alone. Returns the ids
        resumed."""
        resumed = []
        for entry in entries:
            here = self.runs.get(entry.run_id)
            if here is not None and here.live:
                continue
            try:
                config = await self._config(entry.config)
            except (ValueError, OSError) as exc:  # ConfigError, NotAllowed; the file: log only
                say(f"fisk-sm supervise: run {entry.run_id}: {one_line(exc)}")
                tracked = self._track(entry, self.config)
                tracked.error = "cannot load its config (see the supervisor's log)"
                continue
            tracked = self._track(entry, config)
            try:
                tracked.snapshot = await self.book.snapshot_of(entry.run_id)
            except (JournalError, OSError, ValueError) as exc:  # a missing or refused journal
                tracked.error = one_line(exc)
                continue
            if resumes(tracked) and await self.ownership.take(entry):
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
        if self.intake is not None:
            await self.intake.stop()
        return marked


#: The public name (`fisk_sm.Supervisor`, `fisk_sm.supervisor.Supervisor`).
Supervisor = Host

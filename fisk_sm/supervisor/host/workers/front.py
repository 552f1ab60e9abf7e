"""`Front`: the `HostControl` of `fisk-sm supervise --workers N`, over N worker processes.

The front drives no run. It holds the registry (runs.jsonl: the workers' writes come to it),
places each new run on the least-loaded worker (fewest live runs, then fewest placed, then the
lowest index), routes every call about a run to the worker it is placed on, asks every worker
for a listing or the approvals and merges them (newest first), and numbers every event the
workers send (`FrontHub`).

A run belongs to one worker at a time. When a worker dies (`WorkerProcess.ended`: it is dead,
its sessions' locks released), its runs are dealt to the survivors as `Adopt`: each is folded
from its journal and resumed by the crash rules (a tool started without its result is retried,
failed or asked by `crash_policy`: at most that one tool runs twice), or only listed; a submit
it had not answered is sent again, under the same id, to another. Calls about a run being moved
wait for it (at most `MOVING` s, then 409). The dead index is started again (`WorkerPool`); with
no worker left, `failed` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import attrs
import msgspec

from fisk_sm.client.records import Approval
from fisk_sm.config.agent import AgentConfig
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.run import new_run_id
from fisk_sm.machine.path import SessionPath
from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.host.registry import Registry, RegistryEntry
from fisk_sm.supervisor.host.workers import frames as f
from fisk_sm.supervisor.host.workers.channel import Handler, NoteHandler
from fisk_sm.supervisor.host.workers.pool import WorkerPool, WorkerProcess
from fisk_sm.supervisor.host.workers.uplink import FrontHub
from fisk_sm.supervisor.interface import Action, Answer, EventFeed, RunRow, ShownRun, SubmitRequest

__all__ = ["MOVING", "Front"]

#: How long a call about a run being moved to another worker waits for it (then 409).
MOVING = 30.0
#: The statuses of a run a task drives.
LIVE = frozenset({"queued", "running", "waiting"})
T = TypeVar("T")


def _as(kind: type[T], value: Any) -> T:
    return msgspec.convert(value, kind)


@attrs.define
class Settings:
    """What the front's workers are: the agent.yaml, the state directory, the concurrency to
    share, the config directories, OpenTelemetry."""

    config: AgentConfig
    store: FileStore
    workers: int
    concurrency: int
    config_dirs: tuple[Path, ...] = ()
    otel: bool = False
    loop: str = "asyncio"  # the workers' event loop


class Front:
    """`HostControl` over `settings.workers` worker processes (see the module's doc)."""

    def __init__(self, settings: Settings, *, event_buffer: int | None = None) -> None:
        self.settings = settings
        self.registry = Registry(settings.store.directory / "supervisor")
        self.entries: dict[str, RegistryEntry] = {}
        self.hub = (
            FrontHub(on_watch=self._watch)
            if event_buffer is None
            else FrontHub(event_buffer, self._watch)
        )
        self.pool = WorkerPool(self._spec, self._served, self._noted, settings.loop)
        self.workers: dict[int, WorkerProcess] = {}
        self.placement: dict[str, int] = {}
        self.submitting: set[str] = set()
        self.moving: dict[str, asyncio.Future[None]] = {}  # runs of a dead worker, till placed
        self.closing = False
        self.failed = asyncio.Event()  # no worker is left
        self._watchers: set[asyncio.Task[None]] = set()

    # -- workers ----------------------------------------------------------------------------

    def _spec(self, index: int) -> f.WorkerSpec:
        s = self.settings
        share = s.concurrency // s.workers + (index < s.concurrency % s.workers)
        return f.WorkerSpec(
            index=index,
            config=str(s.config.path),
            state_dir=str(s.store.directory),
            concurrency=max(1, share),
            config_dirs=tuple(str(d) for d in s.config_dirs),
            otel=s.otel,
            watch=self.hub.wanted,
        )

    def _served(self, worker: WorkerProcess) -> Handler:
        async def handle(body: f.Body) -> Any:
            if isinstance(body, f.Register):
                entry = self.entries.get(body.run_id)  # a resent submit's: as it is
                if entry is None:
                    entry = await self.registry.submitted(body.run_id, body.name, body.config)
                    self.entries[body.run_id] = entry
                return f.frame_entry(entry)
            if isinstance(body, f.Mark):
                await self.registry.mark(body.disposition, *body.run_ids)
                for run_id in body.run_ids:
                    if run_id in self.entries:
                        entry = self.entries[run_id]
                        self.entries[run_id] = attrs.evolve(entry, disposition=body.disposition)
                return None
            raise RuntimeError(f"the front takes no {type(body).__name__}")

        return handle

    def _noted(self, worker: WorkerProcess) -> NoteHandler:
        def noted(body: f.Body) -> None:
            if isinstance(body, f.Events):
                self.hub.take(body)
            elif isinstance(body, f.Stopped):
                worker.live.discard(body.run_id)

        return noted

    def _watch(self, watch: f.Watch) -> None:
        for worker in self.workers.values():
            if not worker.channel.is_closed:
                worker.channel.notify(watch)

    async def _spawn(self, index: int) -> WorkerProcess:
        worker = await self.pool.spawn(index)
        self.workers[index] = worker
        say(f"fisk-sm supervise: worker {index} (pid {worker.pid}) started")
        task = asyncio.ensure_future(self._watch_death(worker))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        return worker

    async def start(self) -> list[str]:
        """Start the workers; deal every run of the registry to them (`Adopt`): those a
        restart resumes are resumed. Returns the ids resumed."""
        self.entries = await asyncio.to_thread(self.registry.load)
        await asyncio.gather(*(self._spawn(i) for i in range(self.settings.workers)))
        return await self._deal(list(self.entries), list(self.workers.values()))

    async def _deal(self, run_ids: list[str], to: list[WorkerProcess]) -> list[str]:
        """Place `run_ids` over `to` (the least loaded first) and have each adopt its share."""
        shares: dict[int, list[f.Entry]] = {w.index: [] for w in to}
        for run_id in run_ids:
            worker = min(to, key=lambda w: (len(shares[w.index]) + len(w.live), w.index))
            shares[worker.index].append(f.frame_entry(self.entries[run_id]))
            self.placement[run_id] = worker.index
            worker.placed += 1

        async def adopt(worker: WorkerProcess, entries: list[f.Entry]) -> list[str]:
            resumed = _as(list[str], await worker.channel.call(f.Adopt(tuple(entries))))
            worker.live.update(resumed)
            return resumed

        done = await asyncio.gather(
            *(adopt(w, shares[w.index]) for w in to if shares[w.index]), return_exceptions=True
        )
        return [r for part in done if isinstance(part, list) for r in part]

    async def _watch_death(self, worker: WorkerProcess) -> None:
        status = await worker.ended()
        if self.workers.get(worker.index) is worker:
            del self.workers[worker.index]
        moved = [r for r, i in self.placement.items() if i == worker.index]
        if self.closing:
            worker.replaced.set_result(None)
            return
        say(f"fisk-sm supervise: worker {worker.index} (pid {worker.pid}) died (status {status})")
        for run_id in moved:
            self.moving[run_id] = worker.replaced
        try:
            await self._replace(worker, moved)
        finally:
            for run_id in moved:
                if self.moving.get(run_id) is worker.replaced:
                    del self.moving[run_id]
            worker.replaced.set_result(None)

    async def _replace(self, dead: WorkerProcess, moved: list[str]) -> None:
        """Deal the runs of `dead` to the survivors (adopted by the crash rules); start its
        index again; with nobody left, `failed`."""
        respawn = None
        if self.pool.may_respawn(dead.index):
            respawn = asyncio.ensure_future(self._spawn(dead.index))
            respawn.add_done_callback(partial(self._respawned, dead.index))
        else:
            say(f"fisk-sm supervise: worker {dead.index} died too often: not started again")
        survivors = [w for w in self.workers.values() if w is not dead]
        if not survivors and respawn is not None:
            with contextlib.suppress(f.WorkerLost, f.RemoteError, OSError):  # said once done
                survivors = [await respawn]
        if not survivors:
            self.failed.set()
            return
        for run_id in moved:  # an unanswered submit is resent by its caller, not adopted
            if run_id in self.submitting:
                self.placement[run_id] = self._least_loaded(survivors).index
        adopted = [r for r in moved if r not in self.submitting and r in self.entries]
        await self._deal(adopted, survivors)

    def _respawned(self, index: int, task: asyncio.Task[WorkerProcess]) -> None:
        if not task.cancelled() and task.exception() is not None:
            say(f"fisk-sm supervise: worker {index} does not start: {task.exception()}")
            if not self.workers:
                self.failed.set()

    def _least_loaded(self, among: Sequence[WorkerProcess] | None = None) -> WorkerProcess:
        workers = list(among if among is not None else self.workers.values())
        if not workers:
            raise Conflict("no worker is running: the supervisor is starting again")
        return min(workers, key=lambda w: (len(w.live), w.placed, w.index))

    # -- routing ----------------------------------------------------------------------------

    async def _owner(self, run_id: str) -> WorkerProcess:
        """The worker `run_id` is placed on, once it is not being moved."""
        for _ in range(3):
            moving = self.moving.get(run_id)
            if moving is None:
                break
            try:
                await asyncio.wait_for(asyncio.shield(moving), MOVING)
            except TimeoutError:
                raise Conflict(f"run {run_id} is moving to another worker: try again") from None
        index = self.placement.get(run_id)
        if index is None:
            raise NotFound(f"no run {run_id!r}")
        worker = self.workers.get(index)
        if worker is None or run_id in self.moving:
            raise Conflict(f"run {run_id} is moving to another worker: try again")
        return worker

    async def _call(self, run_id: str, body: f.Body, *, again: bool) -> Any:
        """`body` to the worker of `run_id`; if that worker dies meanwhile, once more to the
        run's next worker (`again`: a read) or a 409 (an action: it may have been done)."""
        worker = await self._owner(run_id)
        try:
            return await worker.channel.call(body)
        except f.WorkerLost:
            if not again:
                raise Conflict(
                    f"the worker driving run {run_id} died: the run resumes on another; look"
                    " at it again before acting"
                ) from None
        await worker.replaced
        return await (await self._owner(run_id)).channel.call(body)

    # -- HostControl ------------------------------------------------------------------------

    @property
    def config_path(self) -> Path | None:
        return self.settings.config.path

    @property
    def events(self) -> EventFeed:
        return self.hub

    async def submit(self, request: SubmitRequest) -> RunRow:
        if self.closing:
            raise Conflict("the supervisor is shutting down")
        run_id = new_run_id()
        worker = self._least_loaded()
        self.placement[run_id] = worker.index
        worker.placed += 1
        body = f.Submit(run_id, request.prompt, request.name, request.config, request.chat)
        self.submitting.add(run_id)
        try:
            for _ in range(3):  # sent again, same id, if its worker dies first (idempotent)
                try:
                    row = _as(RunRow, await worker.channel.call(body))
                except f.WorkerLost:
                    await worker.replaced
                    worker = await self._owner(run_id)
                    continue
                worker.live.add(run_id)
                return row
            raise Conflict(f"run {run_id}: its workers died while it started: try again")
        except BaseException:
            if run_id not in self.entries:  # refused before it was recorded: no such run
                self.placement.pop(run_id, None)
            raise
        finally:
            self.submitting.discard(run_id)

    async def _scatter(self, body: f.Body) -> list[Any]:
        """`body` to every worker; their answers (once more if one died meanwhile)."""
        for _ in range(2):
            await asyncio.gather(*(asyncio.shield(m) for m in set(self.moving.values())))
            workers = list(self.workers.values())
            got = await asyncio.gather(
                *(w.channel.call(body) for w in workers), return_exceptions=True
            )
            lost = [w for w, g in zip(workers, got, strict=True) if isinstance(g, f.WorkerLost)]
            if not lost:
                break
            await asyncio.gather(*(w.replaced for w in lost))
        for part in got:
            if isinstance(part, BaseException):
                raise part
        return got

    async def listing(self) -> Sequence[RunRow]:
        rows = [_as(RunRow, r) for part in await self._scatter(f.List()) for r in part]
        return sorted(rows, key=lambda r: (-r.created, r.run_id))

    async def approvals(self) -> Sequence[Approval]:
        found = [_as(Approval, a) for part in await self._scatter(f.ListApprovals()) for a in part]

        def newest(approval: Approval) -> tuple[float, str]:
            entry = self.entries.get(approval.run_id)
            return (-entry.created if entry is not None else 0.0, approval.run_id)

        return sorted(found, key=newest)  # stable: a run's in the order its worker gave

    async def row(self, run_id: str) -> RunRow:
        return _as(RunRow, await self._call(run_id, f.RowOf(run_id), again=True))

    async def show(self, run_id: str) -> ShownRun:
        return _as(ShownRun, await self._call(run_id, f.Show(run_id), again=True))

    async def session_path(self, run_id: str) -> SessionPath | None:
        found = await self._call(run_id, f.PathOf(run_id), again=True)
        return None if found is None else _as(SessionPath, found)

    async def _acted(self, run_id: str, body: f.Body) -> RunRow:
        row = _as(RunRow, await self._call(run_id, body, again=False))
        worker = self.workers.get(self.placement[run_id])
        if worker is not None and row.status in LIVE:
            worker.live.add(run_id)
        return row

    async def act(self, run_id: str, action: Action) -> RunRow:
        return await self._acted(run_id, f.Act(run_id, action))

    async def say(self, run_id: str, text: str) -> RunRow:
        return await self._acted(run_id, f.Say(run_id, text))

    async def answer(self, run_id: str, tool_use_id: str, answer: Answer) -> RunRow:
        return await self._acted(run_id, f.AnswerCall(run_id, tool_use_id, answer))

    # -- shutdown ---------------------------------------------------------------------------

    async def shutdown(self) -> f.Summary:
        """Every worker suspends its runs now and marks them for the next start; the sum of
        their summaries, once every worker exited."""
        self.closing = True
        workers = list(self.workers.values())
        got = await asyncio.gather(
            *(w.channel.call(f.Shutdown()) for w in workers), return_exceptions=True
        )
        summaries = [_as(f.Summary, g) for g in got if not isinstance(g, BaseException)]
        for worker, answer in zip(workers, got, strict=True):
            if isinstance(answer, BaseException):
                say(f"fisk-sm supervise: worker {worker.index} did not shut down: {answer}")
        await asyncio.gather(*(w.exited for w in workers))
        self.hub.close()
        return f.Summary(
            marked=tuple(r for s in summaries for r in s.marked),
            resuming=sum(s.resuming for s in summaries),
            parked=sum(s.parked for s in summaries),
            suspended=sum(s.suspended for s in summaries),
        )

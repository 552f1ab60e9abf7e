"""Parked approvals in a JetStream KV bucket, so that any supervisor can answer them.

The key is `<run_id>.<tool_use_id>`; the value is the API's `Approval` JSON plus `"answer"`
(null while pending, then `once`, `always` or `deny`). The run's owner puts the question in the
bucket when the run parks (`SharedDesk.ask`: a create, or an update of the revision it read, so
never over an answer) and keeps waiting at its own desk, holding no slot. Whichever
supervisor's API takes the answer writes it into the key by compare-and-swap (`answer_shared`,
an update of the revision that had none), so of two operators answering at once the first wins
and the other is told its answer (`AlreadyAnswered`). Every supervisor watches the bucket: the
owner sees the answer and hands it to its waiting run. The key is deleted once the run ends;
from then on its journal names the answer. Nobody waiting for it (the owner died, or a shutdown
suspended the parked run) changes nothing: the answer stays in the bucket, and the supervisor
that resumes the run (a takeover, or the one that answered, which takes the parked run's lease)
finds it there when the run asks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from fisk_sm.operator.prompter import Approval
from fisk_sm.supervisor.cluster.lease import stop_following
from fisk_sm.supervisor.errors import AlreadyAnswered, Conflict
from fisk_sm.supervisor.host.desk import ANSWERS, NAMES, ApprovalDesk, PendingApproval
from fisk_sm.supervisor.interface import approval_json

__all__ = ["TRIES", "AlreadyAnswered", "SharedDesk", "approval_key"]

#: How often a compare-and-swap that lost to a write that was no answer is tried again.
TRIES = 10


def approval_key(run_id: str, tool_use_id: str) -> str:
    """The bucket key of one approval."""
    return f"{run_id}.{tool_use_id}"


class SharedDesk(ApprovalDesk):
    """The approval desk of one supervisor of several: the questions are in `kv` too."""

    def __init__(
        self, kv: KeyValue, owner: str, on_change: Callable[[str], None] = lambda r: None
    ) -> None:
        super().__init__(on_change)
        self.kv = kv
        self.owner = owner
        #: Every approval in the bucket (all supervisors'), by key: the watcher's mirror.
        self.shared: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._watcher: Any = None
        self._ready = asyncio.Event()
        self._cleanups: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start following the bucket; returns once its current content is mirrored."""
        self._watcher = await self.kv.watchall()
        self._task = asyncio.ensure_future(self._follow())
        await self._ready.wait()

    async def stop(self) -> None:
        """Stop following the bucket."""
        await stop_following(self._task, self._watcher)

    async def _follow(self) -> None:
        async for entry in self._watcher:
            if entry is None:
                self._ready.set()
                continue
            if entry.operation:
                self.shared.pop(entry.key, None)
                continue
            try:
                value = json.loads(entry.value or b"")
            except ValueError:
                continue
            if not isinstance(value, dict):
                continue
            self.shared[entry.key] = value
            approval = ANSWERS.get(str(value.get("answer")))
            if approval is not None:  # relay to our run, if it waits here
                ApprovalDesk.answer(
                    self, str(value.get("run_id")), str(value.get("tool_use_id")), approval
                )

    def pending_shared(self) -> list[dict[str, Any]]:
        """Every unanswered approval of every supervisor, as the API's `Approval` JSON."""
        found = [v for v in self.shared.values() if v.get("answer") is None]
        return [{k: v[k] for k in ("run_id", "tool_use_id", "tool", "input", "tag")} for v in found]

    async def _read(self, key: str) -> tuple[int, dict[str, Any]] | None:
        """The key's revision and value (None if there is no such key, or no approval in it)."""
        try:
            entry = await self.kv.get(key)
            value = json.loads(entry.value or b"")
        except (KeyNotFoundError, ValueError):
            return None
        return (entry.revision or 0, value) if isinstance(value, dict) else None

    async def ask(self, request: PendingApproval) -> Approval:
        """An answer in the bucket is used at once; otherwise the question goes there (never
        over an answer written meanwhile) and the run waits at this desk."""
        key = approval_key(request.run_id, request.tool_use_id)
        for _ in range(TRIES):
            found = await self._read(key)
            answer = ANSWERS.get(str(found[1].get("answer"))) if found is not None else None
            if answer is not None:
                self.settle(request.run_id, request.tool_use_id, answer)
                break
            data = json.dumps(
                {**approval_json(request), "owner": self.owner, "answer": None}
            ).encode()
            try:
                if found is None:
                    await self.kv.create(key, data)
                else:
                    await self.kv.update(key, data, last=found[0])
                break
            except KeyWrongLastSequenceError:  # written meanwhile (an answer?): read again
                continue
        return await super().ask(request)

    def drop(self, run_id: str) -> None:
        """The run ended: remove its approvals from the bucket (in the background)."""
        keys = [k for k, v in self.shared.items() if v.get("run_id") == run_id]
        if keys:
            task = asyncio.ensure_future(self._delete(keys))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)

    async def _delete(self, keys: list[str]) -> None:
        for key in keys:
            # Unreachable, or the connection closed: the entry stays, answered by no one.
            with contextlib.suppress(NatsError, OSError):
                await self.kv.delete(key)

    async def answer_shared(self, run_id: str, tool_use_id: str, approval: Approval) -> bool:
        """Answer in the bucket (any supervisor's run) by compare-and-swap; False if there is no
        such question, `AlreadyAnswered` (naming it) if it has its answer."""
        key = approval_key(run_id, tool_use_id)
        for _ in range(TRIES):
            found = await self._read(key)
            if found is None:
                return False
            revision, value = found
            if value.get("answer") is not None:
                raise AlreadyAnswered(run_id, tool_use_id, str(value["answer"]))
            value["answer"] = NAMES[approval]
            try:
                await self.kv.update(key, json.dumps(value).encode(), last=revision)
            except KeyWrongLastSequenceError:  # written meanwhile: read who won
                continue
            ApprovalDesk.answer(self, run_id, tool_use_id, approval)  # ours: no need to wait
            return True
        raise Conflict(f"approval {tool_use_id} of run {run_id} keeps changing: try again")

"""Parked approvals in a JetStream KV bucket, so that any member of a cluster can answer them.

The key is `<run_id>.<tool_use_id>`; the value is the API's `Approval` JSON plus `"answer"`
(null while pending, then `once`, `always` or `deny`). The run's owner puts the question in the
bucket when the run parks (`ApprovalsMirror.ask_shared`: a create, or an update of the revision
it read, so never over an answer) and keeps waiting at its own desk, holding no slot. Whichever
member's API takes the answer writes it into the key by compare-and-swap (`answer_shared`, an
update of the revision that had none), so of two operators answering at once the first wins and
the other is told its answer (`AlreadyAnswered`). Every member follows the bucket: the owner
sees the answer and hands it to its waiting run (`on_answer`, which the host's desk sets). The
key is deleted once the run ends; from then on its journal names the answer. Nobody waiting for
it (the owner died, or a shutdown suspended the parked run) changes nothing: the answer stays
in the bucket, and the member that resumes the run (a takeover, or the one that answered, which
takes the parked run's lease) finds it there when the run asks again.
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

from fisk_sm.client.records import Approval
from fisk_sm.supervisor.cluster.lease import stop_following
from fisk_sm.supervisor.errors import AlreadyAnswered, Conflict
from fisk_sm.supervisor.interface import ANSWER_NAMES, Answer, approval_json

__all__ = ["TRIES", "ApprovalsMirror", "approval_key"]

#: How often a compare-and-swap that lost to a write that was no answer is tried again.
TRIES = 10


def approval_key(run_id: str, tool_use_id: str) -> str:
    """The bucket key of one approval."""
    return f"{run_id}.{tool_use_id}"


def _answer(value: dict[str, Any]) -> Answer | None:
    found = value.get("answer")
    return next((name for name in ANSWER_NAMES if name == found), None)


class ApprovalsMirror:
    """Every member's approvals, in `kv` and mirrored here; `owner` names this member."""

    def __init__(self, kv: KeyValue, owner: str) -> None:
        self.kv = kv
        self.owner = owner
        #: Every approval in the bucket (all members'), by key: the watcher's mirror.
        self.shared: dict[str, dict[str, Any]] = {}
        #: Told (run_id, tool_use_id, answer) of every answer seen: the desk's relay to its run.
        self.on_answer: Callable[[str, str, Answer], object] = lambda r, t, a: None
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
            answer = _answer(value)
            if answer is not None:  # relay to our run, if it waits here
                self.on_answer(str(value.get("run_id")), str(value.get("tool_use_id")), answer)

    def pending_shared(self) -> list[dict[str, Any]]:
        """Every unanswered approval of every member, as the API's `Approval` JSON."""
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

    async def ask_shared(self, request: Approval) -> Answer | None:
        """The answer the bucket has for `request` already, else None once the question is
        there (never written over an answer written meanwhile)."""
        key = approval_key(request.run_id, request.tool_use_id)
        for _ in range(TRIES):
            found = await self._read(key)
            answer = _answer(found[1]) if found is not None else None
            if answer is not None:
                return answer
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
        return None

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

    async def answer_shared(self, run_id: str, tool_use_id: str, answer: Answer) -> bool:
        """Answer in the bucket (any member's run) by compare-and-swap; False if there is no
        such question, `AlreadyAnswered` (naming it) if it has its answer."""
        key = approval_key(run_id, tool_use_id)
        for _ in range(TRIES):
            found = await self._read(key)
            if found is None:
                return False
            revision, value = found
            if value.get("answer") is not None:
                raise AlreadyAnswered(run_id, tool_use_id, str(value["answer"]))
            value["answer"] = answer
            try:
                await self.kv.update(key, json.dumps(value).encode(), last=revision)
            except KeyWrongLastSequenceError:  # written meanwhile: read who won
                continue
            self.on_answer(run_id, tool_use_id, answer)  # ours: no need to wait
            return True
        raise Conflict(f"approval {tool_use_id} of run {run_id} keeps changing: try again")

"""Run leases in a JetStream KV bucket: which supervisor owns which run, until when.

Theory of operation. The key is the run id; the value is JSON `{"owner", "expires", "hold"}`:
the owner's name, the wall-clock time (epoch seconds) after which the lease is void unless
renewed, and why nobody drives the run, if that is the case (`hold`, below). Every change is a
compare-and-swap on the key's revision, so of two supervisors racing for a run exactly one wins:
`acquire` creates the key, or replaces a value that has expired or been released; `renew` (the
owner's heartbeat) replaces the value only if it is still the revision the owner wrote last, so
a supervisor whose lease was taken over learns it from the failed renewal (`LeaseLost`).

The value also carries the run's `name` and `config` (the agent.yaml it was submitted with), so
a supervisor that takes the run over resumes it with the same configuration.

`hold` says what happens to a run no task drives: `""` is a live lease (void once expired: its
owner died or stalled, and another supervisor takes the run over); `released` is a run a
shutdown suspended (free for anyone at once); `parked` waits for an approval (taken by whoever
answers it); `operator_suspended` and `aborted` are left alone until an operator resumes them.
A run that ended keeps its key, held `ended`, so that every supervisor's listing still has its
name (nobody takes it: no hold breaks `ended`); a submission that never became a session has
none.

Expiry compares wall clocks across hosts: keep them in sync (NTP) and the TTL well above the
skew. Every supervisor keeps a mirror of the whole bucket (`LeaseView`, fed by a KV watcher), so
finding the runs to take over and listing every run's owner cost no requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import attrs
from nats.errors import Error as NatsError
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

__all__ = [
    "ACTIVE",
    "ENDED",
    "HOLDS",
    "Lease",
    "LeaseLost",
    "LeaseValue",
    "LeaseView",
    "Leases",
    "stop_following",
]

ACTIVE = ""
RELEASED = "released"
PARKED = "parked"
OPERATOR_SUSPENDED = "operator_suspended"
ABORTED = "aborted"
FAILED = "failed"
ENDED = "ended"
HOLDS = (ACTIVE, RELEASED, PARKED, OPERATOR_SUSPENDED, ABORTED, FAILED, ENDED)
#: The holds a takeover may break: a dead owner's lease, a shutdown's release.
TAKEABLE = frozenset({ACTIVE, RELEASED})
#: JetStream's error code for a revision check that failed.
WRONG_LAST_SEQUENCE = 10071


class LeaseLost(Exception):
    """Another supervisor changed (took over, ended) the lease this one held."""


@attrs.frozen
class LeaseValue:
    """What the bucket holds for a run."""

    owner: str
    expires: float
    hold: str = ACTIVE
    name: str = ""
    config: str = ""

    def expired(self, now: float | None = None) -> bool:
        """Whether nobody drives the run any more by this lease (expired or held)."""
        return self.hold != ACTIVE or self.expires <= (time.time() if now is None else now)

    def to_bytes(self) -> bytes:
        return json.dumps(attrs.asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> LeaseValue | None:
        """The value, or None for anything malformed (counted as free)."""
        try:
            raw = json.loads(data)
            value = cls(
                str(raw["owner"]),
                float(raw["expires"]),
                str(raw.get("hold", ACTIVE)),
                str(raw.get("name", "")),
                str(raw.get("config", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None
        return value if value.hold in HOLDS else None


@attrs.frozen
class Lease:
    """A lease this supervisor holds: the revision it wrote last, and whose it was before."""

    run_id: str
    revision: int
    value: LeaseValue
    previous: LeaseValue | None = None


async def stop_following(task: asyncio.Task[None] | None, watcher: Any) -> None:
    """Stop the task that follows a KV bucket, then its watcher (what the mirrors share); then
    raise what ended the task before, if anything did (a bug: the watcher never raises)."""
    if task is not None:
        task.cancel()
        await asyncio.wait({task})  # not `await task`: a cancel of our caller is not its end
    if watcher is not None:
        # The connection closed (or is draining) first: the subscription went with it.
        with contextlib.suppress(NatsError):
            await watcher.stop()
    if task is not None and not task.cancelled() and (failure := task.exception()) is not None:
        raise failure  # a mirror that stopped following is a bug: not hidden


class Leases:
    """The lease bucket `kv`, as supervisor `owner` with leases of `ttl` seconds."""

    def __init__(self, kv: KeyValue, owner: str, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError(f"the lease TTL must be positive, not {ttl}")
        self.kv = kv
        self.owner = owner
        self.ttl = ttl

    def _mine(self, like: LeaseValue | None, hold: str = ACTIVE) -> LeaseValue:
        expires = time.time() + self.ttl if hold == ACTIVE else 0.0
        name, config = (like.name, like.config) if like is not None else ("", "")
        return LeaseValue(self.owner, expires, hold, name, config)

    async def read(self, run_id: str) -> tuple[LeaseValue | None, int]:
        """The run's lease value and revision; (None, 0) if it has none."""
        try:
            entry = await self.kv.get(run_id)
        except KeyNotFoundError:
            return None, 0
        return LeaseValue.parse(entry.value or b""), entry.revision or 0

    async def acquire(
        self,
        run_id: str,
        *,
        breaking: frozenset[str] = TAKEABLE,
        name: str = "",
        config: str = "",
    ) -> Lease | None:
        """Take the run's lease: a new key (of a run `name` of agent.yaml `config`), or one
        that has expired or whose hold is in `breaking`. None if another supervisor holds it
        (or won the race for it)."""
        value = LeaseValue(self.owner, time.time() + self.ttl, ACTIVE, name, config)
        try:
            revision = await self.kv.create(run_id, value.to_bytes())
            return Lease(run_id, revision, value)
        except KeyWrongLastSequenceError:
            pass
        current, last = await self.read(run_id)
        if current is not None:
            free = current.hold in breaking and (current.hold != ACTIVE or current.expired())
            if not free:
                return None
        value = self._mine(current if current is not None else value)
        try:
            revision = await self.kv.update(run_id, value.to_bytes(), last=last)
        except KeyWrongLastSequenceError:
            return None  # another supervisor got there first
        return Lease(run_id, revision, value, current)

    async def renew(self, lease: Lease) -> Lease:
        """Extend `lease` by the TTL; `LeaseLost` if the key changed since we wrote it."""
        value = self._mine(lease.value)
        try:
            revision = await self.kv.update(lease.run_id, value.to_bytes(), last=lease.revision)
        except KeyWrongLastSequenceError:
            raise LeaseLost(f"run {lease.run_id}: the lease is no longer ours") from None
        return Lease(lease.run_id, revision, value)

    async def hold(self, lease: Lease, hold: str) -> None:
        """Give the run up, saying why (`released`, `parked`, ...); `LeaseLost` if not ours."""
        try:
            value = self._mine(lease.value, hold)
            await self.kv.update(lease.run_id, value.to_bytes(), last=lease.revision)
        except KeyWrongLastSequenceError:
            raise LeaseLost(f"run {lease.run_id}: the lease is no longer ours") from None

    async def end(self, lease: Lease) -> None:
        """The run ended: remove its key (only if it is still ours)."""
        try:
            await self.kv.delete(lease.run_id, last=lease.revision)
        except KeyWrongLastSequenceError:
            pass
        except BadRequestError as exc:
            # A delete's revision check is refused as a plain 400 (10071: wrong last sequence),
            # not as KeyWrongLastSequenceError: the key is another owner's now; leave it.
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise


class LeaseView:
    """A live mirror of the lease bucket (a KV watcher): run id -> (value, revision)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.leases: dict[str, LeaseValue] = {}
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watcher: Any = None

    async def start(self) -> None:
        """Start watching; returns once the bucket's current values are mirrored."""
        self._watcher = await self.kv.watchall()
        self._task = asyncio.ensure_future(self._follow())
        await self.ready.wait()

    async def _follow(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # the end of the initial values
                self.ready.set()
                continue
            value = None if entry.operation else LeaseValue.parse(entry.value or b"")
            if value is None:
                self.leases.pop(entry.key, None)
            else:
                self.leases[entry.key] = value

    def owner(self, run_id: str) -> str:
        """The run's owner while its lease is live, else ''."""
        value = self.leases.get(run_id)
        return value.owner if value is not None and not value.expired() else ""

    def takeable(self, now: float | None = None) -> list[str]:
        """The runs whose lease a takeover may break, oldest expiry first."""
        found = [
            (v.expires, k) for k, v in self.leases.items() if v.hold in TAKEABLE and v.expired(now)
        ]
        return [k for _, k in sorted(found)]

    async def stop(self) -> None:
        """Stop following the bucket."""
        await stop_following(self._task, self._watcher)

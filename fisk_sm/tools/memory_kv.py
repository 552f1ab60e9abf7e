"""Agent memory in a NATS JetStream KV bucket, shared by every process that uses the bucket.

Each memory is the value of key `<identity>.<key>`, in the file store's entry format
(`render_entry`): a memory moves between the backends unchanged. The key rule and the limits
are the file store's (`check_key`, 65536 bytes, 1024 entries, a one-line description).

Read before update. An overwrite needs the revision this store (one per run) remembered from a
read or a create of the key, and is applied with compare-and-swap (`kv.update(last=rev)`). With
no remembered revision, or when another writer moved the key since, the write is stale: a
`MemoryStaleError` (the tool answers `{"written": false, "reason": "... read it first"}`) that
also forgets the revision, so the next try must read again. A delete forgets it too. Listing
(and the index) never grants it: seeing a key is not reading it. `require_read=False`
(`no_require_read_before_update`) writes blindly instead: the last writer wins.

The bucket must already exist (the operator owns its durability): on first use the store
binds to it and checks it keeps one value per key (`history` 1), never expires one (no `ttl`)
and takes a full-size entry (`max_value_size`); each wrong setting is named.

The store connects lazily, on its first operation (never while a harness is built), with its
own NATS connection, which `aclose()` closes. Everything is a coroutine on the caller's loop.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import attrs

from fisk_sm.config.errors import one_line
from fisk_sm.tools.memory import (
    MAX_ENTRIES,
    MAX_ENTRY_BYTES,
    MemoryEntry,
    MemoryFileError,
    MemoryStaleError,
    MemoryStoreError,
    check_key,
    format_index,
    full_error,
    parse_entry,
    render_entry,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.kv import KeyValue

__all__ = ["KVMemoryStore", "MemoryBucketError", "bucket_problems"]

#: How long one listing may wait for the bucket's next entry before it is an error.
LIST_TIMEOUT = 10.0
#: Passes of the watcher before a listing is taken as it is (see `KVMemoryStore._entries`).
LIST_ATTEMPTS = 5


class MemoryBucketError(MemoryStoreError):
    """The bucket is missing, misconfigured or unreachable; the message names what."""


def bucket_problems(history: int, ttl: float | None, max_value_size: int | None) -> list[str]:
    """What is wrong with a bucket's settings for durable memory (empty if nothing)."""
    problems = []
    if history != 1:
        problems.append(f"history must be 1, got {history}")
    if ttl:
        problems.append(f"ttl must be none (memories must not expire), got {ttl:g}s")
    if max_value_size is not None and 0 < max_value_size < MAX_ENTRY_BYTES:
        problems.append(f"max_value_size must be at least {MAX_ENTRY_BYTES}, got {max_value_size}")
    return problems


@contextlib.contextmanager
def _nats_errors(what: str) -> Iterator[None]:
    """NATS failures as `MemoryBucketError`s naming `what` (an is_error for the model)."""
    from nats.errors import Error as NatsError

    try:
        yield
    except (NatsError, TimeoutError, ConnectionError) as exc:
        raise MemoryBucketError(f"{what}: {one_line(exc) or type(exc).__name__}") from None


@attrs.define(eq=False)
class KVMemoryStore:
    """The memories of `identity` in JetStream KV bucket `bucket` at `url` (a `MemoryBackend`)."""

    url: str
    bucket: str
    identity: str
    require_read: bool = True
    _revisions: dict[str, int] = attrs.field(factory=dict, init=False)
    _nc: Client | None = attrs.field(default=None, init=False)
    _kv: KeyValue | None = attrs.field(default=None, init=False)
    _binding: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    @property
    def location(self) -> str:
        """Where the memories are, for people: `bucket 'B' at URL, keys 'identity.*'`."""
        return f"bucket {self.bucket!r} at {self.url}, keys '{self.identity}.*'"

    def _name(self, key: str) -> str:
        return f"{self.identity}.{check_key(key)}"

    async def _bound(self) -> KeyValue:
        """The bucket, bound (and checked) on first use."""
        async with self._binding:
            if self._kv is None:
                self._kv = await self._bind()
            return self._kv

    async def _bind(self) -> KeyValue:
        from nats.js.errors import BucketNotFoundError

        from fisk_sm.tools.remote import connect_nats

        where = f"memory bucket {self.bucket!r}"
        try:
            nc = await connect_nats(self.url)
        except ConnectionError as exc:
            raise MemoryBucketError(f"{where}: {exc}") from None
        try:
            with _nats_errors(f"{where} at {self.url}"):
                try:
                    kv = await nc.jetstream().key_value(self.bucket)
                except BucketNotFoundError:
                    raise MemoryBucketError(
                        f"{where} does not exist at {self.url}; create it first, e.g."
                        f" `nats kv add {self.bucket} --history=1`"
                    ) from None
                config = (await kv.status()).stream_info.config
            problems = bucket_problems(
                config.max_msgs_per_subject or 0, config.max_age, config.max_msg_size
            )
            if problems:
                raise MemoryBucketError(f"{where}: {'; '.join(problems)}")
        except BaseException:
            await nc.close()
            raise
        self._nc = nc
        return kv

    async def _entries(self, *, values: bool) -> builtins.list[tuple[str, bytes]]:
        """(key, value) of this identity's live keys, in one pass of a KV watcher.

        The watcher's end-of-data marker comes from the server's pending count, which can come
        early (seen here about once in six lists of a thousand keys), so a pass is checked
        against the stream's count of this identity's subjects (a deleted key's marker
        included) and repeated when it saw fewer."""
        kv = await self._bound()
        prefix = f"{self.identity}."
        found: dict[str, bytes] = {}
        with _nats_errors(f"cannot list memory bucket {self.bucket!r}"):
            for _ in range(LIST_ATTEMPTS):
                found, seen = await self._watch(kv, prefix, values)
                if seen >= await self._subject_count(prefix):
                    break
        return sorted(found.items())

    async def _watch(self, kv: KeyValue, prefix: str, values: bool) -> tuple[dict[str, bytes], int]:
        """One pass: the live keys' values, and how many subjects it saw (deleted ones too)."""
        found: dict[str, bytes] = {}
        seen: set[str] = set()
        watcher = await kv.watch(f"{prefix}>", meta_only=not values)
        try:
            while (entry := await watcher.updates(LIST_TIMEOUT)) is not None:  # type: ignore[no-untyped-call]
                key = entry.key.removeprefix(prefix)
                seen.add(key)
                if entry.operation in ("DEL", "PURGE"):
                    found.pop(key, None)
                else:
                    found[key] = entry.value or b""
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return found, len(seen)

    async def _subject_count(self, prefix: str) -> int:
        """How many keys of `prefix` the bucket's stream holds (deleted markers included)."""
        assert self._nc is not None
        subjects = f"$KV.{self.bucket}.{prefix}>"
        info = await self._nc.jetstream().stream_info(f"KV_{self.bucket}", subjects_filter=subjects)
        return len(info.state.subjects or {})

    async def list(self) -> builtins.list[tuple[str, str]]:
        """(key, description) of every memory, sorted by key; unparsable values are skipped.
        It grants no overwrite."""
        listed = []
        for key, value in await self._entries(values=True):
            parsed = parse_entry(value)
            if parsed is not None and len(value) <= MAX_ENTRY_BYTES:
                listed.append((key, parsed[0]))
        return listed

    async def index(self) -> str:
        """The index injected at a run's start (it grants no overwrite)."""
        return format_index(await self.list())

    async def read(self, key: str) -> MemoryEntry | None:
        """The memory under `key`, or None; remembers its revision (granting an overwrite)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        name = self._name(key)
        kv = await self._bound()
        with _nats_errors(f"cannot read memory '{key}'"):
            try:
                entry = await kv.get(name)
            except (KeyNotFoundError, KeyDeletedError):
                self._revisions.pop(key, None)
                return None
        parsed = parse_entry(entry.value or b"")
        if parsed is None:
            raise MemoryFileError(f"memory '{key}' in bucket {self.bucket!r}: not a memory entry")
        if entry.revision is not None:
            self._revisions[key] = entry.revision
        return MemoryEntry(key, *parsed)

    async def create(self, key: str, description: str, content: str) -> bool:
        """Store a new memory; False if `key` exists. The 1024 cap is checked first."""
        from nats.js.errors import KeyWrongLastSequenceError

        data = render_entry(check_key(key), description, content)
        if len(await self._entries(values=False)) >= MAX_ENTRIES:
            raise full_error(key)
        kv = await self._bound()
        with _nats_errors(f"cannot write memory '{key}'"):
            try:
                revision = await kv.create(self._name(key), data)
            except KeyWrongLastSequenceError:
                return False
        self._revisions[key] = revision
        return True

    async def overwrite(self, key: str, description: str, content: str) -> None:
        """Replace the memory under `key`: compare-and-swap on the remembered revision, or a
        blind put without `require_read`. Raises `MemoryStaleError` (forgetting the revision)
        when this store has not read the current value."""
        from nats.js.errors import KeyWrongLastSequenceError

        data = render_entry(check_key(key), description, content)
        kv = await self._bound()
        with _nats_errors(f"cannot write memory '{key}'"):
            if not self.require_read:
                self._revisions[key] = await kv.put(self._name(key), data)
                return
            last = self._revisions.get(key)
            if last is None:
                raise MemoryStaleError(
                    f"memory '{key}' was not read in this run: read it first (memory_read),"
                    " then overwrite"
                )
            try:
                self._revisions[key] = await kv.update(self._name(key), data, last=last)
            except KeyWrongLastSequenceError:
                del self._revisions[key]
                raise MemoryStaleError(
                    f"memory '{key}' changed since this run read it: read it first (memory_read)"
                    " again, then overwrite"
                ) from None

    async def delete(self, key: str) -> bool:
        """Remove the memory under `key` (idempotent); forgets its revision."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        name = self._name(key)
        kv = await self._bound()
        self._revisions.pop(key, None)
        with _nats_errors(f"cannot delete memory '{key}'"):
            try:
                await kv.get(name)
            except (KeyNotFoundError, KeyDeletedError):
                return False
            await kv.delete(name)
        return True

    async def aclose(self) -> None:
        """Close the connection (if one was made); the store can bind again later."""
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None:
            from nats.errors import Error as NatsError

            # A connection that broke with data unsent fails its close: it is gone all the same.
            with contextlib.suppress(NatsError, OSError):
                await nc.close()

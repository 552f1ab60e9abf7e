"""The JetStream backend of sessions: one message per record in a stream, appends fenced.

A session `<id>` is the subjects `<prefix>.<id>._meta` (seq 1) and `<prefix>.<id>.<seq>` of an
existing stream whose settings `fisk_sm.journal.jetstream_stream` checks on connect: every
subject holds one message and refuses a second one, so a record is written once, and nothing
expires. A message's body is the record's file line (`encode`, no newline), read back by the
same parser as a file (`parse_journal`).

An append is one publish, with msg id `<nonce>-<seq>` (the nonce is the writer's) and fenced on
the stream sequence of the run's last message (`Nats-Expected-Last-Subject-Sequence`, filtered
on `<prefix>.<id>.>`), which the journal keeps from its previous append. Should the fence fail,
the target subject is read: a message with our own msg id is ours, whose acknowledgement was
lost (a timeout), and is adopted; anything else means that another writer appended (a second
`run --resume`, or a supervisor that took the run over), and this writer is fenced out for
good: `SessionLockedError`. Opening takes no lock; the first append is the test.

A publish that fails for want of an answer (a timeout, a lost connection) raises
`JetStreamIOError` and leaves the journal usable: the same record may be appended again, and
its msg id makes the retry adopt the message should the first attempt have reached the stream.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.errors import one_line
from fisk_sm.journal.base import JournalError, check_append
from fisk_sm.journal.filestore import (
    SessionExistsError,
    SessionInfo,
    SessionLockedError,
    SessionNotFoundError,
    check_fork_at,
    check_run_id,
)
from fisk_sm.journal.jetstream_stream import (
    JetStreamConfigError,
    JetStreamIOError,
    bind_stream,
    connect_nats,
    nats_errors,
)
from fisk_sm.journal.parsing import CorruptJournalError, fold_journal, parse_journal
from fisk_sm.journal.records import TAKEN_OVER, Meta, Record, Terminal, encode
from fisk_sm.journal.snapshot import Snapshot

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.api import RawStreamMsg

__all__ = [
    "JetStreamConfigError",
    "JetStreamIOError",
    "JetStreamJournal",
    "JetStreamStore",
    "configured_url",
    "connect_configured",
]

MSG_ID = "Nats-Msg-Id"
FENCE = "Nats-Expected-Last-Subject-Sequence"
FENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
#: The server's answers to a publish that the fence or the one-message-per-subject limit refused.
_WRONG_LAST_SEQUENCE, _SUBJECT_FULL = 10071, 10077
#: Records read at once when a journal is loaded (one pipelined request each).
_READ_AHEAD = 128
#: Sessions loaded at once by `list_async`.
_LIST_AHEAD = 16


@attrs.define(eq=False)
class JetStreamStore:
    """Sessions in an existing JetStream stream; `connect` binds to it and checks it."""

    url: str
    stream: str
    prefix: str
    _nc: Client = attrs.field(repr=False)
    _js: JetStreamContext = attrs.field(repr=False)
    _owns_connection: bool = False
    #: How long a request to the server may take.
    seconds: float = 5.0

    @classmethod
    async def connect(
        cls, url: str, *, stream: str, prefix: str, nc: Client | None = None, seconds: float = 5.0
    ) -> JetStreamStore:
        """Bind to `stream` on `url` (or on the connection `nc`, which stays the caller's);
        every request then gets `seconds` for its answer.

        A missing stream or a wrong setting raises `JetStreamConfigError` naming it; a server
        that cannot be reached, `JetStreamIOError` naming the URL.
        """
        owns = nc is None
        if nc is None:
            nc = await connect_nats(url, seconds)
        try:
            js = nc.jetstream(timeout=seconds)
            await bind_stream(js, url, stream, prefix)
        except BaseException:
            if owns:
                await nc.close()
            raise
        return cls(url, stream, prefix, nc, js, owns, seconds)

    async def close(self) -> None:
        """Close the connection if `connect` made it."""
        if self._owns_connection and not self._nc.is_closed:
            await self._nc.close()

    def run_filter(self, run_id: str) -> str:
        """The subjects of session `run_id`: `<prefix>.<id>.>`."""
        return f"{self.prefix}.{check_run_id(run_id)}.>"

    def subject(self, run_id: str, seq: int) -> str:
        """The subject of record `seq` of `run_id`."""
        return f"{self.prefix}.{run_id}.{'_meta' if seq == 1 else seq}"

    def label(self, run_id: str) -> Path:
        """How errors name a session's journal: `<stream>/<prefix>.<id>`."""
        return Path(self.stream) / f"{self.prefix}.{run_id}"

    async def _get(self, subject: str) -> RawStreamMsg | None:
        """The last message on `subject` (a wildcard filter is allowed), or None."""
        from nats.js.errors import NotFoundError

        with nats_errors(f"{self.url}: stream {self.stream!r}: reading {subject}"):
            try:
                return await self._js.get_last_msg(self.stream, subject)
            except NotFoundError:
                return None

    def _seq_of(self, run_id: str, subject: str) -> int:
        token = subject.rsplit(".", 1)[-1]
        if token == "_meta":
            return 1
        if not token.isdigit():
            raise CorruptJournalError(f"{self.label(run_id)}: unexpected subject {subject}")
        return int(token)

    async def _read(self, run_id: str) -> tuple[list[Record], int, float]:
        """The records of `run_id`, the stream sequence of its last message and its time."""
        last = await self._get(self.run_filter(run_id))
        if last is None:
            where = f"stream {self.stream!r} has no {self.run_filter(run_id)} on {self.url}"
            raise SessionNotFoundError(f"session '{run_id}' not found: {where}")
        count = self._seq_of(run_id, last.subject or "")
        bodies: list[bytes] = []
        for start in range(1, count + 1, _READ_AHEAD):
            seqs = range(start, min(start + _READ_AHEAD, count + 1))
            messages = await asyncio.gather(*(self._get(self.subject(run_id, s)) for s in seqs))
            for seq, msg in zip(seqs, messages, strict=True):
                if msg is None or msg.data is None or b"\n" in msg.data:
                    what = "is missing" if msg is None else "is not one line"
                    raise CorruptJournalError(f"{self.label(run_id)}: record {seq} {what}")
                bodies.append(msg.data + b"\n")
        records, _ = parse_journal(self.label(run_id), b"".join(bodies))
        updated = last.time.timestamp() if last.time is not None else time.time()
        return records, last.seq or 0, updated

    async def create_async(self, meta: Meta) -> JetStreamJournal:
        """Create session `meta.run_id` with `meta` as its first, acknowledged record
        (`SessionExistsError` if the session has any message already)."""
        run_id = check_run_id(meta.run_id)
        if meta.seq != 1:
            raise ValueError(f"session '{run_id}': meta must have seq 1, got {meta.seq}")
        journal = JetStreamJournal(self, run_id, [meta])
        await journal.append(meta)
        return journal

    async def open_async(self, run_id: str) -> JetStreamJournal:
        """Open session `run_id` for appending; takes no lock (the first append is fenced)."""
        records, fence, _ = await self._read(run_id)
        return JetStreamJournal(self, run_id, records, records[-1].seq, fence)

    async def load_async(self, run_id: str) -> list[Record]:
        """The records of session `run_id`, read without changing anything."""
        return (await self._read(run_id))[0]

    async def snapshot_async(self, run_id: str) -> Snapshot:
        """The folded state of session `run_id`."""
        return fold_journal(self.label(run_id), await self.load_async(run_id))

    async def delete_async(self, run_id: str) -> None:
        """Purge every message of session `run_id`; a missing session is no error."""
        with nats_errors(f"{self.url}: stream {self.stream!r}: purging {run_id}"):
            await self._js.purge_stream(self.stream, subject=self.run_filter(run_id))

    async def fork_async(self, run_id: str, at_seq: int, new_id: str) -> None:
        """Create session `new_id` from the first `at_seq` records of `run_id`."""
        check_run_id(new_id)
        records = await self.load_async(run_id)
        check_fork_at(run_id, at_seq, records)
        meta = records[0]
        assert isinstance(meta, Meta)  # parse_journal guarantees it
        journal = await self.create_async(attrs.evolve(meta, run_id=new_id))
        try:
            for record in records[1:at_seq]:
                await journal.append(record)
        except BaseException:
            await self.delete_async(new_id)  # no half-written fork left behind
            raise

    async def take_over_async(self, run_id: str, message: str) -> int:
        """Fence the current writer of `run_id` out: append a `suspended` terminal record
        saying `message` ("taken over by B: the lease of A expired"); its seq is returned.

        The old writer's next append then fails with `SessionLockedError`; `resume_session`
        reads the record as a suspend and continues from there.
        """
        if not message.startswith(TAKEN_OVER):
            message = f"{TAKEN_OVER}: {message}"
        journal = await self.open_async(run_id)
        seq = journal.last_seq + 1
        await journal.append(Terminal(seq, "suspended", message))
        await journal.close()
        return seq

    async def list_async(self) -> list[SessionInfo]:
        """Every session (the subjects `<prefix>.*._meta`), newest first; one that cannot be
        read is listed as damaged, with why."""
        with nats_errors(f"{self.url}: stream {self.stream!r}: listing sessions"):
            info = await self._js.stream_info(self.stream, subjects_filter=f"{self.prefix}.*._meta")
        ids = [subject.split(".")[-2] for subject in info.state.subjects or {}]
        gate = asyncio.Semaphore(_LIST_AHEAD)

        async def one(run_id: str) -> SessionInfo:
            async with gate:
                return await self._info(run_id)

        infos = list(await asyncio.gather(*(one(run_id) for run_id in ids)))
        infos.sort(key=lambda info: (-info.updated, info.run_id))
        return infos

    async def _info(self, run_id: str) -> SessionInfo:
        try:
            records, _, updated = await self._read(run_id)
            snap = fold_journal(self.label(run_id), records)
        except JetStreamIOError:
            raise
        except JournalError as exc:  # an invalid id, a corrupt journal
            reason = one_line(exc).removeprefix(f"{self.label(run_id)}: ")
            return SessionInfo(run_id, "", "damaged", 0.0, "", 0, reason)
        model = str(snap.fingerprint.get("model", ""))
        return SessionInfo(run_id, model, snap.status, updated, snap.prompt, len(records))


@attrs.define(eq=False)
class JetStreamJournal:
    """An open session in a `JetStreamStore`: the `Journal` protocol, appends fenced."""

    store: JetStreamStore
    run_id: str
    #: The records the journal held when it was handed out; appends do not extend it.
    records: list[Record]
    _last_seq: int = 0
    #: The stream sequence of the run's last message (0: none), the fence of the next append.
    _fence: int = 0
    #: This writer's part of every msg id.
    nonce: str = attrs.Factory(lambda: secrets.token_hex(8))
    #: Accepted for the `SessionJournal` protocol: every append here waits for its ack.
    deferred_intents: frozenset[str] = frozenset()
    _fenced_out: str = ""
    _closed: bool = False
    _inflight: asyncio.Future[None] | None = attrs.field(default=None, repr=False)

    @property
    def path(self) -> Path:
        """How errors name the journal (`<stream>/<prefix>.<id>`)."""
        return self.store.label(self.run_id)

    @property
    def last_seq(self) -> int:
        """The seq of the last record the server acknowledged (or that was adopted)."""
        return self._last_seq

    def msg_id(self, seq: int) -> str:
        """The msg id this writer publishes record `seq` with."""
        return f"{self.nonce}-{seq}"

    async def append(self, record: Record) -> None:
        """Append under the append contract; returns once the stream has the record.

        A cancelled append still completes in the background, and the journal learns its
        outcome (as `FileJournal`'s does).
        """
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait([self._inflight])  # a replay waits for the attempt in flight
        if self._closed:
            raise JournalError(f"{self.path}: journal is closed")
        if self._fenced_out:
            raise SessionLockedError(self._fenced_out)
        try:
            must_write = check_append(self._last_seq, record)
        except JournalError as exc:
            raise JournalError(f"{self.path}: {exc}") from None
        if must_write:
            self._inflight = asyncio.ensure_future(self._write(record))
            await asyncio.shield(self._inflight)

    async def _write(self, record: Record) -> None:
        from nats.js.errors import APIError

        store, seq = self.store, record.seq
        headers = {
            MSG_ID: self.msg_id(seq),
            FENCE: str(self._fence),
            FENCE_SUBJECT: store.run_filter(self.run_id),
        }
        what = f"{self.path}: append of seq {seq}"
        with nats_errors(what):
            try:
                ack = await store._js.publish(
                    store.subject(self.run_id, seq), encode(record).encode(), headers=headers
                )
                stream_seq = ack.seq
            except APIError as exc:
                if exc.err_code not in (_WRONG_LAST_SEQUENCE, _SUBJECT_FULL):
                    raise JetStreamIOError(f"{what} failed: {one_line(exc.description)}") from None
                stream_seq = await self._adopt(record)
        self._fence, self._last_seq = stream_seq, seq

    async def _adopt(self, record: Record) -> int:
        """After a refused publish: the stream sequence of our own message at the target
        subject (its ack was lost), else fence this writer out."""
        store, seq = self.store, record.seq
        found = await store._get(store.subject(self.run_id, seq))
        if found is not None and (found.headers or {}).get(MSG_ID) == self.msg_id(seq):
            return found.seq or 0
        if seq == 1:
            raise SessionExistsError(f"session '{self.run_id}' already exists: {self.path}")
        last = await store._get(store.run_filter(self.run_id))
        theirs = store._seq_of(self.run_id, last.subject or "") if last is not None else seq
        self._fenced_out = (
            f"session '{self.run_id}': another writer appended seq {theirs};"
            " this writer is fenced out"
        )
        raise SessionLockedError(self._fenced_out)

    async def close(self) -> None:
        """Wait for an append still in flight; the connection is the store's. Idempotent."""
        self._closed = True
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait([self._inflight])


def configured_url(config: AgentConfig, env: Mapping[str, str] | None = None) -> str:
    """`harness.sessions.options.url`, else `$NATS_URL`, else the top-level `nats.url`."""
    env = os.environ if env is None else env
    return config.harness.sessions.options.url or env.get("NATS_URL") or config.nats.url


async def connect_configured(
    config: AgentConfig, env: Mapping[str, str] | None = None
) -> JetStreamStore:
    """The `JetStreamStore` that `harness.sessions` (backend `jetstream`) names."""
    options = config.harness.sessions.options
    return await JetStreamStore.connect(
        configured_url(config, env), stream=options.stream, prefix=options.prefix
    )

"""Submissions as a JetStream work queue: any supervisor accepts a run, one of them starts it.

A submission is one message on `<subject>` in a work-queue stream, its body the JSON object
`{"run_id", "prompt", "name", "config", "created", "by"}` and its `Nats-Msg-Id` the run id, so a
client that publishes twice (a lost acknowledgement) submits once. Every supervisor pulls from
the same durable consumer, as many as it has room for: JetStream hands each message to one of
them. A supervisor acknowledges a submission once the run's session and lease exist; one that
dies before that leaves the message to be delivered again after `ack_wait` (the durable
consumer's, set by the first supervisor that creates it), and whoever gets it
then finds the lease (and maybe the session) and carries on from there.

The stream is created when missing (retention work queue, file storage, a two-minute duplicate
window); an existing stream with another retention or subject is refused with a message naming
the setting.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import attrs
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from fisk_sm.journal.filestore import check_run_id

__all__ = [
    "DEFAULT_QUEUE_STREAM",
    "DEFAULT_QUEUE_SUBJECT",
    "QueueConfigError",
    "Submission",
    "WorkQueue",
]

DEFAULT_QUEUE_STREAM = "FISK_SM_SUBMISSIONS"
DEFAULT_QUEUE_SUBJECT = "fisk-sm.submissions"
CONSUMER = "fisk-sm-supervisors"
#: How long a supervisor may hold a submission before JetStream offers it to another.
ACK_WAIT = 30.0
#: How long a pull waits for more once it has one.
DRAIN_WAIT = 0.02


class QueueConfigError(ValueError):
    """The submissions stream exists with a setting the queue cannot work with."""


@attrs.frozen
class Submission:
    """A run someone asked for: what the API's POST /api/runs took."""

    run_id: str
    prompt: str
    name: str
    config: str
    created: float
    by: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(attrs.asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> Submission:
        """A submission from its message body; `ValueError` naming what is wrong."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("a submission must be a JSON object")
        for field in ("run_id", "prompt"):
            if not isinstance(raw.get(field), str):
                raise ValueError(f"submission {field}: must be a string")
        return cls(
            check_run_id(raw["run_id"]),
            raw["prompt"],
            str(raw.get("name") or raw["run_id"]),
            str(raw.get("config") or ""),
            float(raw.get("created") or time.time()),
            str(raw.get("by") or ""),
        )


class WorkQueue:
    """The submissions stream `stream` on `subject`, and this supervisor's pull from it."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str = DEFAULT_QUEUE_STREAM,
        subject: str = DEFAULT_QUEUE_SUBJECT,
        *,
        ack_wait: float = ACK_WAIT,
    ) -> None:
        self.js = js
        self.stream = stream
        self.subject = subject
        self.ack_wait = ack_wait
        self._sub: Any = None

    async def ensure(self) -> None:
        """Create the stream and the shared consumer if missing; check an existing stream."""
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            config = StreamConfig(
                name=self.stream,
                subjects=[self.subject],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=120.0,
            )
            await self.js.add_stream(config)
        else:
            found = info.config
            if found.retention != RetentionPolicy.WORK_QUEUE:
                raise QueueConfigError(
                    f"stream {self.stream!r}: retention must be workqueue,"
                    f" got {getattr(found.retention, 'value', found.retention)}"
                )
            if self.subject not in (found.subjects or []):
                raise QueueConfigError(
                    f"stream {self.stream!r}: subjects must include {self.subject!r},"
                    f" got {found.subjects}"
                )
        consumer = ConsumerConfig(
            durable_name=CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_ack_pending=-1,
            filter_subject=self.subject,
        )
        self._sub = await self.js.pull_subscribe(
            self.subject, durable=CONSUMER, stream=self.stream, config=consumer
        )

    async def publish(self, submission: Submission) -> None:
        """Put `submission` on the queue (durable on return; a repeat is dropped)."""
        await self.js.publish(
            self.subject,
            submission.to_bytes(),
            stream=self.stream,
            headers={"Nats-Msg-Id": submission.run_id},
        )

    async def fetch(self, batch: int, wait: float = 1.0) -> list[Any]:
        """Up to `batch` messages: waits at most `wait` s for the first, then takes what else
        is there at once ([] if nothing came). A pull of several from an empty queue would
        hold the first arrival until its expiry, so the first is pulled on its own."""
        if batch < 1:
            return []
        try:
            found = list(await self._sub.fetch(1, timeout=wait))
        except TimeoutError:  # nats.errors.TimeoutError is one
            return []
        if batch > 1:
            with contextlib.suppress(TimeoutError):
                found += await self._sub.fetch(batch - 1, timeout=DRAIN_WAIT)
        return found

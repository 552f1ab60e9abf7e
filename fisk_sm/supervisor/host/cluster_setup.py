"""Building a cluster member: a `Host` on one NATS connection, the session stream, the buckets,
owning its runs by lease (`LeaseOwnership`), taking them in from the work queue and expired
leases (`QueueIntake`), its approvals mirrored from the bucket (`ApprovalsMirror`, which its desk
uses) and its book showing every member's runs (`RemoteRuns`).

The session stream must exist (`fisk-sm session init-stream`, REFERENCE §3.6: it is bound to
and checked, never created here). The supervisors' own stream and buckets are created when
missing: the submissions work queue (`FISK_SM_SUBMISSIONS`), the lease bucket
(`fisk_sm_leases`) and the approvals bucket (`fisk_sm_approvals`), each with history 1 and no
TTL (a lease's expiry is in its value).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import attrs
from nats.errors import Error as NatsError
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.harness import SessionOptions
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.journal.jetstream_stream import connect_nats
from fisk_sm.loop.harness import RunOptions
from fisk_sm.supervisor.cluster.approvals import ApprovalsMirror
from fisk_sm.supervisor.cluster.lease import Leases, LeaseView
from fisk_sm.supervisor.cluster.workqueue import (
    DEFAULT_QUEUE_STREAM,
    DEFAULT_QUEUE_SUBJECT,
    WorkQueue,
)
from fisk_sm.supervisor.confine import ConfigDirs
from fisk_sm.supervisor.host.host import Host
from fisk_sm.supervisor.host.intake import QueueIntake
from fisk_sm.supervisor.host.leased import LeaseOwnership
from fisk_sm.supervisor.view.book import RunBook
from fisk_sm.supervisor.view.cluster_rows import RemoteRuns
from fisk_sm.supervisor.view.hub import EventHub

__all__ = ["ClusterSettings", "cluster"]

DEFAULT_SESSIONS_STREAM = SessionOptions().stream
DEFAULT_SESSIONS_PREFIX = SessionOptions().prefix
LEASE_BUCKET = "fisk_sm_leases"
APPROVAL_BUCKET = "fisk_sm_approvals"
#: A submission a supervisor took but did not start is offered again after twice the lease TTL.
MIN_ACK_WAIT = 5.0


@attrs.frozen
class ClusterSettings:
    """How one supervisor joins the others."""

    url: str
    owner: str
    lease_ttl: float = 10.0
    heartbeat: float = 2.0
    concurrency: int = 16
    sessions_stream: str = DEFAULT_SESSIONS_STREAM
    sessions_prefix: str = DEFAULT_SESSIONS_PREFIX
    queue_stream: str = DEFAULT_QUEUE_STREAM
    queue_subject: str = DEFAULT_QUEUE_SUBJECT
    lease_bucket: str = LEASE_BUCKET
    approval_bucket: str = APPROVAL_BUCKET
    timeout: float = 5.0

    def __attrs_post_init__(self) -> None:
        if not self.heartbeat < self.lease_ttl:
            raise ValueError(
                f"--heartbeat ({self.heartbeat:g}s) must be shorter than --lease-ttl"
                f" ({self.lease_ttl:g}s)"
            )


async def _bucket(js: object, name: str) -> KeyValue:
    try:
        kv: KeyValue = await js.key_value(name)  # type: ignore[attr-defined]
    except BucketNotFoundError:
        config = KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE)
        kv = await js.create_key_value(config)  # type: ignore[attr-defined]
    return kv


@contextlib.asynccontextmanager
async def cluster(
    config: AgentConfig,
    settings: ClusterSettings,
    options: RunOptions | None = None,
    config_dirs: ConfigDirs | None = None,
) -> AsyncIterator[Host]:
    """A started member's `Host` on one connection to `settings.url`, closed on exit (after
    its `shutdown`, which the caller does); its run configs confined to `config_dirs`."""
    nc = await connect_nats(settings.url, settings.timeout)
    try:
        store = await JetStreamStore.connect(
            settings.url,
            stream=settings.sessions_stream,
            prefix=settings.sessions_prefix,
            nc=nc,
            seconds=settings.timeout,
        )
        js = nc.jetstream(timeout=settings.timeout)
        lease_kv = await _bucket(js, settings.lease_bucket)
        leases = Leases(lease_kv, settings.owner, settings.lease_ttl)
        mirror = ApprovalsMirror(await _bucket(js, settings.approval_bucket), settings.owner)
        ack_wait = max(2 * settings.lease_ttl, MIN_ACK_WAIT)
        queue = WorkQueue(js, settings.queue_stream, settings.queue_subject, ack_wait=ack_wait)
        remote = RemoteRuns(store, LeaseView(lease_kv), config, mirror)
        book = RunBook(EventHub(), store, remote)
        ownership = LeaseOwnership(leases, store, mirror, book, remote)
        host = Host(
            config,
            store,
            concurrency=settings.concurrency,
            options=options,
            config_dirs=config_dirs,  # a takeover loads configs too
            ownership=ownership,
            intake=QueueIntake(queue, ownership, settings.heartbeat),
            book=book,
        )
        await host.start()
        yield host
    finally:
        # A connection that broke with data unsent fails its close: it is gone all the same,
        # and what ended the block (if anything) is the error to see.
        with contextlib.suppress(NatsError, OSError):
            await nc.close()

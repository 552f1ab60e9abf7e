"""The lease rules, against one real nats-server: acquire, renew, expire, hold, end, and losing
to a concurrent writer (every change is a compare-and-swap on the key's revision).

These rules were held only by the 150 s cluster tests (tests/test_distributed.py); here each has
a test of its own that runs in well under a second.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import nats
import natskit
import pytest
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from fisk_sm.supervisor.cluster.lease import (
    PARKED,
    RELEASED,
    LeaseLost,
    Leases,
    LeaseValue,
    LeaseView,
)

_buckets = itertools.count()


@pytest.fixture(scope="module")
def module_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One nats-server for the module; each test gets a bucket of its own."""
    with natskit.nats_server(tmp_path_factory.mktemp("nats")) as url:
        yield url


@pytest.fixture
async def kv(module_nats: str) -> AsyncIterator[KeyValue]:
    client = await nats.connect(module_nats)
    js = client.jetstream()
    bucket = f"leases_{next(_buckets)}"
    config = KeyValueConfig(bucket=bucket, history=1, storage=StorageType.MEMORY)
    yield await js.create_key_value(config=config)
    await js.delete_key_value(bucket)
    await client.close()


async def test_acquire_creates_the_key_and_a_second_owner_is_refused(kv: KeyValue) -> None:
    a, b = Leases(kv, "sup-a", ttl=30), Leases(kv, "sup-b", ttl=30)
    lease = await a.acquire("run-1", name="nightly", config="/etc/agent.yaml")
    assert lease is not None and lease.previous is None
    assert await b.acquire("run-1") is None
    value, revision = await b.read("run-1")
    assert value == lease.value and revision == lease.revision
    assert (value.owner, value.name, value.config) == ("sup-a", "nightly", "/etc/agent.yaml")


async def test_renew_extends_and_moves_the_revision(kv: KeyValue) -> None:
    leases = Leases(kv, "sup-a", ttl=30)
    lease = await leases.acquire("run-1", name="n")
    assert lease is not None
    renewed = await leases.renew(lease)
    assert renewed.revision > lease.revision
    assert renewed.value.expires >= lease.value.expires
    assert renewed.value.name == "n"  # the run's name and config ride along


async def test_an_expired_lease_is_taken_over_and_the_old_owner_learns_it(kv: KeyValue) -> None:
    a, b = Leases(kv, "sup-a", ttl=30), Leases(kv, "sup-b", ttl=30)
    lease = await a.acquire("run-1", name="n")
    assert lease is not None
    # sup-a stalled: its lease expired (written as such, rather than waiting for the clock).
    stale = LeaseValue("sup-a", expires=1.0, name="n")
    revision = await kv.update("run-1", stale.to_bytes(), last=lease.revision)
    taken = await b.acquire("run-1")
    assert taken is not None and taken.value.owner == "sup-b"
    assert taken.previous == stale and taken.value.name == "n"
    with pytest.raises(LeaseLost):
        await a.renew(lease.__class__(lease.run_id, revision, stale))


async def test_a_live_lease_is_not_taken(kv: KeyValue) -> None:
    a, b = Leases(kv, "sup-a", ttl=30), Leases(kv, "sup-b", ttl=30)
    assert await a.acquire("run-1") is not None
    assert await b.acquire("run-1") is None


async def test_of_two_concurrent_takeovers_exactly_one_wins(kv: KeyValue) -> None:
    dead = LeaseValue("sup-dead", expires=1.0)
    await kv.create("run-1", dead.to_bytes())
    contenders = [Leases(kv, f"sup-{n}", ttl=30) for n in range(8)]
    won = await asyncio.gather(*(c.acquire("run-1") for c in contenders))
    winners = [lease for lease in won if lease is not None]
    assert len(winners) == 1
    value, _ = await contenders[0].read("run-1")
    assert value is not None and value.owner == winners[0].value.owner


async def test_renew_after_a_concurrent_write_is_lost(kv: KeyValue) -> None:
    leases = Leases(kv, "sup-a", ttl=30)
    lease = await leases.acquire("run-1")
    assert lease is not None
    await kv.put("run-1", LeaseValue("sup-b", expires=10**10).to_bytes())
    with pytest.raises(LeaseLost):
        await leases.renew(lease)
    with pytest.raises(LeaseLost):
        await leases.hold(lease, RELEASED)


async def test_holds_say_who_may_take_the_run(kv: KeyValue) -> None:
    a, b = Leases(kv, "sup-a", ttl=30), Leases(kv, "sup-b", ttl=30)
    lease = await a.acquire("run-1")
    assert lease is not None
    await a.hold(lease, PARKED)
    # A parked run waits for its approval: a takeover does not break it...
    assert await b.acquire("run-1") is None
    # ...but whoever answers the approval takes it.
    answered = await b.acquire("run-1", breaking=frozenset({PARKED}))
    assert answered is not None and answered.previous is not None
    assert answered.previous.hold == PARKED
    await b.hold(answered, RELEASED)
    # A released run (a clean shutdown) is free for anyone at once.
    assert await a.acquire("run-1") is not None


async def test_end_removes_only_our_own_key(kv: KeyValue) -> None:
    a = Leases(kv, "sup-a", ttl=30)
    lease = await a.acquire("run-1")
    assert lease is not None
    stale = await a.renew(lease)
    await a.end(lease)  # an old revision: not ours any more, nothing removed
    assert (await a.read("run-1"))[0] is not None
    await a.end(stale)
    assert await a.read("run-1") == (None, 0)


async def test_a_malformed_value_counts_as_free(kv: KeyValue) -> None:
    await kv.create("run-1", b"{not json")
    lease = await Leases(kv, "sup-a", ttl=30).acquire("run-1")
    assert lease is not None and lease.value.owner == "sup-a"


def test_a_non_positive_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="TTL must be positive"):
        Leases(None, "sup-a", ttl=0)  # type: ignore[arg-type]


async def test_the_view_mirrors_owners_and_takeable_runs(kv: KeyValue) -> None:
    view = LeaseView(kv)
    await kv.create("old", LeaseValue("sup-dead", expires=1.0).to_bytes())
    await view.start()
    try:
        live = await Leases(kv, "sup-a", ttl=30).acquire("live")
        assert live is not None
        released = await Leases(kv, "sup-b", ttl=30).acquire("released")
        assert released is not None
        await Leases(kv, "sup-b", ttl=30).hold(released, RELEASED)
        await _until(lambda: {"live", "released"} <= view.leases.keys())
        await _until(lambda: view.leases["released"].hold == RELEASED)
        assert view.owner("live") == "sup-a"
        assert view.owner("old") == ""  # expired
        # oldest expiry first: a release writes expiry 0, the dead owner's lease expired at 1
        assert view.takeable() == ["released", "old"]
        await kv.delete("live")
        await _until(lambda: "live" not in view.leases)
    finally:
        await view.stop()


async def _until(condition: object, limit: float = 10.0) -> None:
    """Wait for `condition()` to hold (the watcher delivers asynchronously)."""
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        assert loop.time() < deadline, "the view did not catch up"
        await asyncio.sleep(0.01)

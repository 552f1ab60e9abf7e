"""JetStream KV memory against a real loopback nats-server: read-before-update compare-and-swap
(REFERENCE §6, §9 scenario 33, subtlety 20), the file store's limits, bucket validation, and
whole runs through the real SDK and the fake Messages API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import natskit
import pytest
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from fisk_sm import ConfigError, Recorder, Run, parse_config
from fisk_sm.events import WarningRaised
from fisk_sm.loop.harness import Harness, NoModel, RunOptions, memory_store
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import ToolBox
from fisk_sm.tools.memory import MAX_CONTENT_BYTES, MAX_ENTRIES, render_entry
from fisk_sm.tools.memory_kv import KVMemoryStore
from fisk_sm.tools.memory_tools import memory_tools

BUCKET = "mem"


@pytest.fixture
async def kv(nc: Client) -> KeyValue:
    """The memory bucket, made as an operator would: one value per key, no TTL."""
    return await nc.jetstream().create_key_value(KeyValueConfig(bucket=BUCKET, history=1))


@pytest.fixture
async def stores(nats_url: str, kv: KeyValue) -> AsyncIterator[list[KVMemoryStore]]:
    """Stores made with `make(...)`; all closed at teardown."""
    made: list[KVMemoryStore] = []
    yield made
    for store in made:
        await store.aclose()


class Tools:
    """The memory tools over one store: one run's view of the bucket."""

    def __init__(self, store: KVMemoryStore) -> None:
        self.store = store
        self.box = ToolBox.of(memory_tools(store))

    async def raw(self, name: str, **arguments: Any) -> tuple[bool, str]:
        assert self.box.rejection(name, arguments) is None
        outcome = await self.box.invoke(name, arguments)
        return outcome.is_error, outcome.content

    async def __call__(self, name: str, **arguments: Any) -> Any:
        is_error, content = await self.raw(name, **arguments)
        assert not is_error, content
        return json.loads(content)

    async def write(self, key: str, content: str, *, overwrite: bool = False) -> Any:
        return await self(
            "memory_write",
            key=key,
            description=f"d {content}",
            content=content,
            overwrite=overwrite,
        )


@pytest.fixture
def run_tools(nats_url: str, stores: list[KVMemoryStore]) -> Any:
    def make(identity: str = "agent", *, require_read: bool = True) -> Tools:
        store = KVMemoryStore(nats_url, BUCKET, identity, require_read=require_read)
        stores.append(store)
        return Tools(store)

    return make


async def value(kv: KeyValue, key: str) -> bytes | None:
    entry = await kv.get(key)
    return entry.value


def stale(result: Any) -> bool:
    return result["written"] is False and "read it first" in result["reason"]


async def test_scenario_33_overwrite_needs_a_read_create_grants_it_and_delete_revokes_it(
    run_tools: Any, kv: KeyValue
) -> None:
    first, second = run_tools(), run_tools()
    assert await first.write("k", "one") == {"written": True}
    # Just after its create, the creator may overwrite without reading (compare-and-swap).
    assert await first.write("k", "two", overwrite=True) == {"written": True}
    assert await value(kv, "agent.k") == render_entry("k", "d two", "two")
    # Another run has not read it: its overwrite is stale and changes nothing.
    assert stale(await second.write("k", "blind", overwrite=True))
    assert await value(kv, "agent.k") == render_entry("k", "d two", "two")
    # Listing is not reading.
    assert (await second("memory_list"))["memories"] == [{"key": "k", "description": "d two"}]
    assert stale(await second.write("k", "listed", overwrite=True))
    # A read grants it.
    assert (await second("memory_read", key="k"))["content"] == "two"
    assert await second.write("k", "three", overwrite=True) == {"written": True}
    # The first run's revision is now behind: stale, and forgotten (a second try is stale too).
    changed = await first.write("k", "four", overwrite=True)
    assert stale(changed) and "changed since" in changed["reason"]
    again = await first.write("k", "four", overwrite=True)
    assert stale(again) and "was not read" in again["reason"]
    assert await value(kv, "agent.k") == render_entry("k", "d three", "three")
    # After a delete and a re-create elsewhere, an old read no longer counts.
    assert (await first("memory_read", key="k"))["found"] is True
    assert await second("memory_delete", key="k") == {"deleted": True}
    assert await second("memory_delete", key="k") == {"deleted": False}
    assert await second.write("k", "reborn") == {"written": True}
    assert stale(await first.write("k", "five", overwrite=True))
    assert (await first("memory_read", key="k"))["content"] == "reborn"
    assert await first.write("k", "five", overwrite=True) == {"written": True}
    # Its own delete revokes it too: re-created by someone else, the key needs a read again.
    assert await first("memory_delete", key="k") == {"deleted": True}
    assert await second.write("k", "six") == {"written": True}
    revoked = await first.write("k", "seven", overwrite=True)
    assert stale(revoked) and "was not read" in revoked["reason"]
    assert await value(kv, "agent.k") == render_entry("k", "d six", "six")


async def test_a_refused_create_reads_the_key_which_grants_the_overwrite(run_tools: Any) -> None:
    first, second = run_tools(), run_tools()
    assert await first.write("user.name", "Ada") == {"written": True}
    refused = await second.write("user.name", "Bob")
    assert refused["written"] is False and "d Ada" in refused["reason"]
    assert await second.write("user.name", "Bob", overwrite=True) == {"written": True}
    assert (await first("memory_read", key="user.name"))["content"] == "Bob"


async def test_no_require_read_before_update_writes_blindly(run_tools: Any, kv: KeyValue) -> None:
    guarded, blind = run_tools(), run_tools(require_read=False)
    assert await guarded.write("k", "one") == {"written": True}
    assert await blind.write("k", "two", overwrite=True) == {"written": True}
    assert await blind.write("new", "made", overwrite=True) == {"written": True}  # also creates
    assert await value(kv, "agent.k") == render_entry("k", "d two", "two")
    assert (await blind("memory_read", key="new"))["content"] == "made"
    assert stale(await guarded.write("k", "three", overwrite=True))


async def test_identities_have_their_own_keys_and_reads_miss_normally(
    run_tools: Any, kv: KeyValue
) -> None:
    ada, bob = run_tools("ada"), run_tools("bob")
    await ada.write("k", "ada's")
    assert await bob("memory_list") == {"memories": []}
    missed = await bob("memory_read", key="k")
    assert missed["found"] is False and "'k'" in missed["reason"]
    assert await bob.write("k", "bob's") == {"written": True}
    assert await value(kv, "ada.k") == render_entry("k", "d ada's", "ada's")
    assert await value(kv, "bob.k") == render_entry("k", "d bob's", "bob's")


async def test_the_file_stores_limits_hold(run_tools: Any, kv: KeyValue) -> None:
    tools = run_tools()
    for key in ("", "a..b", ".a", "a/b", "x" * 201):
        is_error, text = await tools.raw("memory_read", key=key)
        assert is_error and "invalid memory key" in text, key
    is_error, text = await tools.raw(
        "memory_write", key="big", description="d", content="x" * (MAX_CONTENT_BYTES + 1)
    )
    assert is_error and "at most 65536" in text
    is_error, text = await tools.raw("memory_write", key="k", description=" \n", content="c")
    assert is_error and "must not be empty" in text
    long = "line one\nline two " + "é" * 600
    assert await tools("memory_write", key="flat", description=long, content="c") == {
        "written": True
    }
    flat = (await tools("memory_read", key="flat"))["description"]
    assert flat.startswith("line one line two é") and len(flat) == 500
    # The cap counts this identity's live keys and is checked before the key-exists check.
    for i in range(MAX_ENTRIES - 1):
        await kv.put(f"agent.seed{i}", render_entry(f"seed{i}", "seed", ""))
    await kv.put("other.extra", render_entry("extra", "another identity's", ""))
    is_error, text = await tools.raw("memory_write", key="one-more", description="d", content="")
    assert is_error and f"already holds {MAX_ENTRIES}" in text
    is_error, text = await tools.raw("memory_write", key="flat", description="d", content="")
    assert is_error and f"already holds {MAX_ENTRIES}" in text
    assert await tools("memory_delete", key="seed0") == {"deleted": True}
    assert await tools.write("one-more", "fits") == {"written": True}
    assert len((await tools("memory_list"))["memories"]) == MAX_ENTRIES


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"history": 5}, ["history must be 1, got 5"]),
        ({"ttl": 60}, ["ttl must be none (memories must not expire), got 60s"]),
        ({"history": 2, "ttl": 5}, ["history must be 1, got 2", "ttl must be none"]),
        ({"max_value_size": 1024}, ["max_value_size must be at least 73728, got 1024"]),
    ],
)
async def test_a_misconfigured_bucket_is_refused_naming_each_setting(
    nats_url: str, nc: Client, settings: dict[str, Any], named: list[str]
) -> None:
    config = KeyValueConfig(bucket="bad", **{"history": 1, **settings})
    await nc.jetstream().create_key_value(config)
    store = KVMemoryStore(nats_url, "bad", "agent")
    is_error, text = await Tools(store).raw("memory_list")
    assert is_error and text.startswith("memory bucket 'bad': ")
    for setting in named:
        assert setting in text
    assert store._nc is None  # the connection of a refused bind is closed


async def test_a_missing_bucket_or_server_is_an_error_naming_it(nats_url: str, nc: Client) -> None:
    is_error, text = await Tools(KVMemoryStore(nats_url, "nope", "agent")).raw("memory_list")
    assert is_error and "memory bucket 'nope' does not exist" in text
    port = natskit.free_port()
    dead = KVMemoryStore(f"nats://127.0.0.1:{port}", BUCKET, "agent")
    is_error, text = await Tools(dead).raw("memory_read", key="k")
    assert is_error and f"cannot reach the NATS server at nats://127.0.0.1:{port}" in text


def agent_config(api: FakeMessagesAPI, nats_url: str, **options: Any) -> Any:
    memory = {"enabled": True, "backend": "jetstream", "options": {"url": nats_url, **options}}
    data = {"system_prompt": "sys", "llm": {"model": "m", "base_url": api.base_url}}
    return parse_config({**data, "harness": {"memory": memory}}, env={})


def result_of(api: FakeMessagesAPI, request: int) -> Any:
    return json.loads(api.requests[request]["messages"][-1]["content"][0]["content"])


async def test_whole_runs_store_index_and_guard_memories(
    api: FakeMessagesAPI, nats_url: str, kv: KeyValue
) -> None:
    config = agent_config(api, nats_url, bucket=BUCKET)
    write = {"key": "user.name", "description": "the user's name", "content": "Ada"}
    api.add(
        Reply.tool_use("memory_write", write),
        Reply.tool_use("memory_write", {**write, "content": "Ada L.", "overwrite": True}),
        Reply.text("remembered"),
    )
    first = Run.create(config, "remember", RunOptions())
    async with first:
        assert await first.run() == "completed"
    assert result_of(api, 1) == {"written": True}
    assert result_of(api, 2) == {"written": True}
    assert await value(kv, "fisk-sm.user.name") == render_entry(
        "user.name", "the user's name", "Ada L."
    )
    assert first.harness.memory is not None and first.harness.memory._nc is None  # closed
    api.add(
        Reply.tool_use("memory_write", {**write, "content": "Bob", "overwrite": True}),
        Reply.tool_use("memory_read", {"key": "user.name"}),
        Reply.tool_use("memory_write", {**write, "content": "Bob", "overwrite": True}),
        Reply.text("updated"),
    )
    async with Run.create(config, "update", RunOptions()) as second:
        assert await second.run() == "completed"
    index = api.requests[3]["system"][-1]["text"]
    assert "<memory-index>\n- user.name: the user's name\n</memory-index>" in index
    assert stale(result_of(api, 4))
    assert result_of(api, 5)["content"] == "Ada L."
    assert result_of(api, 6) == {"written": True}
    assert await value(kv, "fisk-sm.user.name") == render_entry(
        "user.name", "the user's name", "Bob"
    )


async def test_a_run_with_a_missing_bucket_warns_and_each_memory_tool_says_why(
    api: FakeMessagesAPI, nats_url: str, kv: KeyValue
) -> None:
    api.add(Reply.tool_use("memory_list", {}), Reply.text("no memory"))
    events = Recorder()
    config = agent_config(api, nats_url, bucket="missing")
    async with Run.create(config, "go", RunOptions(events=events)) as run:
        assert await run.run() == "completed"
    warnings = [e for e in events.events if isinstance(e, WarningRaised)]
    assert [w.warning for w in warnings] == ["memory_index"]
    assert "memory bucket 'missing' does not exist" in warnings[0].detail
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True and "'missing' does not exist" in result["content"]
    assert "<memory-index>" not in json.dumps(api.requests[0]["system"])


async def test_building_a_harness_connects_to_nothing(api: FakeMessagesAPI) -> None:
    port = natskit.free_port()
    config = agent_config(api, f"nats://127.0.0.1:{port}")
    harness = Harness.build(config, RunOptions(model=NoModel()))
    assert "memory_write" in harness.tools.tools and harness.index_pending
    store = harness.memory
    assert isinstance(store, KVMemoryStore) and store._nc is None
    assert store.bucket == "fisk_sm_memory" and store.require_read
    await harness.aclose()


def test_the_jetstream_options_are_checked_and_defaulted(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"llm": {"model": "m"}}

    def memory(**options: Any) -> Any:
        harness = {"memory": {"enabled": True, "backend": "jetstream", "options": options}}
        return parse_config({**base, "harness": harness}, env={})

    with pytest.raises(ConfigError, match=r"harness\.memory\.options\.bucket: must be a KV bucket"):
        memory(bucket="a.b")
    with pytest.raises(ConfigError, match=r"harness\.memory\.options\.url: must be a NATS URL"):
        memory(url="127.0.0.1:4222")
    with pytest.raises(ConfigError, match=r"harness\.memory\.backend: must be 'file' or 'jet"):
        parse_config({**base, "harness": {"memory": {"backend": "redis"}}}, env={})
    monkeypatch.setenv("NATS_URL", "nats://10.0.0.1:4222")
    store = memory_store(memory(no_require_read_before_update=True))
    assert isinstance(store, KVMemoryStore)
    assert (store.url, store.bucket, store.identity) == (
        "nats://10.0.0.1:4222",
        "fisk_sm_memory",
        "fisk-sm",
    )
    assert store.require_read is False
    monkeypatch.delenv("NATS_URL")
    assert memory_store(memory()).url == "nats://127.0.0.1:4222"  # type: ignore[union-attr]

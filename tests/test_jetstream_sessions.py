"""JetStream sessions (REFERENCE §3.6, §9 #37) on a real loopback nats-server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import nats
import natskit
import pytest
from conftest import make_config
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError

from fisk_sm import tool
from fisk_sm.journal.filestore import (
    FileStore,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
)
from fisk_sm.journal.fold import fold
from fisk_sm.journal.jetstream import (
    JetStreamConfigError,
    JetStreamIOError,
    JetStreamJournal,
    JetStreamStore,
)
from fisk_sm.journal.jetstream_stream import NEEDS_NATS, init_stream
from fisk_sm.journal.records import (
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    encode,
)
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.path import session_path
from fisk_sm.testing import FakeMessagesAPI, Reply

STREAM, PREFIX = "RUNS", "fisk.sessions"


@pytest.fixture
async def store(nats_url: str) -> AsyncIterator[JetStreamStore]:
    assert await init_stream(nats_url, stream=STREAM, prefix=PREFIX)
    connected = await JetStreamStore.connect(nats_url, stream=STREAM, prefix=PREFIX)
    yield connected
    await connected.close()


def meta(run_id: str = "r1") -> Meta:
    return Meta(1, 1, run_id, "2026-01-01T00:00:00Z", {"model": "m"}, "go")


def user(seq: int, text: str = "more") -> User:
    return User(seq, {"role": "user", "content": text})


async def raw_messages(url: str, subject: str) -> list[tuple[str, bytes, str]]:
    """Every message of the stream on `subject` (a filter): subject, body, msg id."""
    nc = await nats.connect(url)
    try:
        js, found, seq = nc.jetstream(), [], 0
        while True:
            try:
                msg = await js.get_msg(STREAM, seq=seq + 1, subject=subject, next=True)
            except APIError:
                return found
            found.append((msg.subject or "", msg.data or b"", (msg.headers or {})["Nats-Msg-Id"]))
            seq = msg.seq or 0
    finally:
        await nc.close()


# --- the stream's settings ------------------------------------------------------------------

GOOD: dict[str, Any] = {
    "subjects": [f"{PREFIX}.>"],
    "max_msgs_per_subject": 1,
    "discard": DiscardPolicy.NEW,
    "discard_new_per_subject": True,
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"subjects": [f"{PREFIX}.>", "other.>"]}, "subjects must be ['fisk.sessions.>']"),
        ({"subjects": ["elsewhere.>"]}, "subjects must be ['fisk.sessions.>'], got"),
        (
            {"max_msgs_per_subject": -1, "discard_new_per_subject": False},
            "max_msgs_per_subject must be 1, got -1",
        ),
        (
            {"discard": DiscardPolicy.OLD, "discard_new_per_subject": False},
            "discard must be 'new', got 'old'",
        ),
        ({"discard_new_per_subject": False}, "discard_new_per_subject must be true, got False"),
        ({"max_age": 3600.0}, "max_age must be unset (0), got 3600s"),
        ({"max_msg_size": 1024}, "max_msg_size must be unlimited (-1) or >= 4096, got 1024"),
    ],
)
async def test_each_wrong_stream_setting_is_refused_by_name(
    nats_url: str, change: dict[str, Any], named: str
) -> None:
    nc = await nats.connect(nats_url)
    await nc.jetstream().add_stream(StreamConfig(name=STREAM, **{**GOOD, **change}))
    with pytest.raises(JetStreamConfigError) as caught:
        await JetStreamStore.connect(nats_url, stream=STREAM, prefix=PREFIX, nc=nc)
    assert f"stream '{STREAM}': {named}" in str(caught.value)
    assert "\n" not in str(caught.value)
    await nc.close()


async def test_the_stream_init_makes_is_accepted_and_a_large_msg_size_too(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    big = {**GOOD, "subjects": ["big.>"], "max_msg_size": 4096}
    await nc.jetstream().add_stream(StreamConfig(name="BIG", **big))
    bound = await JetStreamStore.connect(nats_url, stream="BIG", prefix="big", nc=nc)
    assert bound.stream == "BIG"
    await nc.close()
    assert await init_stream(nats_url, stream=STREAM, prefix=PREFIX) is True
    assert await init_stream(nats_url, stream=STREAM, prefix=PREFIX) is False  # kept, checked
    with pytest.raises(JetStreamConfigError, match="subjects must be"):
        await init_stream(nats_url, stream=STREAM, prefix="another")
    with pytest.raises(JetStreamConfigError, match="subjects overlap"):
        await init_stream(nats_url, stream="OTHER", prefix=PREFIX)


async def test_a_missing_stream_or_server_is_one_line_naming_it(nats_url: str) -> None:
    with pytest.raises(JetStreamConfigError) as caught:
        await JetStreamStore.connect(nats_url, stream="NOPE", prefix=PREFIX)
    assert str(caught.value).startswith(f"stream 'NOPE' not found on {nats_url}")
    dead = f"nats://127.0.0.1:{natskit.free_port()}"
    with pytest.raises(JetStreamIOError, match=f"cannot reach the NATS server at {dead}"):
        await JetStreamStore.connect(dead, stream=STREAM, prefix=PREFIX, seconds=1)


async def test_without_nats_py_the_backend_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "nats", None)  # `import nats` now raises ImportError
    with pytest.raises(JetStreamConfigError) as caught:
        await JetStreamStore.connect("nats://127.0.0.1:1", stream=STREAM, prefix=PREFIX)
    assert str(caught.value) == NEEDS_NATS


# --- records as messages --------------------------------------------------------------------


async def test_each_record_is_one_write_once_message_whose_body_is_its_file_line(
    store: JetStreamStore,
) -> None:
    journal = await store.create_async(meta())
    records: list[Record] = [meta(), user(2), Terminal(3, "suspended")]
    for record in records[1:]:
        await journal.append(record)
    await journal.append(user(2))  # an already-written seq: a no-op
    stored = await raw_messages(store.url, f"{PREFIX}.r1.>")
    assert [(s, b) for s, b, _ in stored] == [
        (f"{PREFIX}.r1._meta", encode(records[0]).encode()),
        (f"{PREFIX}.r1.2", encode(records[1]).encode()),
        (f"{PREFIX}.r1.3", encode(records[2]).encode()),
    ]
    assert [i for _, _, i in stored] == [journal.msg_id(s) for s in (1, 2, 3)]
    assert await store.load_async("r1") == records
    nc = await nats.connect(store.url)
    with pytest.raises(APIError, match="maximum messages per subject"):
        await nc.jetstream().publish(f"{PREFIX}.r1.2", b"rewritten")
    await nc.close()
    assert await store.load_async("r1") == records  # the record was written once
    with pytest.raises(SessionExistsError, match="session 'r1' already exists"):
        await store.create_async(meta())


async def test_a_lost_ack_is_adopted_by_msg_id_not_duplicated(store: JetStreamStore) -> None:
    journal = await store.create_async(meta())
    record = user(2)
    # The publish reaches the stream but its ack never comes back: the same message, sent
    # without asking for an ack, exactly as the journal sends it.
    nc = await nats.connect(store.url)
    await nc.publish(
        store.subject("r1", 2),
        encode(record).encode(),
        headers={"Nats-Msg-Id": journal.msg_id(2)},
    )
    await nc.flush()
    await nc.close()
    assert len(await raw_messages(store.url, f"{PREFIX}.r1.>")) == 2  # it is in the stream
    await journal.append(record)  # the retry: adopted
    assert journal.last_seq == 2
    await journal.append(user(3))  # and the fence moved past it
    assert await store.load_async("r1") == [meta(), record, user(3)]
    assert len(await raw_messages(store.url, f"{PREFIX}.r1.>")) == 3


async def test_a_second_writer_is_fenced_out(store: JetStreamStore) -> None:
    first = await store.create_async(meta())
    second = await store.open_async("r1")  # opening takes no lock
    await second.append(user(2, "second"))
    with pytest.raises(SessionLockedError) as caught:
        await first.append(user(2, "first"))
    assert str(caught.value) == (
        "session 'r1': another writer appended seq 2; this writer is fenced out"
    )
    with pytest.raises(SessionLockedError):  # for good: even a seq nobody wrote yet
        await first.append(user(2, "first"))
    await second.append(user(3, "second"))
    assert await store.load_async("r1") == [meta(), user(2, "second"), user(3, "second")]


async def test_a_writer_cannot_append_into_a_deleted_and_recreated_session(
    store: JetStreamStore,
) -> None:
    old = await store.create_async(meta())
    await old.append(user(2, "old"))
    await store.delete_async("r1")
    new = await store.create_async(meta())  # someone else's session under the same id
    with pytest.raises(SessionLockedError):
        await old.append(user(3, "old"))  # its subject is free, its fence is not
    await new.append(user(2, "new"))
    assert await store.load_async("r1") == [meta(), user(2, "new")]


async def test_delete_is_idempotent_and_listing_reads_every_session(
    store: JetStreamStore,
) -> None:
    for run_id in ("a1", "b2"):
        journal = await store.create_async(meta(run_id))
        await journal.append(Terminal(2, "completed"))
    await (await store.create_async(meta("c3"))).append(user(2))
    listed = {info.run_id: info for info in await store.list_async()}
    assert {k: (v.status, v.model, v.records) for k, v in listed.items()} == {
        "a1": ("completed", "m", 2),
        "b2": ("completed", "m", 2),
        "c3": ("open", "m", 2),
    }
    assert next(i.run_id for i in await store.list_async()) == "c3"  # newest first
    await store.delete_async("a1")
    await store.delete_async("a1")
    with pytest.raises(SessionNotFoundError, match="session 'a1' not found"):
        await store.load_async("a1")
    await store.fork_async("c3", 1, "d4")
    assert await store.load_async("d4") == [attrs.evolve(meta(), run_id="d4")]
    assert sorted(i.run_id for i in await store.list_async()) == ["b2", "c3", "d4"]


# --- whole sessions: resume, takeover -------------------------------------------------------

calls: list[str] = []


@tool
def note(text: str) -> str:
    """Note something down."""
    calls.append(text)
    return f"noted {text}"


async def scripted_session(api: FakeMessagesAPI, store: Any) -> list[Record]:
    """A tool turn, suspended at the next boundary, then resumed to the end."""
    config = make_config(api)
    api.add(Reply.tool_use("note", {"text": "x"}, id="toolu_1"), Reply.text("final"))
    polls = iter([False, True])
    options = RunOptions(tools=[note], should_suspend=lambda: next(polls))
    run = await start_session(config, "go", store, options, run_id="s1")
    assert await run.run() == "suspended"
    await run.aclose()
    resumed = await resume_session(config, "s1", store, RunOptions(tools=[note]))
    assert await resumed.run() == "completed"
    await resumed.aclose()
    if isinstance(store, FileStore):
        return store.load("s1")
    loaded: list[Record] = await store.load_async("s1")
    return loaded


def _timeless(records: list[Record]) -> list[Record]:
    """The records with their clock values blanked: the creation time, the measured timings."""
    clocks: dict[str, object] = {"created": "", "latency_ms": None, "duration_ms": None}
    return [
        attrs.evolve(r, **{k: v for k, v in clocks.items() if k in attrs.fields_dict(type(r))})
        for r in records
    ]


async def test_resume_from_jetstream_folds_the_same_records_as_from_a_file(
    api: FakeMessagesAPI, store: JetStreamStore, tmp_path: Path
) -> None:
    from_file = await scripted_session(api, FileStore(tmp_path / "runs"))
    from_stream = await scripted_session(api, store)
    assert _timeless(from_stream) == _timeless(from_file)
    assert [type(r).__name__ for r in from_stream][-2:] == ["Assistant", "Terminal"]
    assert attrs.evolve(fold(from_stream), created="") == attrs.evolve(fold(from_file), created="")
    assert fold(from_stream).completed and fold(from_stream).llm_calls == 2
    assert session_path(from_stream).states == session_path(from_file).states


async def test_a_takeover_fences_the_old_owner_out_and_the_run_resumes(
    api: FakeMessagesAPI, store: JetStreamStore
) -> None:
    calls.clear()
    config = make_config(api)
    api.add(Reply.text("final"))  # the tool turn below is journaled by hand
    run = await start_session(config, "go", store, RunOptions(tools=[note]), run_id="t1")
    old: Any = run.harness.journal
    assert isinstance(old, JetStreamJournal)
    # The old owner journals the model's turn, then loses its lease.
    turn = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "note", "input": {"text": "x"}}
    ]}  # fmt: skip
    await old.append(Assistant(2, 1, turn, "tool_use"))
    message = "taken over by sup-b: the lease of sup-a expired"
    assert await store.take_over_async("t1", message) == 3
    result = ToolResult(
        3, "toolu_1", {"type": "tool_result", "tool_use_id": "toolu_1", "content": "noted x"}
    )
    with pytest.raises(SessionLockedError, match="another writer appended seq 3"):
        await old.append(result)
    await run.aclose()
    records = await store.load_async("t1")
    assert records[-1] == Terminal(3, "suspended", message)
    resumed = await resume_session(config, "t1", store, RunOptions(tools=[note]))
    assert await resumed.run() == "completed"
    await resumed.aclose()
    final = await store.load_async("t1")
    assert [r.seq for r in final] == list(range(1, len(final) + 1))
    assert final[:3] == records and calls == ["x"]  # single-owner: nothing of the old owner's
    assert fold(final).completed


TURN = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "note", "input": {"text": "x"}}
]}  # fmt: skip


def test_the_path_of_a_run_taken_over_mid_batch_shows_the_resume() -> None:
    records: list[Record] = [
        meta("t1"),
        Assistant(2, 1, TURN, "tool_use"),
        Terminal(3, "suspended", "taken over by sup-b: the lease of sup-a expired"),
        ToolResult(
            4, "toolu_1", {"type": "tool_result", "tool_use_id": "toolu_1", "content": "noted x"}
        ),
        Assistant(
            5, 2, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, "end_turn"
        ),
        Terminal(6, "completed"),
    ]
    assert fold(records).completed
    path = session_path(records)
    assert path.edges[2:5] == (  # taken over after the turn was journaled, before its tool
        ("journal", "journaled", "decide"),
        ("decide", "taken_over", "suspended"),
        ("suspended", "resume", "decide"),
    )
    assert path.states[-1] == "completed"
    # the intent of the tool that was running when the old owner lost the run
    started = [*records[:2], ToolStarted(3, "toolu_1", "note")]
    cut = [*started, *(attrs.evolve(r, seq=r.seq + 1) for r in records[2:])]
    assert session_path(cut).edges[6:8] == (  # taken over while the tool ran
        ("execute", "taken_over", "suspended"),
        ("suspended", "resume", "execute"),
    )
    assert fold(cut).completed


# --- the command line -----------------------------------------------------------------------

CLI = [sys.executable, "-m", "fisk_sm.cli"]


def fisk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ANTHROPIC_API_KEY": "test", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full, timeout=60)


def agent_yaml(tmp_path: Path, api: FakeMessagesAPI, url: str, stream: str = STREAM) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "harness:\n"
        "  sessions:\n"
        "    backend: jetstream\n"
        f"    options: {{url: '{url}', stream: {stream}, prefix: {PREFIX}}}\n"
    )
    return path


async def test_run_and_session_commands_use_the_configured_stream(
    api: FakeMessagesAPI, store: JetStreamStore, tmp_path: Path
) -> None:
    agent = agent_yaml(tmp_path, api, store.url)
    api.add(Reply.text("done"))
    done = fisk("run", "-c", str(agent), "--checkpoint", "--name", "cli1", "hello")
    assert done.returncode == 0, done.stderr
    records = await store.load_async("cli1")
    assert isinstance(records[0], Meta) and records[0].prompt == "hello"
    assert fold(records).completed
    listed = fisk("session", "ls", "-c", str(agent))
    assert listed.returncode == 0 and "cli1" in listed.stdout and "completed" in listed.stdout
    shown = fisk("session", "show", "-c", str(agent), "cli1")
    assert shown.returncode == 0 and "status:         completed" in shown.stdout
    forked = fisk("session", "fork", "-c", str(agent), "cli1", "--at", "1", "--name", "cli2")
    assert forked.returncode == 0, forked.stderr
    assert len(await store.load_async("cli2")) == 1
    removed = fisk("session", "rm", "-c", str(agent), "cli1")
    assert removed.returncode == 0, removed.stderr
    with pytest.raises(SessionNotFoundError):
        await store.load_async("cli1")
    resumed = fisk("run", "-c", str(agent), "--resume", "cli1")
    assert resumed.returncode == 2 and "session 'cli1' not found" in resumed.stderr
    assert "Traceback" not in resumed.stderr and len(resumed.stderr.splitlines()) == 1


def test_a_missing_stream_exits_2_and_an_unreachable_server_74(
    api: FakeMessagesAPI, nats_url: str, tmp_path: Path
) -> None:
    missing = fisk("run", "-c", str(agent_yaml(tmp_path, api, nats_url)), "--checkpoint", "x")
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith(
        f"stream '{STREAM}' not found on {nats_url}:"
        " create it with `fisk-sm session init-stream -c agent.yaml`"
    )
    # what the error says to do works: the stream is made, with the settings the store checks
    made = fisk("session", "init-stream", "-c", str(agent_yaml(tmp_path, api, nats_url)))
    assert made.returncode == 0, made.stderr
    again = fisk("session", "init-stream", "-c", str(agent_yaml(tmp_path, api, nats_url)))
    assert again.returncode == 0 and "already exists with the right settings" in again.stderr
    api.add(Reply.text("made it"))
    ran = fisk("run", "-c", str(agent_yaml(tmp_path, api, nats_url)), "--checkpoint", "x")
    assert ran.returncode == 0 and ran.stdout.strip() == "made it", ran.stderr
    dead = f"nats://127.0.0.1:{natskit.free_port()}"
    agent = agent_yaml(tmp_path, api, dead)
    for args in (
        ["run", "-c", str(agent), "--checkpoint", "x"],
        ["session", "ls", "-c", str(agent)],
    ):
        failed = fisk(*args)
        assert failed.returncode == 74, failed.stderr
        assert f"cannot reach the NATS server at {dead}" in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1

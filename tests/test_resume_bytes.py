"""A resumed run sends the messages before its journal's checkpoint as the journal's own bytes
(fisk_sm/journal/wirebytes.py, `ModelRequest.body`): the request means what the decoded
conversation means, and neither the resume nor the request decodes those messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config
from test_resume_speed import FIXTURES, checkpointed, every_line, lines, note, resumed

from fisk_sm.events.types import Event, Recorder, RunResumed
from fisk_sm.journal import checkpoint, wirebytes
from fisk_sm.journal.checkpoint import checkpoint_path
from fisk_sm.journal.decode import decode
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Assistant, ToolResult, User, encode
from fisk_sm.journal.snapshot import Usage
from fisk_sm.journal.wirebytes import value_span
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.anthropic import ModelRequest
from fisk_sm.model.blocks import Message
from fisk_sm.model.transport import encode_json
from fisk_sm.testing import FakeMessagesAPI, Reply

SYSTEM = ({"type": "text", "text": "be brief"},)


def request(messages: list[Message]) -> ModelRequest:
    return ModelRequest("m", 64, messages, system=SYSTEM, cache_ttl="5m")


def decoded_body(messages: list[Message]) -> bytes:
    """The body as the SDK would encode the decoded conversation's `params()`."""
    return encode_json(request(messages).params())


class Loads:
    """Counts the journal lines and pieces `wirebytes` decodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count, real = 0, wirebytes._loads

        def counted(data: Any) -> Any:
            self.count += 1
            return real(data)

        monkeypatch.setattr(wirebytes, "_loads", counted)


def test_a_resumed_request_is_the_journals_bytes_and_decodes_only_its_last_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path = checkpointed(tmp_path, monkeypatch)
    expected = every_line(path).messages
    snapshot, records = resumed(store, "r")
    assert records.base is not None
    loads = Loads(monkeypatch)
    body = request(snapshot.messages).body()
    assert json.loads(body) == json.loads(decoded_body(expected))
    last = int(snapshot.messages[-1].raw() is not None)  # read for its cache breakpoint
    assert loads.count == last  # and no other
    journal, sent = path.read_bytes(), 0
    for message, wire in zip(snapshot.messages[:-1], expected, strict=False):
        pieces = message.raw()
        if pieces is None:  # the prompt, and the user messages merged from several records
            continue
        sent += 1
        assert all(bytes(p) in journal for p in pieces if isinstance(p, memoryview))
        assert b"".join(pieces) in body
        assert json.loads(b"".join(pieces)) == wire.to_json() == message.to_json()
    assert sent >= len(snapshot.messages) - 4
    assert loads.count == last + sent  # each decoded from its bytes, on demand, for `to_json`


def _grown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[bytes]) -> Path:
    """A journal of `chunks`, resumed once with a checkpoint over nearly all of it."""
    monkeypatch.setattr(checkpoint, "EVERY", 1)
    store = FileStore(tmp_path)
    store.ensure_directory()
    path = store.path("r")
    path.write_bytes(b"".join(chunks))
    resumed(store, "r")
    assert resumed(store, "r")[1].base is not None
    return path


@pytest.mark.parametrize(
    "shape", ["chat", *sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())]
)
def test_every_journal_shape_sends_what_its_decoded_conversation_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """The compatibility fixtures (an older build's journals: a lone surrogate among them,
    which goes out as U+FFFD) and the chat journal that meets every part of the fold."""
    if shape == "chat":
        from test_resume_speed import chat_records

        chunks = lines(chat_records())
    else:
        (source,) = (FIXTURES / shape / "sessions").glob("*.json")
        chunks = source.read_bytes().splitlines(keepends=True)
    path = _grown(tmp_path, monkeypatch, chunks)
    snapshot, _ = resumed(FileStore(tmp_path), "r")
    expected = every_line(path).messages
    assert json.loads(request(snapshot.messages).body()) == json.loads(decoded_body(expected))


def _line(record: Any) -> bytes:
    return (encode(record) + "\n").encode()


def _span(line: bytes, record: Any = None) -> bytes | None:
    start, end = value_span(line, 0, len(line) - 1, record or decode(line[:-1]))
    return line[start:end] if end else None


def test_a_span_is_the_value_the_record_holds_as_msgspec_writes_it_or_none() -> None:
    content = [{"type": "text", "text": 'say "message": é'}]
    line = _line(Assistant(2, 1, {"role": "assistant", "content": content}, "end_turn", Usage()))
    assert json.loads(_span(line) or b"") == content
    result = {"type": "tool_result", "tool_use_id": 'x"result":', "content": "ok"}
    line = _line(ToolResult(3, 'x"result":', result))
    assert json.loads(_span(line) or b"") == result
    # content before role, and keys of its own after it: still the content
    line = b'{"seq":2,"message":{"content":"hi","role":"user","x":[1]},"type":"user"}\n'
    assert _span(line) == b'"hi"'
    unread = [
        b'{"seq":2,"message":{"role":"user","content": "hi"},"type":"user"}\n',
        b'{"seq":2,"message":{"role":"user","content":"a\\ud800b"},"type":"user"}\n',  # lone
        b'{"seq":2,"message":{"role":"user","content":NaN},"type":"user"}\n',
        b'{"seq":2,"message":{"role":"user"},"type":"user"}\n',  # no content
        b'{"seq":2,"message":{"role":"user","content":"\\u00e9"},"type":"user"}\n',  # escaped
        b'{"seq":2,"message":{"role":"user","content":[1e+16]},"type":"user"}\n',  # msgspec: 1e16
    ]
    assert [_span(u) for u in unread] == [None] * 6
    # a key met first inside another value: its bytes there are not the record's result
    line = b'{"seq":3,"x":{"result":1},"result":{"type":"tool_result"},"type":"tool_result"}\n'
    assert _span(line, ToolResult(3, "t", {"type": "tool_result"})) is None
    emoji = _line(User(2, {"role": "user", "content": "\U0001f600"}))
    assert _span(emoji) == '"\U0001f600"'.encode()  # as the journal writes it
    pair = emoji.replace("\U0001f600".encode(), b"\\ud83d\\ude00")  # the same, escaped
    assert _span(pair) is None  # (decoded: the same character goes out)


class Nothing(Recorder):
    """An event sink that says it reads nothing (what it is given anyway, it keeps)."""

    def wants(self, kind: type[Event]) -> bool:
        return False


async def _suspended(api: FakeMessagesAPI, store: FileStore, turns: int) -> None:
    config = make_config(api)
    api.add(*(Reply.tool_use("note", {"text": f"n{n} ✓"}, id=f"toolu_{n}") for n in range(turns)))
    polls = iter([False] * (turns - 1) + [True])
    options = RunOptions(tools=[note], should_suspend=lambda: next(polls, True))
    run = await start_session(config, "go", store, options, run_id="s")
    assert await run.run() == "suspended"
    await run.harness.journal.close()
    again = await resume_session(
        config, "s", store, RunOptions(tools=[note], should_suspend=lambda: True)
    )
    assert await again.run() == "suspended"  # (this resume wrote the checkpoint)
    await again.harness.journal.close()


async def test_a_resume_to_its_request_decodes_none_of_the_history_unless_an_event_wants_it(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real SDK against the fake: the resumed run's request goes out with the
    history as the journal's bytes, no line decoded, when no event sink reads `RunResumed`;
    one that does gets the whole conversation, as ever."""
    monkeypatch.setattr(checkpoint, "EVERY", 2)
    store = FileStore(tmp_path)
    await _suspended(api, store, 6)
    assert checkpoint_path(store.path("s")).exists()
    expected = [m.to_json() for m in every_line(store.path("s")).messages]
    api.add(Reply.text("done"))
    loads, config = Loads(monkeypatch), make_config(api)
    sink = Nothing()
    run = await resume_session(config, "s", store, RunOptions(tools=[note], events=sink))
    assert await run.run() == "completed"
    assert sink.of(RunResumed) == []
    await run.harness.journal.close()
    assert loads.count == 1  # the last turn: the fold reads its calls (`_resume_state`)
    assert api.requests[-1]["messages"][: len(expected)] == expected
    raw = api.raw_requests[-1]
    assert b"".join(run.data.messages[1].raw() or (b"missing",)) in raw  # spliced as they are


async def test_a_sink_that_reads_run_resumed_gets_every_message(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "EVERY", 2)
    store = FileStore(tmp_path)
    await _suspended(api, store, 4)
    expected = [m.to_json() for m in every_line(store.path("s")).messages]
    recorder = Recorder()
    run = await resume_session(
        make_config(api), "s", store, RunOptions(tools=[note], events=recorder)
    )
    await run.harness.journal.close()
    [resumed_event] = recorder.of(RunResumed)
    assert list(resumed_event.messages) == expected

"""A resume reads a journal from its checkpoint (fisk_sm/journal/checkpoint.py) to the very
snapshot, messages and errors that reading every line gives; a checkpoint that does not hold
for the journal's bytes is never trusted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config

from fisk_sm import tool
from fisk_sm.journal import checkpoint, wirebytes
from fisk_sm.journal.checkpoint import checkpoint_path
from fisk_sm.journal.filestore import CorruptJournalError, FileStore
from fisk_sm.journal.fold import AT_INPUT
from fisk_sm.journal.lazy import Records, refresh_checkpoint
from fisk_sm.journal.parsing import fold_journal, parse_journal, resume_fold
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    encode,
)
from fisk_sm.journal.snapshot import Snapshot, Usage
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.blocks import message_of
from fisk_sm.model.later import later_all
from fisk_sm.testing import FakeMessagesAPI, Reply

FIXTURES = Path(__file__).parent / "fixtures" / "compat"


def _use(use_id: str, text: str = "x") -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": "note", "input": {"text": text}}


def _result(use_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": text}


def _turn(seq: int, *content: dict[str, Any], tokens: int = 7, stop: str = "tool_use") -> Assistant:
    message = {"role": "assistant", "content": list(content)}
    return Assistant(seq, 0, message, stop, Usage(tokens, tokens + 1, 2, 3))


def chat_records() -> list[Record]:
    """A chat that meets every part the fold folds: a follow-up merged into the prompt and into
    a turn's results, approvals (always, no), suspends in and between turns, non-ASCII text."""
    text = {"type": "text", "text": "voilà — done"}
    return [
        Meta(1, FORMAT_VERSION, "r", "2026-12-04T00:00:00Z", {"model": "m"}, "hello", True),
        User(2, {"role": "user", "content": "more, please"}),
        _turn(3, {"type": "text", "text": "let me look"}, _use("t1"), _use("t2", "é")),
        ToolStarted(4, "t1", "note"),
        ToolResult(5, "t1", _result("t1", "noted x"), duration_ms=3),
        ApprovalRequested(6, "r", "t2", "note", {"text": "é"}, "gated"),
        ApprovalAnswered(7, "t2", "always", by="terminal"),
        ToolStarted(8, "t2", "note"),
        ToolResult(9, "t2", _result("t2", "noted é"), kind="mcp"),
        Terminal(10, "suspended", "stopped by the operator"),
        User(11, {"role": "user", "content": [{"type": "text", "text": "and then?"}]}),
        _turn(12, text, tokens=11, stop="end_turn"),
        Terminal(13, "suspended", AT_INPUT),
        User(14, {"role": "user", "content": "again"}),
        _turn(15, _use("t3")),
        ToolStarted(16, "t3", "note"),
        ToolResult(17, "t3", _result("t3", "it broke"), is_error=True),
        _turn(18, text, _use("t4"), _use("t5")),
        ApprovalRequested(19, "r", "t4", "note", {"text": "x"}, "gated"),
        ApprovalAnswered(20, "t4", "no", reason="the prompt failed"),
        ToolStarted(21, "t5", "note"),
        ToolResult(22, "t5", _result("t5", "noted")),
        _turn(23, text, stop="end_turn"),
        Terminal(24, "failed", "boom"),
    ]


def lines(records: list[Record]) -> list[bytes]:
    return [(encode(r) + "\n").encode() for r in records]


def every_line(path: Path) -> Snapshot:
    """The snapshot of reading and checking every line (no checkpoint)."""
    data = path.read_bytes()
    return fold_journal(path, parse_journal(path, data)[0])


def resumed(store: FileStore, run_id: str) -> tuple[Snapshot, Records]:
    """What a resume folds (`FileStore.open`, `resume_fold`: it may write a checkpoint)."""
    journal = store.open(run_id)
    try:
        records = journal.records
        assert isinstance(records, Records)
        return resume_fold(journal.path, records), records
    finally:
        journal.close_sync()


def same(left: Snapshot, right: Snapshot) -> None:
    assert left == right
    assert [m.to_json() for m in left.messages] == [m.to_json() for m in right.messages]
    assert json.loads(left.to_json()) == json.loads(right.to_json())
    assert left.data() == right.data()


def grow(store: FileStore, run_id: str, chunks: list[bytes], torn: bool) -> int:
    """Append `chunks` one line at a time, resuming after each (with a torn half line of the
    next one first, when `torn`), and check each resume against reading every line; the number
    of resumes that were read from a checkpoint."""
    path = store.path(run_id)
    from_checkpoint = 0
    for n, line in enumerate(chunks):
        with path.open("ab") as file:
            file.write(line)
            if torn and n + 1 < len(chunks):
                file.write(chunks[n + 1][: len(chunks[n + 1]) // 2])
        snapshot, records = resumed(store, run_id)
        assert path.read_bytes().endswith(line)  # the torn half cut, as ever
        same(snapshot, every_line(path))
        from_checkpoint += records.base is not None
    return from_checkpoint


@pytest.mark.parametrize("every", [1, 2, 3, 5, 64])
@pytest.mark.parametrize("torn", [False, True])
def test_a_resume_from_a_checkpoint_folds_to_what_every_line_folds_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int, torn: bool
) -> None:
    monkeypatch.setattr(checkpoint, "EVERY", every)
    store = FileStore(tmp_path)
    store.ensure_directory()
    used = grow(store, "r", lines(chat_records()), torn)
    assert used >= (len(chat_records()) - every - 1 if every < 5 else 0)


@pytest.mark.parametrize("shape", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
@pytest.mark.parametrize("every", [1, 2])
def test_old_journals_resume_the_same_with_checkpoints_taken_along_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, every: int
) -> None:
    """The compatibility fixtures (journals an older build wrote), grown line by line."""
    monkeypatch.setattr(checkpoint, "EVERY", every)
    (source,) = (FIXTURES / shape / "sessions").glob("*.json")
    store = FileStore(tmp_path)
    store.ensure_directory()
    chunks = source.read_bytes().splitlines(keepends=True)
    grow(store, source.stem, chunks, torn=True)
    snapshot, records = resumed(store, source.stem)  # from the checkpoint the last one took
    assert records.base is not None
    same(snapshot, every_line(store.path(source.stem)))


def checkpointed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FileStore, Path]:
    """The chat journal, resumed once so that it has a checkpoint covering nearly all of it."""
    monkeypatch.setattr(checkpoint, "EVERY", 1)
    store = FileStore(tmp_path)
    store.ensure_directory()
    path = store.path("r")
    path.write_bytes(b"".join(lines(chat_records())))
    resumed(store, "r")
    assert checkpoint_path(path).exists()
    assert resumed(store, "r")[1].base is not None
    return store, path


def test_a_changed_byte_before_the_checkpoint_is_read_from_the_bytes_not_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed figure the checkpoint folded (the tokens of the first turn) is what resumes."""
    store, path = checkpointed(tmp_path, monkeypatch)
    data = path.read_bytes()
    changed = data.replace(b'"input_tokens":7,', b'"input_tokens":9,', 1)
    assert changed != data
    path.write_bytes(changed)
    snapshot, records = resumed(store, "r")
    assert records.base is None  # the checksum did not hold: every line was read
    same(snapshot, every_line(path))
    assert snapshot.usage.input_tokens == 9 + 11 + 7 + 7 + 7  # the new figure


@pytest.mark.parametrize("at", [0.02, 0.3, 0.6, 0.95])
def test_a_flipped_byte_before_the_checkpoint_fails_with_the_error_of_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: float
) -> None:
    store, path = checkpointed(tmp_path, monkeypatch)
    data = bytearray(path.read_bytes())
    size = json.loads(checkpoint_path(path).read_bytes())["size"]
    where = data.index(b'"seq":', int(size * at)) + 1
    data[where] ^= 0x20  # "seq" -> "Seq": the line no longer decodes
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptJournalError) as plain:
        parse_journal(path, bytes(data))
    with pytest.raises(CorruptJournalError) as opened:
        store.open("r")
    assert str(opened.value) == str(plain.value)
    assert path.read_bytes() == data  # nothing cut


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: {**d, "version": d["version"] + 1},
        lambda d: {**d, "size": d["size"] + 1},
        lambda d: {**d, "digest": d["digest"] ^ 1},
        lambda d: {**d, "seal": d["seal"] ^ 1},
        lambda d: {**d, "extra": 1},
        lambda d: {k: v for k, v in d.items() if k != "roles"},
    ],
    ids=["version", "size", "digest", "seal", "unknown-key", "missing-key"],
)
def test_a_checkpoint_that_does_not_hold_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Any
) -> None:
    store, path = checkpointed(tmp_path, monkeypatch)
    monkeypatch.setattr(checkpoint, "EVERY", 1000)  # no new checkpoint over the spoilt one
    side = checkpoint_path(path)
    side.write_text(json.dumps(spoil(json.loads(side.read_bytes()))))
    snapshot, records = resumed(store, "r")
    assert records.base is None
    same(snapshot, every_line(path))


@pytest.mark.parametrize("cut", [0, 1, 10, -10, -1])
def test_a_torn_checkpoint_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    store, path = checkpointed(tmp_path, monkeypatch)
    monkeypatch.setattr(checkpoint, "EVERY", 1000)
    side = checkpoint_path(path)
    side.write_bytes(side.read_bytes()[:cut])
    snapshot, records = resumed(store, "r")
    assert records.base is None
    same(snapshot, every_line(path))


def test_a_journal_cut_inside_its_checkpoint_is_read_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut back to fewer bytes than the checkpoint covers (a fork, a hand edit): it cannot
    hold, and the shorter journal resumes as itself."""
    store, path = checkpointed(tmp_path, monkeypatch)
    monkeypatch.setattr(checkpoint, "EVERY", 1000)
    path.write_bytes(b"".join(lines(chat_records()[:12])))
    snapshot, records = resumed(store, "r")
    assert records.base is None and snapshot.seq == 12
    same(snapshot, every_line(path))


def test_the_records_of_a_checkpointed_open_are_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path = checkpointed(tmp_path, monkeypatch)
    expected = parse_journal(path, path.read_bytes())[0]
    for look in (list, lambda r: r[:], lambda r: [r[i] for i in range(len(r))], tuple):
        journal = store.open("r")
        try:
            assert journal.records.base is not None  # type: ignore[attr-defined]
            assert len(journal.records) == len(expected) == journal.last_seq
            assert list(look(journal.records)) == expected
        finally:
            journal.close_sync()


def test_a_checkpoint_leaves_the_journal_unchanged_and_is_a_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So an older fisk-sm, which never opens it, reads the journal as it always did; `ls`
    does not list it, and `delete` removes it with the session."""
    monkeypatch.setattr(checkpoint, "EVERY", 1)
    store = FileStore(tmp_path)
    store.ensure_directory()
    path = store.path("r")
    path.write_bytes(b"".join(lines(chat_records())))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    resumed(store, "r")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.ckpt", "r.json", "r.lock"]
    assert [info.run_id for info in store.list()] == ["r"]
    store.delete("r")
    assert list(tmp_path.iterdir()) == []


def test_messages_before_the_checkpoint_are_read_on_first_use_and_never_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message the resume left as the journal's bytes is decoded once, when something reads
    it (tests/test_resume_bytes.py: a request does not), and equals the one read at once."""
    store, path = checkpointed(tmp_path, monkeypatch)
    snapshot, records = resumed(store, "r")
    assert records.base is not None
    reads: list[object] = []
    real = wirebytes._loads
    monkeypatch.setattr(wirebytes, "_loads", lambda data: reads.append(data) or real(data))
    expected = every_line(path).messages
    for _ in range(2):
        assert [m.to_json() for m in snapshot.messages] == [m.to_json() for m in expected]
    assert [m.content for m in snapshot.messages] == [m.content for m in expected]
    assert 0 < len(reads) < len(expected)  # once each, and not the prompt nor merged ones


def test_a_deferred_message_equals_the_built_one_and_hands_out_its_own_lists() -> None:
    wire = {"role": "assistant", "content": [{"type": "text", "text": "x", "extra": 1}]}
    loads: list[int] = []

    def load(arg: int) -> dict[str, Any]:
        loads.append(arg)
        return wire

    (later,) = later_all(load, ["assistant"], [5])
    first, second = later.to_json(), later.to_json()
    assert (
        first == second == message_of(wire).to_json() and first["content"] is not second["content"]
    )
    assert later == message_of(wire) and later.content is later.content
    assert loads == [5]  # read once, kept


@tool
def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


async def _suspended_thrice(api: FakeMessagesAPI, store: FileStore) -> list[dict[str, Any]]:
    """A session of five tool turns and an answer, suspended after two turns and resumed twice
    (suspended again at once the first time): the requests the model got."""
    config, first = make_config(api), len(api.requests)
    api.add(*(Reply.tool_use("note", {"text": str(n)}, id=f"toolu_{n}") for n in range(5)))
    api.add(Reply.text("final"))
    polls = iter([False, False, True])
    suspend = RunOptions(tools=[note], should_suspend=lambda: next(polls, False))
    run = await start_session(config, "go", store, suspend, run_id="s")
    assert await run.run() == "suspended"
    await run.harness.journal.close()
    again = await resume_session(
        config, "s", store, RunOptions(tools=[note], should_suspend=lambda: True)
    )
    assert await again.run() == "suspended"
    await again.harness.journal.close()
    last = await resume_session(config, "s", store, RunOptions(tools=[note]))
    assert await last.run() == "completed"
    await last.harness.journal.close()
    return api.requests[first:]


async def test_a_session_resumed_from_its_checkpoint_runs_as_one_resumed_without(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same session with checkpoints (one taken at each resume) and without: the model gets
    the same requests, and the journals hold the same records (the clock's figures aside)."""
    monkeypatch.setattr(checkpoint, "EVERY", 10**6)
    plain = FileStore(tmp_path / "plain")
    without = await _suspended_thrice(api, plain)
    monkeypatch.setattr(checkpoint, "EVERY", 2)
    with_checkpoints = FileStore(tmp_path / "checkpointed")
    opened: list[Records] = []
    real_open = FileStore.open

    def open_and_keep(store: FileStore, run_id: str) -> Any:
        journal = real_open(store, run_id)
        opened.append(journal.records)  # type: ignore[arg-type]
        return journal

    monkeypatch.setattr(FileStore, "open", open_and_keep)
    assert await _suspended_thrice(api, with_checkpoints) == without
    assert [records.base is not None for records in opened] == [False, True]
    assert not checkpoint_path(plain.path("s")).exists()
    assert untimed(plain.path("s")) == untimed(with_checkpoints.path("s"))


def untimed(path: Path) -> list[dict[str, Any]]:
    """A journal's lines without what the clock wrote (when, and how long calls took)."""
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    for line in lines:
        for key in ("created", "latency_ms", "duration_ms", "at"):
            line.pop(key, None)
    return lines


def test_a_writer_closing_a_session_it_grew_can_write_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`refresh_checkpoint`: a journal never resumed gets a checkpoint, read by the next
    resume; with too few records since, none is written."""
    monkeypatch.setattr(checkpoint, "EVERY", 5)
    store = FileStore(tmp_path)
    store.ensure_directory()
    path = store.path("r")
    chunks = lines(chat_records())
    path.write_bytes(b"".join(chunks[:3]))
    assert not refresh_checkpoint(path) and not checkpoint_path(path).exists()
    path.write_bytes(b"".join(chunks))
    assert refresh_checkpoint(path)
    snapshot, records = resumed(store, "r")
    assert records.base is not None and records.base.seq == 23
    same(snapshot, every_line(path))

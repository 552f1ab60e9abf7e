"""The file backend: real files under tmp_path, real fsync, real flock across processes."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from fisk_sm.journal import filejournal
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filejournal import FileJournal
from fisk_sm.journal.filestore import (
    CorruptJournalError,
    FileStore,
    InvalidIdError,
    JournalIOError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    check_run_id,
    default_directory,
)
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    encode,
)
from fisk_sm.journal.writer import GroupCommitWriter


def meta(run_id: str = "abc", model: str = "claude-test", prompt: str = "do it") -> Meta:
    return Meta(
        seq=1,
        version=FORMAT_VERSION,
        run_id=run_id,
        created="2025-01-01T00:00:00Z",
        fingerprint={"model": model},
        prompt=prompt,
    )


def user(seq: int) -> User:
    return User(seq=seq, message={"role": "user", "content": [{"type": "text", "text": f"m{seq}"}]})


def lines(*records: Record) -> bytes:
    return b"".join(encode(r).encode() + b"\n" for r in records)


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "state" / "runs")


def make(store: FileStore, run_id: str = "abc", n: int = 1) -> list[Record]:
    """A closed session with meta plus user records up to seq `n`."""
    records: list[Record] = [meta(run_id), *(user(s) for s in range(2, n + 1))]
    with store.create(meta(run_id)) as journal:
        for record in records[1:]:
            journal.append_sync(record)
    return records


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask0")
def test_create_sets_modes_and_writes_meta(store: FileStore) -> None:
    with store.create(meta()) as journal:
        assert journal.last_seq == 1
        assert journal.records == [meta()]
        assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(store.path("abc").stat().st_mode) == 0o600
        assert stat.S_IMODE(store.lock_path("abc").stat().st_mode) == 0o600
    assert store.path("abc").read_bytes() == lines(meta())
    assert store.path("abc") == store.directory / "abc.json"


async def test_append_contract(store: FileStore) -> None:
    journal = store.create(meta())
    await journal.append(user(2))
    before = store.path("abc").read_bytes()
    assert before == lines(meta(), user(2))
    await journal.append(User(seq=2, message={"role": "user", "content": "other"}))
    await journal.append(meta())
    assert store.path("abc").read_bytes() == before
    with pytest.raises(JournalError, match="seq gap") as info:
        await journal.append(user(4))
    assert str(store.path("abc")) in str(info.value)
    assert store.path("abc").read_bytes() == before
    assert journal.last_seq == 2
    await journal.append(user(3))
    await journal.close()
    await journal.close()  # idempotent
    assert store.load("abc") == [meta(), user(2), user(3)]
    with pytest.raises(JournalError, match="closed"):
        journal.append_sync(user(4))


@pytest.mark.parametrize(
    "tail",
    [b'{"type":"user","seq":3,"mes', b"\x00\x00\x00", encode(user(3)).encode()],
    ids=["partial", "zero-filled", "no-newline"],
)
def test_torn_tail_is_truncated_on_open(store: FileStore, tail: bytes) -> None:
    make(store, n=2)
    good = lines(meta(), user(2))
    with store.path("abc").open("ab") as f:
        f.write(tail)
    assert store.load("abc") == [meta(), user(2)]
    assert store.path("abc").read_bytes() == good + tail  # load changes nothing
    with store.open("abc") as journal:
        assert journal.last_seq == 2
        assert journal.records == [meta(), user(2)]
        assert store.path("abc").read_bytes() == good
        journal.append_sync(user(3))
    assert store.path("abc").read_bytes() == good + encode(user(3)).encode() + b"\n"
    assert store.load("abc") == [meta(), user(2), user(3)]


@pytest.mark.parametrize(
    "tail", [b"\x00\x00\x00\n", b"\n", b'{"type":"from_the_future","seq":3}\n']
)
def test_a_complete_last_line_that_does_not_decode_is_corruption_not_a_torn_write(
    store: FileStore, tail: bytes
) -> None:
    # The newline is the last byte of every append, so a complete line was fully written:
    # dropping it could throw away a record of a newer format.
    make(store, n=2)
    with store.path("abc").open("ab") as f:
        f.write(tail)
    before = store.path("abc").read_bytes()
    with pytest.raises(CorruptJournalError, match="line 3"):
        store.open("abc")
    with pytest.raises(CorruptJournalError, match="line 3"):
        store.load("abc")
    assert store.path("abc").read_bytes() == before


def test_a_torn_meta_leaves_an_empty_journal(store: FileStore) -> None:
    store.ensure_directory()
    store.path("abc").write_bytes(lines(meta())[:-5])
    assert store.load("abc") == []
    with store.open("abc") as journal:
        assert (journal.last_seq, journal.records) == (0, [])
        assert store.path("abc").read_bytes() == b""
        journal.append_sync(meta())
    assert store.load("abc") == [meta()]


@pytest.mark.parametrize(
    ("body", "line", "why"),
    [
        (lines(meta()) + b"not json\n" + lines(user(2)), 2, "malformed record"),
        (lines(meta()) + b"\n" + lines(user(2)), 2, "malformed record"),
        (lines(meta(), user(3)), 2, "seq 3, expected 2"),
        (lines(meta(), user(2), user(2)), 3, "seq 2, expected 3"),
        (lines(user(1), user(2)), 1, "not meta"),
        (lines(meta(), Meta(2, FORMAT_VERSION, "abc", "t", {}, "p")), 2, "meta record after"),
        (lines(meta(), user(2)) + b"{oops\n" + b"torn", 3, "malformed record"),
    ],
)
def test_interior_garbage_is_corrupt_and_untouched(
    store: FileStore, body: bytes, line: int, why: str
) -> None:
    store.ensure_directory()
    store.path("abc").write_bytes(body)
    for _ in range(2):  # the second attempt sees Corrupt again, not Locked: the lock was freed
        with pytest.raises(CorruptJournalError) as info:
            store.open("abc")
        message = str(info.value)
        assert message.startswith(f"{store.path('abc')}: line {line}: ")
        assert why in message
        assert "\n" not in message
        assert store.path("abc").read_bytes() == body
    with pytest.raises(CorruptJournalError, match=f"line {line}"):
        store.load("abc")
    [damaged] = store.list()  # listed as damaged, with the reason, never hidden
    assert (damaged.run_id, damaged.status) == ("abc", "damaged")
    assert damaged.problem.startswith(f"line {line}: ") and why in damaged.problem


@pytest.mark.parametrize("bad", ["../x", "", "a" * 129, "-x", "a/b", "abc\n", ".x", "a b"])
def test_invalid_ids_touch_nothing(store: FileStore, bad: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.path(bad),
        lambda: store.create(meta(bad)),
        lambda: store.open(bad),
        lambda: store.load(bad),
        lambda: store.delete(bad),
        lambda: store.fork("abc", 1, bad),
        lambda: store.fork(bad, 1, "abc"),
    ]
    for call in calls:
        with pytest.raises(InvalidIdError, match="invalid session id") as info:
            call()
        assert "\n" not in str(info.value)
    assert not store.directory.exists()
    assert not (store.directory.parent / "x").exists()
    assert check_run_id("a" * 128) == "a" * 128


def test_second_create_is_refused(store: FileStore) -> None:
    make(store, n=2)
    before = store.path("abc").read_bytes()
    with pytest.raises(SessionExistsError, match="'abc'"):
        store.create(meta())
    with store.open("abc"), pytest.raises(SessionExistsError):
        store.create(meta())  # even while another run holds it
    assert store.path("abc").read_bytes() == before
    with store.open("abc") as journal:  # the refused creates left the lock free
        assert journal.last_seq == 2


def test_an_empty_journal_a_crash_left_is_made_again(store: FileStore) -> None:
    # a process killed between creating the journal and writing its meta record leaves an empty
    # file: nothing of it was acknowledged, so a create (a resent submit's) makes the session,
    # where it used to be refused and the run listed as failed for good
    store.ensure_directory()
    store.path("abc").write_bytes(b"")
    with store.create(meta()) as journal:
        assert journal.last_seq == 1
    assert store.path("abc").read_bytes() == lines(meta())
    assert stat.S_IMODE(store.path("abc").stat().st_mode) == 0o600
    with store.open("abc") as journal:
        assert journal.last_seq == 1


@pytest.mark.parametrize(
    "held",
    [
        lines(meta()) + b'{"kind": "us',  # a whole record and a torn one
        b'{"kind": "meta", "seq": 1, "run_',  # half a line
        b'{"another": "program"}',  # another program's JSON, no newline
    ],
)
def test_a_journal_that_is_not_empty_is_never_made_again(store: FileStore, held: bytes) -> None:
    store.ensure_directory()
    store.path("abc").write_bytes(held)
    with pytest.raises(SessionExistsError, match="'abc'"):
        store.create(meta())
    assert store.path("abc").read_bytes() == held


def test_missing_sessions(store: FileStore) -> None:
    for call in (store.open, store.load, store.delete):
        with pytest.raises(SessionNotFoundError, match="session 'nope' not found"):
            call("nope")
    assert not store.directory.exists()
    with pytest.raises(SessionNotFoundError):
        store.fork("nope", 1, "new")


def test_delete(store: FileStore) -> None:
    make(store)
    make(store, "other")
    store.lock_path("other").unlink()
    with store.open("abc"), pytest.raises(SessionLockedError):
        store.delete("abc")
    assert store.load("abc") == [meta()]
    store.delete("abc")
    store.delete("other")  # a missing lock file is fine
    assert list(store.directory.iterdir()) == []
    with pytest.raises(SessionNotFoundError):
        store.load("abc")
    with pytest.raises(SessionNotFoundError):
        store.delete("abc")


OPENER = """
import sys
from fisk_sm.journal.filestore import FileStore
try:
    journal = FileStore(sys.argv[1]).open(sys.argv[2])
except Exception as exc:
    print(type(exc).__name__)
else:
    print("opened", journal.last_seq)
    journal.close_sync()
"""


def open_elsewhere(store: FileStore, run_id: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", OPENER, str(store.directory), run_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def test_a_second_process_cannot_open_an_open_session(store: FileStore) -> None:
    make(store, n=2)
    with store.path("abc").open("ab") as f:
        f.write(b'{"torn')  # would be truncated by a successful open
    before = store.path("abc").read_bytes()
    with store.open("abc") as journal:
        journal.append_sync(user(3))
        before = store.path("abc").read_bytes()
        assert open_elsewhere(store, "abc") == "SessionLockedError"
        assert store.path("abc").read_bytes() == before
        journal.append_sync(user(4))
    assert open_elsewhere(store, "abc") == "opened 4"


def test_failed_write_breaks_the_journal(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = store.create(meta())

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full)
        with pytest.raises(JournalError, match="No space left") as info:
            journal.append_sync(user(2))
    assert str(store.path("abc")) in str(info.value)
    assert journal.last_seq == 1
    with pytest.raises(JournalError, match="broken"):
        journal.append_sync(user(2))
    journal.close_sync()
    assert store.load("abc") == [meta()]


def test_short_writes_are_completed(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    with store.create(meta()) as journal:
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:7]))
        journal.append_sync(user(2))
    assert store.path("abc").read_bytes() == lines(meta(), user(2))


def test_list_newest_first(store: FileStore) -> None:
    assert store.list() == []  # no directory yet
    make(store, "old", n=2)
    with store.create(Meta(1, FORMAT_VERSION, "done", "t", {"model": "m2"}, "finish it")) as j:
        j.append_sync(Terminal(seq=2, reason="suspended"))
        j.append_sync(Terminal(seq=3, reason="completed"))
    make(store, "new")
    (store.directory / "broken.json").write_bytes(lines(meta("broken")) + b"x\n" + lines(user(3)))
    (store.directory / "bad id.json").write_bytes(lines(meta("bad id")))
    for run_id, mtime in [("old", 1000), ("done", 2000), ("new", 3000), ("broken", 4000)]:
        os.utime(store.path(run_id), (mtime, mtime))
    os.utime(store.directory / "bad id.json", (500, 500))
    infos = store.list()
    assert [i.run_id for i in infos] == ["broken", "new", "done", "old", "bad id"]
    assert [i.status for i in infos] == ["damaged", "open", "completed", "open", "damaged"]
    assert [i.records for i in infos] == [0, 1, 3, 2, 0]
    assert infos[0].problem.startswith("line 2: malformed record")
    assert "invalid session id 'bad id'" in infos[4].problem
    assert infos[2].model == "m2"
    assert infos[2].prompt == "finish it"
    assert infos[2].updated == 2000
    for run_id, mtime in [("old", 3000), ("done", 2000), ("new", 1000)]:  # the reverse order
        os.utime(store.path(run_id), (mtime, mtime))
    assert [i.run_id for i in store.list() if not i.problem] == ["old", "done", "new"]


def test_fork(store: FileStore) -> None:
    records = make(store, n=4)
    before = store.path("abc").read_bytes()
    store.fork("abc", 3, "child")
    forked = store.load("child")
    assert forked == [meta("child"), *records[1:3]]
    assert store.path("abc").read_bytes() == before
    with store.open("child") as journal:  # the fork was closed: its lock is free
        assert journal.last_seq == 3
    for at in (0, 5):
        with pytest.raises(ValueError, match="between 1 and 4"):
            store.fork("abc", at, "other")
    with pytest.raises(SessionExistsError):
        store.fork("abc", 2, "child")
    assert store.load("child") == forked
    assert not store.path("other").exists()


def test_default_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"XDG_STATE_HOME": "/xdg/state", "HOME": "/home/u"}
    assert default_directory(env) == Path("/xdg/state/fisk-sm/runs")
    for xdg in ("", "relative/state"):
        env["XDG_STATE_HOME"] = xdg
        assert default_directory(env) == Path("/home/u/.local/state/fisk-sm/runs")
    monkeypatch.setenv("XDG_STATE_HOME", "/elsewhere")
    assert default_directory() == Path("/elsewhere/fisk-sm/runs")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", "/h")
    assert default_directory() == Path("/h/.local/state/fisk-sm/runs")


def test_a_lone_surrogate_is_journaled_as_the_replacement_character(store: FileStore) -> None:
    """A Python tool's str may hold a lone surrogate, which has no UTF-8 form: whatever edge
    missed it, the journal holds U+FFFD (it used to hold a \\u escape), valid UTF-8."""
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": "a\ud800b"}
    odd = ToolResult(seq=2, tool_use_id="tu_1", result=result, is_error=False, kind="python")
    with store.create(meta()) as journal:
        journal.append_sync(odd)
    replaced = attrs.evolve(odd, result={**result, "content": "a\ufffdb"})
    assert store.load("abc") == [meta(), replaced]
    assert "a\ufffdb" in store.path("abc").read_bytes().decode("utf-8")


async def test_async_appends_fail_like_sync_ones(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the writer thread, a failed write breaks the journal and `last_seq` stays put."""
    journal = store.create(meta())
    await journal.append(user(2))

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full)
        with pytest.raises(JournalIOError, match="append of seq 3 failed: No space left") as info:
            await journal.append(user(3))
    assert str(store.path("abc")) in str(info.value)
    assert journal.last_seq == 2
    with pytest.raises(JournalError, match="broken"):
        await journal.append(user(3))
    await journal.close()
    assert store.load("abc") == [meta(), user(2)]


@pytest.fixture
def writer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every append through the group-commit writer's thread (whose os.fsync a test watches),
    none fsynced directly by the kernel (tests/test_journal_direct.py covers that path)."""
    monkeypatch.setattr(filejournal, "DIRECT_MAX", -1)


@pytest.mark.usefixtures("writer_only")
async def test_a_failed_fsync_breaks_the_journal(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = store.create(meta())

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(JournalIOError, match="Input/output error"):
        await journal.append(user(2))
    assert journal.last_seq == 1
    with pytest.raises(JournalError, match="broken"):
        await journal.append(user(2))
    await journal.close()


async def test_a_cancelled_append_still_lands_once(store: FileStore) -> None:
    """Cancelling the run does not cancel the commit; a replay of the seq waits for it."""
    journal = store.create(meta())
    task = asyncio.ensure_future(journal.append(user(2)))
    await asyncio.sleep(0)  # the line is queued for the writer
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await journal.append(user(2))  # the replay: no second line
    await journal.append(user(3))
    assert journal.last_seq == 3
    await journal.close()
    assert store.path("abc").read_bytes() == lines(meta(), user(2), user(3))


@pytest.mark.usefixtures("writer_only")
async def test_only_a_deferred_intent_skips_its_fsync(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = store.create(meta())
    journal.deferred_intents = frozenset({"retry_me"})
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    await journal.append(ToolStarted(2, "tu_1", "retry_me"))
    assert synced == [] and journal.last_seq == 2  # written, its fsync left to the result
    await journal.append(ToolResult(3, "tu_1", {"type": "tool_result", "tool_use_id": "tu_1"}))
    assert len(synced) == 1
    await journal.append(ToolStarted(4, "tu_2", "ask_me"))  # another tool: fsynced at once
    assert len(synced) == 2
    await journal.close()
    assert len(store.load("abc")) == 4


async def test_async_open_and_create(store: FileStore) -> None:
    async with asyncio.timeout(60):
        journal = await store.create_async(meta())
        await journal.append(user(2))
        await journal.close()
        reopened = await store.open_async("abc")
    assert reopened.last_seq == 2 and reopened.records == [meta(), user(2)]
    with pytest.raises(SessionLockedError):
        await store.open_async("abc")
    await reopened.close()


async def test_the_syncfs_writer_makes_many_journals_durable_with_few_syncs(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = GroupCommitWriter(syncfs=True)
    if writer._syncfs is None:
        pytest.skip("no syncfs(2) in this C library")
    calls: list[str] = []
    real_syncfs, real_fsync = writer._syncfs, os.fsync
    writer._syncfs = lambda fd: (calls.append("syncfs"), real_syncfs(fd))[1]
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(filejournal, "shared_writer", lambda: writer)
    journals = [store.create(meta(f"run{i}")) for i in range(20)]
    calls.clear()  # the creates fsync on their own thread

    async def three(journal: FileJournal) -> None:
        for seq in (2, 3, 4):
            await journal.append(user(seq))

    async with asyncio.timeout(60):
        await asyncio.gather(*(three(journal) for journal in journals))
        await asyncio.gather(*(journal.close() for journal in journals))
    for i in range(20):
        assert store.load(f"run{i}") == [meta(f"run{i}"), user(2), user(3), user(4)]
    assert "syncfs" in calls and len(calls) < 60  # batches of files shared one syncfs


def test_the_lock_probe_tells_a_held_lock_and_creates_nothing(store: FileStore) -> None:
    make(store, "abc", 2)
    with store.open("abc"):
        assert store.lock_held("abc")
        [info] = store.list()
        assert (info.status, info.owner) == ("open", "live")
        assert store.lock_held("abc")  # the probe did not take the lock from its owner
    assert not store.lock_held("abc")
    assert [(i.status, i.owner) for i in store.list()] == [("open", "gone")]
    store.lock_path("abc").unlink()  # no lock file at all: free, and none is made
    assert [(i.status, i.owner) for i in store.list()] == [("open", "gone")]
    assert not store.lock_path("abc").exists()
    store.lock_path("abc").symlink_to(store.directory / "elsewhere")  # never followed
    assert not store.lock_held("abc") and not (store.directory / "elsewhere").exists()
    with pytest.raises(JournalError, match="symlink"):  # as before: a planted lock is refused
        store.open("abc")
    store.lock_path("abc").unlink()
    with store.open("abc") as journal:
        journal.append_sync(Terminal(3, "completed"))
    assert [(i.status, i.owner) for i in store.list()] == [("completed", "")]

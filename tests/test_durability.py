"""The durability contract, observed at the system call: what is fsynced, and when.

A spy replaces `os.fsync` (and the kernel's fsync of a lone run, `LoopSync.fsync`) for the
test. Each call records the path of its descriptor (through
/proc/self/fd), the file's size when the call began (every byte written before then is covered)
and, for a directory, the names it held; the record is kept only once the real fsync returned.
It is thread-safe, and the tests look only at what is durable when a step returns, so they hold
whichever thread does the appending (the loop's, or a group-commit writer's).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from asyncio import Future
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from fisk_sm import MemoryJournal, Tool, parse_config, tool
from fisk_sm.journal import failpoint
from fisk_sm.journal.aiosync import LoopSync
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult, ToolStarted
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.testing import FakeMessagesAPI, Reply


@attrs.frozen
class Synced:
    path: str
    size: int  # the file's size when the fsync began: what it made durable
    entries: frozenset[str] | None  # a directory's names then; None for a file


class FsyncSpy:
    """Wraps `os.fsync`; `synced` lists the fsyncs that have returned, in that order."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self._lock = threading.Lock()
        self._synced: list[Synced] = []

    def __call__(self, fd: int) -> None:
        began = self.began(fd)
        self.real(fd)
        self.returned(began)

    @staticmethod
    def began(fd: int) -> Synced:
        path = Path(f"/proc/self/fd/{fd}").readlink()
        info = os.fstat(fd)
        directory = stat.S_ISDIR(info.st_mode)
        entries = frozenset(p.name for p in path.iterdir()) if directory else None
        return Synced(str(path), info.st_size, entries)

    def returned(self, synced: Synced) -> None:
        with self._lock:
            self._synced.append(synced)

    def kernel_fsync(self, real: Callable[[LoopSync, int], Future[None]]) -> object:
        """A stand-in for `LoopSync.fsync` (a lone run's fsync done by the kernel, no thread):
        kept once the loop has seen it end without an error."""

        def fsync(direct: LoopSync, fd: int) -> Future[None]:
            began = self.began(fd)
            future = real(direct, fd)
            ended = lambda f: f.cancelled() or f.exception() or self.returned(began)  # noqa: E731
            future.add_done_callback(ended)
            return future

        return fsync

    @property
    def synced(self) -> list[Synced]:
        with self._lock:
            return list(self._synced)

    def durable(self, path: Path) -> int:
        """How many leading bytes of the file at `path` an fsync has covered so far."""
        return max((s.size for s in self.synced if s.path == str(path)), default=0)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncSpy]:
    watcher = FsyncSpy(os.fsync)
    monkeypatch.setattr(os, "fsync", watcher)
    monkeypatch.setattr(LoopSync, "fsync", watcher.kernel_fsync(LoopSync.fsync))
    yield watcher


def tools(marks: Path) -> list[Tool]:
    def mark(label: str) -> str:
        """Append label to the marks file."""
        with marks.open("a") as f:
            f.write(label + "\n")
        return "marked " + label

    # Both crash policies: an intent of a `retry` tool may wait for its result's fsync, one of
    # a `fail` tool may not (a lost intent would let the tool run twice).
    return [
        tool(mark, name="once", crash_policy="fail"),
        tool(mark, name="again", crash_policy="retry"),
    ]


async def start(api: FakeMessagesAPI, state: Path, run_id: str, marks: Path) -> Run:
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    config = parse_config({"llm": llm}, env={})
    options = RunOptions(tools=tools(marks))
    return await start_session(config, "go", FileStore(state), options, run_id=run_id)


def lines_of(data: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in data.splitlines()]


async def test_creating_a_session_fsyncs_the_journal_and_then_its_directory(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    state = tmp_path / "state"
    run = await start(api, state, "d1", tmp_path / "marks")
    try:
        path = state / "d1.json"
        meta = path.read_bytes()
        assert [line["type"] for line in lines_of(meta)] == ["meta"]
        assert spy.durable(path) == len(meta), "the meta record was not fsynced"
        synced = spy.synced
        file_done = next(i for i, s in enumerate(synced) if s.path == str(path))
        entry_done = [
            i
            for i, s in enumerate(synced)
            if s.path == str(state) and s.entries is not None and "d1.json" in s.entries
        ]
        assert entry_done, "the directory was not fsynced with the new journal's entry in it"
        assert max(entry_done) > file_done, "the directory was fsynced before the journal"
    finally:
        await run.aclose()


async def test_every_record_is_fsynced_before_the_step_that_wrote_it_returns(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    api.add(
        Reply(
            content=(
                Reply.tool_use("once", {"label": "a"}, id="toolu_a").content[0],
                Reply.tool_use("again", {"label": "b"}, id="toolu_b").content[0],
            ),
            stop_reason="tool_use",
        ),
        Reply.tool_use("once", {"label": "c"}, id="toolu_c"),
        Reply.text("done"),
    )
    state = tmp_path / "state"
    path = state / "s1.json"
    run = await start(api, state, "s1", tmp_path / "marks")
    journaled = ["meta"]
    try:
        while not run.finished:
            await run.step()
            # Nothing runs between the step's return and these reads but other threads.
            data, durable = path.read_bytes(), spy.durable(path)
            lines = lines_of(data)
            if len(lines) > len(journaled):
                journaled = [str(line["type"]) for line in lines]
                assert durable == len(data), (
                    f"after a step journaled {journaled[-1]} (seq {len(lines)}), {durable} of"
                    f" {len(data)} bytes were fsynced"
                )
    finally:
        await run.aclose()
    assert journaled == [
        "meta",
        *("assistant", "tool_started", "tool_result", "tool_started", "tool_result"),
        *("assistant", "tool_started", "tool_result"),
        *("assistant", "terminal"),
    ]
    assert (tmp_path / "marks").read_text() == "a\nb\nc\n"


async def test_an_intent_is_durable_before_its_tool_runs(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    # Inside the tool: the intent of a `fail` tool must already be fsynced, that of a `retry`
    # tool at least written (its result's fsync covers it).
    state = tmp_path / "state"
    path = state / "i1.json"
    seen: dict[str, tuple[int, int, str]] = {}

    def probe(label: str) -> str:
        """Look at the journal from inside the tool."""
        data = path.read_bytes()
        seen[label] = (spy.durable(path), len(data), str(lines_of(data)[-1]["type"]))
        return "seen"

    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    config = parse_config({"llm": llm}, env={})
    box = [
        tool(probe, name="once", crash_policy="fail"),
        tool(probe, name="again", crash_policy="retry"),
    ]
    api.add(
        Reply(
            content=(
                Reply.tool_use("once", {"label": "fail"}, id="toolu_a").content[0],
                Reply.tool_use("again", {"label": "retry"}, id="toolu_b").content[0],
            ),
            stop_reason="tool_use",
        ),
        Reply.text("done"),
    )
    store = FileStore(state)
    run = await start_session(config, "go", store, RunOptions(tools=box), run_id="i1")
    try:
        assert await run.run() == "completed"
    finally:
        await run.aclose()
    durable, size, last = seen["fail"]
    assert last == "tool_started" and durable == size, seen
    assert seen["retry"][2] == "tool_started", seen


async def test_a_resumed_session_fsyncs_what_it_appends(
    api: FakeMessagesAPI, tmp_path: Path, spy: FsyncSpy
) -> None:
    state = tmp_path / "state"
    run = await start(api, state, "r1", tmp_path / "marks")
    run.request_suspend()
    assert await run.run() == "suspended"
    await run.aclose()
    path = state / "r1.json"
    assert spy.durable(path) == len(path.read_bytes())
    api.add(Reply.text("resumed"))
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    config = parse_config({"llm": llm}, env={})
    options = RunOptions(tools=tools(tmp_path / "marks"))
    resumed = await resume_session(config, "r1", FileStore(state), options)
    try:
        while not resumed.finished:
            await resumed.step()
            assert spy.durable(path) == len(path.read_bytes())
    finally:
        await resumed.aclose()
    assert lines_of(path.read_bytes())[-1]["type"] == "terminal"


# --- failpoints (the crash trials' way to die at an exact record) ----------------------------


def test_failpoint_specs_parse_and_bad_ones_are_named() -> None:
    assert str(failpoint.parse("after:tool_started:2")) == "after:tool_started:2:SIGKILL"
    assert failpoint.parse("before:assistant:1:SIGTERM").signum == signal.SIGTERM
    assert failpoint.record_type(ToolResult) == "tool_result"
    for bad, problem in [
        ("after:tool_started", "expected after|before"),
        ("during:assistant:1", "expected after|before"),
        ("after:assistant:0", "expected after|before"),
        ("after:nonsense:1", "unknown record type 'nonsense'"),
        ("after:assistant:1:SIGNOPE", "unknown signal 'SIGNOPE'"),
    ]:
        with pytest.raises(ValueError, match=problem):
            failpoint.parse(bad)
    inner = MemoryJournal()
    assert failpoint.install(inner, env={}) is inner


@pytest.mark.parametrize(("when", "written"), [("after", 3), ("before", 2)])
async def test_a_failpoint_signals_at_its_record(
    when: str, written: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kills: list[tuple[int, int, int]] = []
    inner = MemoryJournal()
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig, inner.last_seq)))
    spec = {failpoint.ENV: f"{when}:tool_started:2"}
    journal = failpoint.install(inner, env=spec)
    for seq, record in enumerate(
        [ToolStarted(1, "a", "t"), ToolResult(2, "a", {}), ToolStarted(3, "b", "t")], start=1
    ):
        assert record.seq == seq
        await journal.append(record)
    assert kills == [(os.getpid(), signal.SIGKILL, written)]
    assert journal.last_seq == 3
    assert f"fisk-sm: failpoint {when}:tool_started:2:SIGKILL at seq {written}" in (
        capsys.readouterr().err
    )

"""The state directory under attack and under failure, through the real CLI.

Planted files (a symlinked journal, a dangling lock symlink, a FIFO named like a journal) are
refused, never followed or waited on; everything is 0700/0600 under umask 000; a journal this
version cannot read is left byte for byte as it was; and a disk that fails mid-run exits 74 with
the journal intact, ready to resume.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import FORMAT_VERSION, Meta, encode
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
TIMEOUT = 120  # a hang guard only: a FIFO that is waited on would block forever


def fisk(
    *args: str,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    command = [*CLI, *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT, env=env, preexec_fn=preexec_fn
    )


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"llm: {{model: m, base_url: '{api.base_url}'}}\n")
    return path


def meta_line(run_id: str, version: int = FORMAT_VERSION) -> bytes:
    return (encode(Meta(1, version, run_id, "t", {"model": "m"}, "p")) + "\n").encode()


def test_a_symlinked_journal_is_refused_and_its_target_untouched(
    agent: Path, tmp_path: Path
) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside.json"
    state.mkdir(mode=0o700)
    outside.write_bytes(meta_line("s"))
    (state / "s.json").symlink_to(outside)
    for command in (
        ["run", "-c", str(agent), "--state-dir", str(state), "--resume", "s"],
        ["session", "show", "s", "--state-dir", str(state)],
    ):
        done = fisk(*command)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line == f"fisk-sm: {state / 's.json'}: a symlink; refusing to follow it"
    assert outside.read_bytes() == meta_line("s")
    done = fisk("session", "ls", "--state-dir", str(state))
    assert done.returncode == 0
    assert "damaged" in done.stdout and "a symlink; refusing to follow it" in done.stdout


def test_a_dangling_lock_symlink_creates_nothing_outside(agent: Path, tmp_path: Path) -> None:
    state, target = tmp_path / "state", tmp_path / "created-by-fisk"
    state.mkdir(mode=0o700)
    (state / "s.lock").symlink_to(target)
    done = fisk("run", "-c", str(agent), "--state-dir", str(state), "--checkpoint", "--name", "s")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line == f"fisk-sm: {state / 's.lock'}: a symlink; refusing to follow it"
    assert not target.exists()
    assert not (state / "s.json").exists()


def test_a_fifo_journal_blocks_nothing(agent: Path, tmp_path: Path, api: FakeMessagesAPI) -> None:
    state = tmp_path / "state"
    store = FileStore(state)
    store.ensure_directory()
    store.path("good").write_bytes(meta_line("good"))
    os.mkfifo(store.path("fifo"))
    done = fisk("session", "ls", "--state-dir", str(state))
    assert done.returncode == 0
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert set(rows) == {"good", "fifo"}
    assert "damaged" in rows["fifo"] and "a FIFO, not a regular file" in rows["fifo"]
    assert " open " in rows["good"]
    for command in (
        ["session", "show", "fifo", "--state-dir", str(state)],
        ["run", "-c", str(agent), "--state-dir", str(state), "--resume", "fifo"],
    ):
        done = fisk(*command)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"fisk-sm: {store.path('fifo')}: a FIFO, not a regular file; refusing it"
        ]
    assert stat.S_ISFIFO(store.path("fifo").lstat().st_mode)
    assert api.requests == []


def umask_000() -> None:
    os.umask(0)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_files_and_directories_are_private_under_umask_000(tmp_path: Path) -> None:
    """Everything fisk-sm creates in the XDG state dir, and the --events file, under umask 000."""
    xdg = tmp_path / "xdg"
    (tmp_path / "agent.yaml").write_text(
        "llm: {model: m, base_url: 'BASE'}\nharness: {memory: {enabled: true}}\n"
    )
    with FakeMessagesAPI(
        [
            Reply.tool_use("memory_write", {"key": "k", "description": "d", "content": "c"}),
            Reply.text("done"),
        ]
    ) as api:
        agent = tmp_path / "agent.yaml"
        agent.write_text(agent.read_text().replace("BASE", api.base_url))
        env = {**os.environ, "XDG_STATE_HOME": str(xdg)}
        events = tmp_path / "events.jsonl"
        command = ["run", "-c", str(agent), "--checkpoint", "--name", "s", "--events", str(events)]
        done = fisk(*command, env=env, preexec_fn=umask_000)
    assert done.returncode == 0, done.stderr
    created = [xdg, xdg / "fisk-sm", xdg / "fisk-sm" / "runs", xdg / "fisk-sm" / "memory"]
    created.append(xdg / "fisk-sm" / "memory" / "fisk-sm")
    assert {str(p): oct(mode(p)) for p in created} == {str(p): "0o700" for p in created}
    files = [xdg / "fisk-sm" / "runs" / "s.json", xdg / "fisk-sm" / "runs" / "s.lock", events]
    files.append(xdg / "fisk-sm" / "memory" / "fisk-sm" / "k.md")
    assert {str(p): oct(mode(p)) for p in files} == {str(p): "0o600" for p in files}


def test_a_future_version_journal_is_refused_before_a_byte_is_cut(
    agent: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    store = FileStore(state)
    store.ensure_directory()
    body = meta_line("future", FORMAT_VERSION + 1) + b'{"type":"new-kind","seq":2}\n{"torn'
    store.path("future").write_bytes(body)
    expected = (
        f"fisk-sm: {store.path('future')}: journal format version {FORMAT_VERSION + 1}"
        f" (this fisk-sm reads {FORMAT_VERSION}); the file was left unchanged"
    )
    for command in (
        ["run", "-c", str(agent), "--state-dir", str(state), "--resume", "future"],
        ["session", "show", "future", "--state-dir", str(state)],
    ):
        done = fisk(*command)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [expected]
        assert store.path("future").read_bytes() == body


def test_an_empty_journal_error_names_the_file(agent: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = FileStore(state)
    store.ensure_directory()
    store.path("empty").write_bytes(b"")
    for command in (
        ["run", "-c", str(agent), "--state-dir", str(state), "--resume", "empty"],
        ["session", "show", "empty", "--state-dir", str(state)],
    ):
        done = fisk(*command)
        assert done.returncode == 2
        [line] = done.stderr.splitlines()
        assert line.startswith(f"fisk-sm: {store.path('empty')}: ")
        assert "meta record" in line


def test_an_empty_session_name_is_refused(agent: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = fisk("run", "-c", str(agent), "--state-dir", str(state), "--checkpoint", "--name", "")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("fisk-sm: invalid session id ''")
    assert not state.exists() or list(state.iterdir()) == []


def limit_file_size(limit: int) -> Callable[[], None]:
    """A child whose files cannot grow past `limit` bytes: writes past it fail with EFBIG,
    as they would on a full disk (SIGXFSZ ignored so that the write returns the error)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_failing_disk_exits_74_with_the_journal_intact_and_resumable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    big = "x" * 4000  # the first reply's record cannot be written within the limit
    with FakeMessagesAPI([Reply.text(big), Reply.text("after the disk was fixed")]) as api:
        agent = tmp_path / "agent.yaml"
        agent.write_text(f"llm: {{model: m, base_url: '{api.base_url}'}}\n")
        run = ["run", "-c", str(agent), "--state-dir", str(state)]
        done = fisk(*run, "--checkpoint", "--name", "s", preexec_fn=limit_file_size(2000))
        assert done.returncode == 74, done.stderr
        lines = done.stderr.splitlines()
        assert lines[1].startswith(f"fisk-sm: {state / 's.json'}: append of seq 2 failed: ")
        assert lines[2] == (
            "the journal is intact up to seq 1; once the disk is fixed, resume with:"
            f" fisk-sm run -c {agent} --state-dir {state} --resume s"
        )
        assert "Traceback" not in done.stderr
        assert big not in (state / "s.json").read_text().splitlines()[0]
        # The model is asked again (the reply was never journaled) and the run completes.
        done = fisk(*run, "--resume", "s")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "after the disk was fixed\n"
    records = FileStore(state).load("s")
    assert [type(r).__name__ for r in records] == ["Meta", "Assistant", "Terminal"]

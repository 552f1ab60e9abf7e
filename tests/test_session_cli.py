"""`fisk-sm run --checkpoint/--resume` and `fisk-sm session ...` as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crashkit import STALL, Lines

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
TOOLS = '''
import time
from pathlib import Path

def mark(label: str) -> str:
    """Append label to the side-effect file."""
    with (Path(__file__).parent / "effects.txt").open("a") as f:
        f.write(label + "\\n")
    return "marked " + label

def slow(label: str) -> str:
    """Sleep, then mark."""
    time.sleep(30)
    return mark(label)
'''


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    (tmp_path / "effect_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "tools: [{python: 'effect_tools:mark'}, {python: 'effect_tools:slow'}]\n"
    )
    return path


def wait_for(journal: Path, marker: bytes) -> None:
    """Wait until the journal holds `marker` (a record the running process wrote); STALL is a
    guard against a hang, far above what any machine needs."""
    deadline = time.monotonic() + STALL
    while marker not in (journal.read_bytes() if journal.exists() else b""):
        assert time.monotonic() < deadline, f"{journal} never got {marker!r}"
        time.sleep(0.01)


def start_checkpointed(
    agent: Path, name: str, state: Path, *, capture: bool = False
) -> subprocess.Popen[str]:
    """`fisk-sm run --checkpoint --name NAME` in the background (stderr piped if `capture`)."""
    command = [*CLI, "run", "-c", str(agent), "--checkpoint", "--name", name]
    return subprocess.Popen(
        [*command, "--state-dir", str(state), "go"],
        env={**os.environ, "ANTHROPIC_API_KEY": "test"},
        stderr=subprocess.PIPE if capture else subprocess.DEVNULL,
        text=True,
    )


def fisk(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--resume", "x", "a prompt"], "--resume continues a session; it takes no prompt"),
        (["--name", "x", "hi"], "--name needs --checkpoint"),
        (["--force", "hi"], "--force needs --resume"),
        (["--resume", "x", "--checkpoint"], "cannot be combined"),
    ],
)
def test_flag_misuse_is_an_error(agent: Path, flags: list[str], problem: str) -> None:
    done = fisk("run", "-c", str(agent), *flags)
    assert done.returncode == 2
    assert problem in done.stderr and len(done.stderr.splitlines()) == 1


def test_checkpoint_prints_the_session_and_resume_replays_the_transcript(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("mark", {"label": "one"}), Reply.text("all done"))
    done = fisk(
        "run", "-c", str(agent), "--checkpoint", "--name", "c1", "--state-dir", str(state), "go"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "session: c1"
    assert done.stdout == "all done\n"
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    assert oct((state / "c1.json").stat().st_mode & 0o777) == "0o600"
    again = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "c1")
    assert again.returncode == 2
    assert 'session "c1" has already completed and cannot be resumed' in again.stderr


def test_torn_last_line_is_truncated_and_the_session_resumes(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("slow", {"label": "never"}))
    proc = start_checkpointed(agent, "t1", state)
    journal = state / "t1.json"
    wait_for(journal, b"tool_started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    good = journal.read_bytes()
    with journal.open("ab") as f:
        f.write(b'{"seq":4,"tool_use_id":"tu_x","res')
    api.add(Reply.text("recovered"))
    # retrying the interrupted slow tool would take 30 s: answer it from the file instead
    (agent.parent / "effect_tools.py").write_text(TOOLS.replace("time.sleep(30)", "pass"))
    done = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "t1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "recovered\n"
    assert journal.read_bytes().startswith(good)
    lines = journal.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines)
    assert fold(FileStore(state).load("t1")).completed
    assert (agent.parent / "effects.txt").read_text() == "never\n"


def test_interior_garbage_is_one_line_exit_2_and_the_file_is_unchanged(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("mark", {"label": "a"}), Reply.text("done"))
    fisk("run", "-c", str(agent), "--checkpoint", "--name", "g1", "--state-dir", str(state), "x")
    journal = state / "g1.json"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = b"this is not json\n"
    journal.write_bytes(b"".join(lines))
    before = journal.read_bytes()
    for args in (["run", "-c", str(agent), "--resume", "g1"], ["session", "show", "g1"]):
        done = fisk(*args, "--state-dir", str(state))
        assert done.returncode == 2
        assert len(done.stderr.splitlines()) == 1
        assert "g1.json: line 3" in done.stderr and "Traceback" not in done.stderr
        assert journal.read_bytes() == before


def test_a_second_process_cannot_resume_an_open_session(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("slow", {"label": "busy"}))
    owner = start_checkpointed(agent, "l1", state)
    journal = state / "l1.json"
    try:
        wait_for(journal, b"tool_started")
        before = journal.read_bytes()
        done = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "l1")
        assert done.returncode == 2
        assert "l1" in done.stderr and "lock" in done.stderr.lower()
        assert journal.read_bytes() == before
        removed = fisk("session", "rm", "l1", "--state-dir", str(state))
        assert removed.returncode == 2 and journal.exists()
    finally:
        owner.kill()
        owner.wait()


def test_session_ls_show_fork_and_rm(agent: Path, api: FakeMessagesAPI, tmp_path: Path) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("mark", {"label": "f"}), Reply.text("first answer"))
    fisk("run", "-c", str(agent), "--checkpoint", "--name", "f1", "--state-dir", str(state), "go")
    listed = json.loads(fisk("session", "ls", "--json", "--state-dir", str(state)).stdout)
    assert [(s["id"], s["status"], s["prompt"]) for s in listed] == [("f1", "completed", "go")]
    shown = fisk("session", "show", "f1", "--transcript", "--state-dir", str(state)).stdout
    assert "status:         completed" in shown and '-> mark {"label": "f"}' in shown
    forked = fisk("session", "fork", "f1", "--at", "4", "--name", "f2", "--state-dir", str(state))
    assert forked.returncode == 0, forked.stderr
    store = FileStore(state)
    original, copy = store.load("f1"), store.load("f2")
    assert fold(copy) == attrs_evolve_run_id(fold(original[:4]), "f2")
    api.add(Reply.text("second answer"))
    resumed = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "f2")
    assert resumed.returncode == 0 and resumed.stdout == "second answer\n"
    assert "resuming f2 (open) at iteration 1, in suspend_check" in resumed.stderr
    assert '  -> mark {"label": "f"}' in resumed.stderr
    assert (agent.parent / "effects.txt").read_text() == "f\n"
    assert fisk("session", "rm", "f1", "--state-dir", str(state)).returncode == 0
    assert not (state / "f1.json").exists()
    gone = fisk("session", "show", "f1", "--state-dir", str(state))
    assert gone.returncode == 2 and "f1" in gone.stderr
    bad = fisk("session", "show", "../x", "--state-dir", str(state))
    assert bad.returncode == 2 and "invalid session id" in bad.stderr


def attrs_evolve_run_id(snapshot: object, run_id: str) -> object:
    import attrs

    return attrs.evolve(snapshot, run_id=run_id)  # type: ignore[misc]


def test_a_second_signal_aborts_at_once_and_the_journal_keeps_what_completed(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.tool_use("mark", {"label": "m"}), Reply.tool_use("slow", {"label": "s"}))
    proc = start_checkpointed(agent, "a1", state, capture=True)
    journal = state / "a1.json"
    wait_for(journal, b'"name":"slow","type":"tool_started"')  # the slow tool is running
    assert proc.stderr is not None
    lines = Lines(proc.stderr)
    proc.send_signal(signal.SIGTERM)
    # Two pending SIGTERMs would coalesce into one: the second goes once the first was taken.
    lines.wait_for("suspending at the next loop boundary")
    proc.send_signal(signal.SIGTERM)
    # The slow tool sleeps 30 s and then marks "s": the effects file below shows it was not
    # waited for.
    assert proc.wait(STALL) == 130
    err = lines.text()
    assert "suspending at the next loop boundary" in err and "aborted" in err
    assert "--resume a1" in err
    snap = fold(FileStore(state).load("a1"))
    assert snap.status == "open" and len(snap.interrupted) == 1
    assert snap.pending[0].name == "slow"
    kinds = [json.loads(line)["type"] for line in journal.read_text().splitlines()]
    assert kinds == [
        "meta",
        "assistant",
        "tool_started",
        "tool_result",
        "assistant",
        "tool_started",
    ]
    assert (agent.parent / "effects.txt").read_text() == "m\n"


def test_the_sessions_directory_comes_from_agent_yaml(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    text = agent.read_text() + "harness: {sessions: {options: {directory: my-runs}}}\n"
    agent.write_text(text)
    api.add(Reply.text("stored"))
    done = fisk("run", "-c", str(agent), "--checkpoint", "--name", "d1", "hi")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "my-runs" / "d1.json").exists()
    listed = fisk("session", "ls", "-c", str(agent))
    assert listed.stdout.splitlines()[1].startswith("d1 ")


def test_a_signal_while_the_session_is_being_set_up_suspends_cleanly(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    # Sent as soon as the meta record exists: usually before the run loop has installed its
    # own handlers (the early window), sometimes just after; either way a clean suspend.
    api.add(Reply.tool_use("mark", {"label": "x"}, delay=0.5))
    state = tmp_path / "state"
    proc = start_checkpointed(agent, "e1", state, capture=True)
    wait_for(state / "e1.json", b'"type":"meta"')  # the session exists; the loop may not yet
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=STALL)
    assert proc.returncode == 0, err
    snap = fold(FileStore(state).load("e1"))
    assert snap.status == "suspended" and snap.llm_calls <= 1
    assert "--resume e1" in err


def listed_by_id(state: Path) -> tuple[dict[str, dict[str, str]], str]:
    """`session ls --json` by session id, and the human table."""
    rows = json.loads(fisk("session", "ls", "--json", "--state-dir", str(state)).stdout)
    return {row["id"]: row for row in rows}, fisk("session", "ls", "--state-dir", str(state)).stdout


def test_session_ls_tells_a_live_session_from_one_whose_owner_died(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(Reply.text("done"))  # a finished session: neither live nor orphaned
    fisk("run", "-c", str(agent), "--checkpoint", "--name", "d1", "--state-dir", str(state), "go")
    api.add(Reply.text("late", delay=STALL))  # the next run waits in its model call
    owner = start_checkpointed(agent, "o1", state)
    try:
        wait_for(state / "o1.json", b'"type":"meta"')
        deadline = time.monotonic() + STALL
        while not api.requests:  # the run is in its model call, holding the lock
            assert time.monotonic() < deadline, "the run never called the model"
            time.sleep(0.01)
        locks = sorted(p.name for p in state.iterdir())
        rows, table = listed_by_id(state)
        assert (rows["o1"]["status"], rows["o1"]["owner"]) == ("open", "live")
        assert rows["o1"]["shown"] == "running (live)"
        assert (rows["d1"]["status"], rows["d1"]["owner"]) == ("completed", "")
        assert "running (live)" in next(line for line in table.splitlines() if "o1" in line)
        assert sorted(p.name for p in state.iterdir()) == locks  # the probe created nothing
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    rows, table = listed_by_id(state)
    assert (rows["o1"]["status"], rows["o1"]["owner"]) == ("open", "gone")
    assert rows["o1"]["shown"] == "open (owner gone)"
    assert "open (owner gone)" in next(line for line in table.splitlines() if "o1" in line)
    assert rows["d1"]["shown"] == "completed"
    api.add(Reply.text("resumed"))  # an orphaned session resumes: the probe left its lock free
    resumed = fisk("run", "-c", str(agent), "--state-dir", str(state), "--resume", "o1")
    assert resumed.returncode == 0 and resumed.stdout == "resumed\n", resumed.stderr
    assert listed_by_id(state)[0]["o1"]["shown"] == "completed"

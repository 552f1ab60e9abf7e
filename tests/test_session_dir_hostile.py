"""Every command survives every file in the sessions directory.

A file named like a journal (`<id>.json`) may hold anything: nothing, half a meta line, random
bytes, another program's JSON Lines, a well-typed record around a foreign message, JSON nested
thousands deep; or it may be a directory or a FIFO. `session ls` lists the good sessions and names
each bad file on stderr (exit 0); every command that reads a bad one fails with one line naming
it (exit 2), and leaves it as it was. Nothing ends in an internal error (exit 70).

The fixed kinds run through `fisk_sm.cli.main.main` in process (each command of the matrix) and
through a few real subprocesses; hypothesis then writes random bytes and random near-journals
through the store's listing, load, open and fold, and through what `show`, `report` and
`diagram --session` do with a session that reads.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fisk_sm.cli.lineui import transcript_lines
from fisk_sm.cli.main import main
from fisk_sm.cli.report import report_html
from fisk_sm.cli.session import record_line
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.decode import decode
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import AT_INPUT
from fisk_sm.journal.parsing import CorruptJournalError, fold_journal
from fisk_sm.journal.records import FORMAT_VERSION, Assistant, Meta, encode
from fisk_sm.machine.diagram import mermaid
from fisk_sm.machine.path import session_path
from fisk_sm.machine.table import load_table
from fisk_sm.testing import FakeMessagesAPI

CLI = [sys.executable, "-m", "fisk_sm.cli"]
TIMEOUT = 120  # a hang guard only (a FIFO waited on would block forever)


def meta_line(run_id: str, *, interactive: bool = False) -> bytes:
    meta = Meta(1, FORMAT_VERSION, run_id, "t", {"model": "m"}, "p", interactive)
    return (encode(meta) + "\n").encode()


#: What a file named like a journal holds, by kind; a directory and a FIFO are made apart.
CONTENTS: dict[str, bytes] = {
    "empty": b"",
    "truncated": meta_line("truncated")[:-9],  # the meta line cut short: no complete line
    "binary": b"\x00\xff\xfe\x80\x9f\n\x01\x02\x03\n",
    "foreign": b'{"level": "info", "msg": "listening"}\n{"level": "warn"}\n',
    "odd-message": meta_line("odd-message")
    + b'{"type":"assistant","seq":2,"iteration":1,"stop_reason":"tool_use",'
    b'"message":{"role":"assistant","content":[{"type":"tool_use","name":"t"}]}}\n',
    "deep": b"[" * 5000 + b"]" * 5000 + b"\n",
    # A chat "stopped at its prompt" by a budget, then completed: no run writes this, and its
    # replay (`diagram --session`, `report`) used to cycle between two states for ever.
    "at-prompt": meta_line("at-prompt", interactive=True)
    + b'{"type":"terminal","seq":2,"reason":"budget_exhausted","message":"'
    + AT_INPUT.encode()
    + b'"}\n{"type":"terminal","seq":3,"reason":"completed"}\n',
    # A journal that folds, but whose tool result is nested ~980 deep: the JSON parsers read it
    # on a shallow stack, and re-encoding it (a transcript, a report) overflows on a deeper one.
    "nested": meta_line("nested")
    + b'{"type":"assistant","seq":2,"iteration":1,"stop_reason":"tool_use","message":'
    b'{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"t","input":{}}]}}\n'
    + b'{"type":"tool_result","seq":3,"tool_use_id":"t","result":{"tool_use_id":"t","content":'
    + b"[" * 980
    + b"]" * 980
    + b"}}\n",
}
KINDS = [*CONTENTS, "directory", "fifo"]


def plant(store: FileStore, kind: str) -> None:
    """Put a bad `<kind>.json` in the store's directory."""
    path = store.directory / f"{kind}.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(CONTENTS[kind])


def fingerprint_of(path: Path) -> tuple[int, bytes]:
    """What a bad file is: its kind, and its bytes if it has any."""
    mode = path.lstat().st_mode
    return stat.S_IFMT(mode), path.read_bytes() if stat.S_ISREG(mode) else b""


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"llm: {{model: m, base_url: '{api.base_url}'}}\n")
    return path


@pytest.fixture
def state(tmp_path: Path) -> FileStore:
    """A sessions directory with one good session and every kind of bad file."""
    store = FileStore(tmp_path / "state")
    store.ensure_directory()
    store.path("good").write_bytes(meta_line("good"))
    for kind in KINDS:
        plant(store, kind)
    return store


def test_session_ls_lists_the_good_and_names_each_bad_file(
    state: FileStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["session", "ls", "--state-dir", str(state.directory)]) == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert " open " in rows["good"]
    header, *damaged = err.splitlines()  # the store listed, then each damaged file
    assert header == f"sessions in {state.directory} (from --state-dir)"
    named = sorted(damaged)
    assert len(named) == len(KINDS)
    for line, kind in zip(named, sorted(KINDS), strict=True):
        assert line.startswith(f"fisk-sm: {state.directory / kind}.json: ")
        assert "damaged" in rows[kind]
    assert "Traceback" not in err and "internal error" not in err


def commands(kind: str, state: Path, agent: Path, out: Path) -> list[list[str]]:
    where = ["--state-dir", str(state)]
    return [
        ["session", "show", kind, "--transcript", *where],
        ["session", "rm", kind, *where],
        ["session", "fork", kind, "--at", "1", "--name", "copy", *where],
        ["run", "-c", str(agent), *where, "--resume", kind],
        ["chat", "-c", str(agent), *where, "--resume", kind],
        ["step", "-c", str(agent), *where, "--resume", kind],
        ["report", kind, *where, "-o", str(out)],
        ["diagram", "--session", kind, *where],
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_on_a_bad_file_fails_with_one_line(
    kind: str,
    state: FileStore,
    agent: Path,
    api: FakeMessagesAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = state.directory / f"{kind}.json"
    before = fingerprint_of(path)
    capsys.readouterr()
    for argv in commands(kind, state.directory, agent, tmp_path / "report.html"):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, err)
        [line] = err.splitlines()
        assert line.startswith(f"fisk-sm: {path}: "), (argv, line)
        assert out == ""
        after = fingerprint_of(path)
        # Never removed or written to; a resume may cut a torn last line, as it always does,
        # and the cut meta leaves no complete line.
        assert after == before or (kind == "truncated" and after == (stat.S_IFREG, b"")), argv
    assert not state.path("copy").exists() and not (tmp_path / "report.html").exists()
    assert api.requests == []


def test_a_fork_beyond_the_journal_is_bad_input(
    state: FileStore, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--state-dir", str(state.directory)]
    assert main(["session", "fork", "good", "--at", "9", "--name", "copy", *where]) == 2
    assert capsys.readouterr().err == (
        "fisk-sm: fork of session 'good' at seq 9: must be between 1 and 1\n"
    )
    assert not state.path("copy").exists()


def test_records_built_in_code_that_do_not_fold_are_refused_naming_the_file() -> None:
    """`fold_journal` also guards records `parse_journal` never saw (a store of another kind)."""
    meta = Meta(1, FORMAT_VERSION, "x", "t", {}, "p")
    turn = Assistant(2, 1, {"role": "assistant", "content": [{"type": "tool_use"}]}, "tool_use")
    malformed = r"message\.content\[0\]: a malformed tool_use block at seq 2"
    with pytest.raises(CorruptJournalError, match=rf"^/j/x\.json: {malformed}$"):
        fold_journal(Path("/j/x.json"), [meta, turn])


def test_a_line_nested_past_the_parsers_is_a_malformed_record() -> None:
    with pytest.raises(ValueError, match=r"^malformed record: not JSON \(nested too deeply\)$"):
        decode(b"[" * 5000 + b"]" * 5000)


def fisk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT)


def test_the_real_commands_over_a_hostile_directory(state: FileStore, agent: Path) -> None:
    where = ["--state-dir", str(state.directory)]
    done = fisk("session", "ls", *where)
    assert done.returncode == 0, done.stderr
    assert len(done.stderr.splitlines()) == 1 + len(KINDS)  # the "sessions in" line, the files
    assert "good" in done.stdout
    for kind in ("empty", "directory"):
        for argv in (
            ["session", "show", kind, *where],
            ["run", "-c", str(agent), *where, "--resume", kind],
        ):
            done = fisk(*argv)
            assert done.returncode == 2, done.stderr
            [line] = done.stderr.splitlines()
            assert line.startswith(f"fisk-sm: {state.directory / kind}.json: ")


# Near-journals: a meta line, then records of the right tags and seqs whose fields hold anything
# from the right shape to nonsense, so that hypothesis gets past the JSON parse into the shape
# checks, the fold and the readers of a folded session.
IDS = st.sampled_from(["toolu_1", "toolu_2"])
KEYS = st.sampled_from(
    ["role", "content", "type", "text", "id", "name", "input", "tool_use_id", "is_error", "x"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.sampled_from(["user", "assistant", "text", "tool_use", "tool_result", "toolu_1", "t"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
OBJECTS = st.dictionaries(KEYS, VALUES, max_size=5)
TOOL_USE = st.fixed_dictionaries(
    {"type": st.just("tool_use"), "id": IDS, "name": st.just("t"), "input": st.just({})}
)
MESSAGES = OBJECTS | st.fixed_dictionaries(
    {
        "role": st.sampled_from(["assistant", "user"]),
        "content": st.lists(TOOL_USE | OBJECTS, max_size=3) | st.text(max_size=3),
    }
)
REASONS = st.sampled_from(["completed", "suspended", "failed", "budget_exhausted"])
BODIES: dict[str, Callable[[], st.SearchStrategy[dict[str, Any]]]] = {
    "assistant": lambda: st.fixed_dictionaries(
        {
            "iteration": st.integers(0, 3),
            "message": MESSAGES,
            "stop_reason": st.sampled_from([None, "tool_use", "end_turn", "pause_turn"]),
        }
    ),
    "tool_started": lambda: st.fixed_dictionaries({"tool_use_id": IDS, "name": st.just("t")}),
    "tool_result": lambda: st.fixed_dictionaries(
        {"tool_use_id": IDS, "result": OBJECTS | st.builds(lambda i: {"tool_use_id": i}, IDS)}
    ),
    "user": lambda: st.fixed_dictionaries({"message": MESSAGES}),
    "terminal": lambda: st.fixed_dictionaries(
        {"reason": REASONS, "message": st.sampled_from([None, AT_INPUT, "x"])}
    ),
    "approval_requested": lambda: st.fixed_dictionaries(
        {
            "run_id": st.just("x"),
            "tool_use_id": IDS,
            "name": st.just("t"),
            "input": st.just({}),
            "tag": st.just("danger"),
        }
    ),
    "approval_answered": lambda: st.fixed_dictionaries(
        {"tool_use_id": IDS, "answer": st.sampled_from(["once", "always", "no"])}
    ),
}


@st.composite
def near_journals(draw: st.DrawFn) -> bytes:
    lines = [meta_line("x", interactive=draw(st.booleans()))]
    tags = draw(st.lists(st.sampled_from(sorted(BODIES)), max_size=6))
    for seq, tag in enumerate(tags, start=2):
        body = draw(BODIES[tag]())
        lines.append((encode_json({"type": tag, "seq": seq, **body}) + "\n").encode())
    data = b"".join(lines)
    if draw(st.booleans()):  # a torn tail, or bytes spliced in somewhere
        data += draw(st.binary(max_size=8))
    return data


def encode_json(value: Any) -> str:
    import json

    return json.dumps(value)


JOURNALS = (
    st.binary(max_size=64)
    | near_journals()
    | st.builds(
        lambda head, tail: meta_line("x") + head + tail,
        st.binary(max_size=16),
        st.binary(max_size=16),
    )
)


def check_directory(data: bytes) -> None:
    """The store's listing, load, open and fold, and what the commands do with what they read,
    over a directory holding a good session and `x.json` holding `data`."""
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(Path(tmp))
        store.path("good").write_bytes(meta_line("good"))
        path = store.path("x")
        path.write_bytes(data)
        infos = {info.run_id: info for info in store.list()}
        assert set(infos) == {"good", "x"}
        assert infos["good"].status == "open" and not infos["good"].problem
        if infos["x"].problem:
            assert infos["x"].status == "damaged"
            with pytest.raises(JournalError, match=f"^{re.escape(str(path))}: ") as refused:
                store.snapshot("x")
            assert "\n" not in str(refused.value)
            try:  # records that do not fold may still parse: then only the fold refuses
                store.load("x")
            except JournalError as exc:
                assert str(exc).startswith(f"{path}: ")
                with pytest.raises(JournalError, match=f"^{re.escape(str(path))}: "):
                    store.open("x")
                assert path.read_bytes() == data  # refused before a byte was cut
            return
        records = store.load("x")
        snap = store.snapshot("x")
        assert infos["x"].status == snap.status and infos["x"].records == len(records)
        [record_line(r) for r in records]
        transcript_lines(snap.messages)
        try:
            walked = session_path(records)
        except JournalError as exc:  # a journal that folds need not be a path: one line
            assert "\n" not in str(exc)
        else:
            mermaid(load_table(), [walked])
            report_html(records, walked)
        store.open("x").close_sync()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JOURNALS)
def test_any_bytes_as_a_journal_are_listed_read_or_refused_in_one_line(data: bytes) -> None:
    check_directory(data)


@pytest.mark.parametrize("data", [CONTENTS[k] for k in CONTENTS], ids=list(CONTENTS))
def test_each_fixed_kind_through_the_store(data: bytes) -> None:
    check_directory(data)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JOURNALS)
def test_any_bytes_through_the_real_cli(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(Path(tmp))
        store.path("good").write_bytes(meta_line("good"))
        store.path("x").write_bytes(data)
        for argv in (["session", "ls"], ["session", "show", "x"], ["diagram", "--session", "x"]):
            done = fisk(*argv, "--state-dir", tmp)
            assert done.returncode in (0, 2), (argv, done.stderr)
            assert "Traceback" not in done.stderr and "internal error" not in done.stderr
            if done.returncode == 2:
                [line] = done.stderr.splitlines()
                assert line.startswith(f"fisk-sm: {store.path('x')}: ")


def test_a_journal_that_circles_the_replay_is_a_path_error() -> None:
    """The path replay refuses a journal that makes it circle without taking a record (the
    fold refuses this one too; the replay must not rely on that: it runs on records given in
    code as well)."""
    from fisk_sm.journal.decode import decode
    from fisk_sm.machine.path import PathError, session_path

    records = [decode(line) for line in CONTENTS["at-prompt"].splitlines()]
    with pytest.raises(PathError, match="a record that moves the run on"):
        session_path(records)

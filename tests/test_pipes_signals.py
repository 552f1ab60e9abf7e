"""Pipes and signals: a command's standard streams never decide how it ends.

`fisk-sm supervise` started with stderr closed (`2>&-`), or whose stderr is a pipe whose reader
has gone, still suspends every run on SIGTERM and exits 0; so does `fisk-sm run`. A listing
piped into `head -1` ends quietly: exit 0 and nothing on stderr, as the README's exit-code
table says. Every process here is real, started through a real shell where the shell is the
point (`2>&-`, `| head -1`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctlkit import CLI, DEADLINE, http, wait_until
from ctlkit import Supervisor as Gated

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import FORMAT_VERSION, Meta, Terminal, encode
from fisk_sm.testing import FakeMessagesAPI, Reply

PARKED = "deploy prod"  # its model reply calls the gated `deploy`: the run parks


@pytest.fixture
def held() -> Iterator[tuple[FakeMessagesAPI, threading.Event]]:
    """The fake API: `PARKED` is scripted; any other prompt's model call is held (in flight)
    until the test ends. The event is set once a held call has arrived."""
    arrived, release = threading.Event(), threading.Event()

    def hold(body: dict[str, Any]) -> Reply:
        arrived.set()
        release.wait(DEADLINE)
        return Reply.text("released")

    conversations = {PARKED: [Reply.tool_use("deploy", {"target": "prod"}, id="toolu_p")]}
    api = FakeMessagesAPI(conversations=conversations, responder=hold).start()
    try:
        yield api, arrived
    finally:
        release.set()
        api.close()


def start(sup: Gated, stderr: str) -> subprocess.Popen[bytes]:
    """`fisk-sm supervise` through a shell: stderr `closed` (`2>&-`) or a `pipe`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env["ANTHROPIC_API_KEY"] = "test"
    argv = [*CLI, "supervise", "-c", str(sup.agent), "--listen", "127.0.0.1:0"]
    argv += ["--state-dir", str(sup.state)]
    command = shlex.join(argv) + (" 2>&-" if stderr == "closed" else "")
    return subprocess.Popen(
        ["sh", "-c", f"exec {command}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if stderr == "pipe" else None,
        env=env,
        cwd=sup.root,
    )


def submit(url: str, prompt: str) -> str:
    status, run = http("POST", url + "/api/runs", {"prompt": prompt})
    assert status == 201, run
    return str(run["run_id"])


def status_of(url: str, run_id: str) -> str:
    status, run = http("GET", f"{url}/api/runs/{run_id}")
    assert status == 200, run
    return str(run["status"])


@pytest.mark.parametrize("stderr", ["closed", "pipe"])
def test_sigterm_suspends_every_run_whatever_became_of_stderr(
    stderr: str, tmp_path: Path, held: tuple[FakeMessagesAPI, threading.Event]
) -> None:
    api, arrived = held
    sup = Gated(tmp_path, api)
    process = start(sup, stderr)
    try:
        url_file = sup.state / "supervisor.url"
        url = wait_until(lambda: url_file.exists() and url_file.read_text().strip(), "the url")
        if process.stderr is not None:  # the reader goes: the next line meets a broken pipe
            while b"listening on" not in (line := process.stderr.readline()):
                assert line, "supervise ended its stderr before listening"
            process.stderr.close()
        parked, flying = submit(url, PARKED), submit(url, "wait for the model")
        wait_until(lambda: status_of(url, parked) == "parked", "the run to park")
        wait_until(arrived.is_set, "the model call to be in flight")
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    store = FileStore(sup.state)
    last = store.load(flying)[-1]
    assert isinstance(last, Terminal) and last.reason == "suspended"
    snap = store.snapshot(parked)
    assert snap.status == "suspended" and snap.state == "awaiting_approval"
    assert sup.effects_lines() == []  # a suspend never answers the approval


def test_a_run_with_stderr_closed_answers_and_exits_0(tmp_path: Path) -> None:
    with FakeMessagesAPI([Reply.text("the answer")]) as api:
        agent = tmp_path / "agent.yaml"
        agent.write_text(f"llm: {{model: m, base_url: '{api.base_url}'}}\n")
        state = tmp_path / "state"
        argv = [*CLI, "run", "-c", str(agent), "--state-dir", str(state), "--checkpoint"]
        argv += ["--name", "s", "go"]
        done = subprocess.run(
            ["sh", "-c", f"exec {shlex.join(argv)} 2>&-"],
            capture_output=True,
            timeout=DEADLINE,
            env={**os.environ, "ANTHROPIC_API_KEY": "test"},
        )
    assert (done.returncode, done.stdout) == (0, b"the answer\n")
    assert FileStore(state).snapshot("s").status == "completed"  # fd 2 was no journal


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sessions directory whose listing is well over a pipe's 64 KiB: `head -1` leaves
    while `session ls` is still writing, every time."""
    store = FileStore(tmp_path_factory.mktemp("many") / "state")
    store.ensure_directory()
    for n in range(700):
        meta = Meta(1, FORMAT_VERSION, f"session-{n:04}", "t", {"model": "m"}, "p" * 200)
        store.path(meta.run_id).write_bytes((encode(meta) + "\n").encode())
    return store.directory


def test_a_listing_into_head_ends_quietly(many: Path, tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    command = shlex.join([*CLI, "session", "ls", "--state-dir", str(many)])
    done = subprocess.run(
        ["bash", "-c", f'{command} 2>{shlex.quote(str(err))} | head -1; echo "${{PIPESTATUS[0]}}"'],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    first, status = done.stdout.splitlines()
    assert first.startswith("ID ")
    assert err.read_text() == f"sessions in {many} (from --state-dir)\n"  # and nothing after
    assert status == "0"

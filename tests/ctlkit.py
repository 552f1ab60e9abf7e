"""A real `fisk-sm supervise` for the tests of its clients (`fisk-sm ctl`, the dashboard).

`Supervisor` starts the command as a child process on 127.0.0.1 port 0 against an agent whose
one tool, `deploy`, is tagged `ai:confirm` (so every call parks its run for an operator) and
appends a line to `effects` each time it really runs. The fake Messages API runs in the test's
process; its conversations are keyed by each run's prompt. `ctl(...)` runs the real
`python -m fisk_sm.cli ctl` against it. Every wait polls for progress with a generous deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from crashkit import Lines

from fisk_sm.testing import FakeMessagesAPI

__all__ = ["CLI", "DEADLINE", "Supervisor", "ctl", "http", "wait_until"]

CLI = [sys.executable, "-m", "fisk_sm.cli"]

#: How long a wait polls before the test fails (generous: machines are noisy).
DEADLINE = 120.0
TOOLS = '''
from pathlib import Path

EFFECTS = Path({effects!r})


def deploy(target: str) -> str:
    """Deploy to a target."""
    with EFFECTS.open("a") as f:
        f.write(target + "\\n")
    return "deployed to " + target


def look(what: str) -> str:
    """Look at something (ungated)."""
    return "looked at " + what
'''
T = TypeVar("T")


def wait_until(probe: Callable[[], T | None], what: str, deadline: float = DEADLINE) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `deadline` s."""
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def http(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    """One request to the control API: (status, parsed JSON body or None). A POST without a
    body sends `{}`: the API takes a POST only as JSON."""
    if body is None and method == "POST":
        body = {}
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def ctl(url: str | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fisk-sm ctl [--url URL] ARGS` as a real subprocess."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    where = ["--url", url] if url else []
    return subprocess.run(
        [*CLI, "ctl", *where, *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=DEADLINE,
    )


def start_supervise(
    argv: list[str], env: dict[str, str], cwd: Path, deadline: float = DEADLINE
) -> tuple[subprocess.Popen[str], Lines, str]:
    """Start a `fisk-sm supervise` process; its stderr lines and the URL it says it listens on."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert process.stderr is not None
    stderr = Lines(process.stderr)
    line = stderr.wait_for("listening on", deadline)
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert found, line
    return process, stderr, found.group(1)


class Supervisor:
    """`fisk-sm supervise` on a free loopback port, with the gated `deploy` tool."""

    def __init__(
        self,
        root: Path,
        api: FakeMessagesAPI,
        token: str | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.args = args  # more `supervise` arguments
        self.state = root / "state"
        self.effects = root / "effects.txt"
        self.token = token
        (root / "console_tools.py").write_text(TOOLS.format(effects=str(self.effects)))
        self.agent = root / "agent.yaml"
        self.agent.write_text(
            "system_prompt: You deploy things.\n"
            f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
            "tools:\n"
            "  - {python: 'console_tools:deploy', tags: ['ai:confirm']}\n"
            "  - {python: 'console_tools:look'}\n"
        )
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> Supervisor:
        """Start the process and wait for the URL it listens on."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        env["ANTHROPIC_API_KEY"] = "test"
        if self.token:
            env["FISK_SM_TOKEN"] = self.token
        argv = [*CLI, "supervise", "-c", str(self.agent), "--listen", "127.0.0.1:0"]
        argv += ["--state-dir", str(self.state), *self.args]
        self.process, self.stderr, self.url = start_supervise(argv, env, self.root)
        written = (self.state / "supervisor.url").read_text().strip()
        assert written == self.url, (written, self.url)
        return self

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A request to this supervisor, with its token."""
        return http(method, self.url + path, body, self.token)

    def run(self, run_id: str) -> dict[str, Any]:
        """`GET /api/runs/{run_id}` (which must succeed)."""
        status, body = self.api("GET", f"/api/runs/{run_id}")
        assert status == 200, (status, body)
        assert isinstance(body, dict)
        return body

    def wait_status(self, run_id: str, *statuses: str) -> dict[str, Any]:
        """Poll the run until its status is one of `statuses`."""
        return wait_until(
            lambda: (run := self.run(run_id))["status"] in statuses and run,
            f"run {run_id} to be {'/'.join(statuses)}",
        )

    def submit(self, prompt: str, name: str | None = None) -> str:
        """Submit a run over HTTP; its id."""
        body = {"prompt": prompt, **({"name": name} if name else {})}
        status, run = self.api("POST", "/api/runs", body)
        assert status == 201, (status, run)
        return str(run["run_id"])

    def effects_lines(self) -> list[str]:
        """The targets the gated tool really deployed to, in order."""
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def stop(self) -> int:
        """SIGTERM, then wait for the exit code (SIGKILL if it hangs)."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError("supervise did not exit on SIGTERM") from None

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

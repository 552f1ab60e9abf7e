"""Hostile text never reaches a terminal: every output path, through the real CLI.

One hostile string (escape sequences, BEL, a C1 CSI, bidi overrides and isolates) is sent
through each path that shows model-, API- or journal-supplied text: the model's text, a tool
call's name and input, a tool's output, the unknown-tool warning, an API error message, the
transcript replayed on --resume, `session show --transcript`, `session ls`, and the final answer
on a terminal. Each must come out with no control character. The answer piped to a file stays
byte-exact.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
HOSTILE = "A\x1b[2J\x1b]0;pwned\x07B\x9b31mC\u202eD\u2066E\u2069F\x07G\x1bcH\x90dcs\x9cI"
#: What no line shown on a terminal may contain: C0 (but \t and \n), DEL, C1, bidi controls.
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
TOOLS = '''
def echo(text: str) -> str:
    """Say it back."""
    return text
'''


def fisk(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_clean(text: str) -> None:
    found = UNSAFE.findall(text)
    assert not found, f"control characters reached the terminal: {found!r} in {text!r}"


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    (tmp_path / "hostile_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "tools: [{python: 'hostile_tools:echo'}]\n"
    )
    return path


def test_every_output_path_of_a_run_and_its_session_is_sanitized(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    api.add(
        Reply.tool_use(f"no_such_{HOSTILE}", {"x": HOSTILE}, id="tu_1", text=HOSTILE),
        Reply.tool_use("echo", {"text": HOSTILE}, id="tu_2", text=HOSTILE),
        Reply.text(HOSTILE),
    )
    run = ["run", "-c", str(agent), "--state-dir", str(state), "--trace"]
    done = fisk(*run, "--checkpoint", "--name", "h", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == HOSTILE + "\n"  # not a terminal: byte-exact
    assert_clean(done.stderr)
    # each path did run, and showed what it could of the hostile text
    shown = "ABCDEFGHI"
    assert f"warning: unknown_tool no_such_{shown}" in done.stderr
    assert f"model: {shown}" in done.stderr
    assert '-> echo {"text": "A\\u001b[2J' in done.stderr  # JSON escapes C0: shown, inert
    assert f"<- {shown}" in done.stderr

    shown_session = fisk(
        "session", "show", "h", "--transcript", "--state-dir", str(state), cwd=tmp_path
    )
    assert shown_session.returncode == 0
    assert_clean(shown_session.stdout)
    assert f"-> no_such_{shown}" in shown_session.stdout
    listing = fisk("session", "ls", "--state-dir", str(state), cwd=tmp_path)
    assert_clean(listing.stdout)

    # The transcript replayed on --resume (of a fork taken before the final answer).
    fork = ["session", "fork", "h", "--at", "6", "--name", "f", "--state-dir", str(state)]
    assert fisk(*fork, cwd=tmp_path).returncode == 0
    api.add(Reply.text("done"))
    resumed = fisk(*run[:-1], "--resume", "f", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "transcript so far" in resumed.stderr and f"-> no_such_{shown}" in resumed.stderr
    assert_clean(resumed.stderr)


def test_an_api_error_message_is_sanitized(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.error(400, message=HOSTILE))
    done = fisk("run", "-c", str(agent), "hi", cwd=tmp_path)
    assert done.returncode == 1
    assert_clean(done.stderr)
    assert "failed: llm call: HTTP 400: ABCDEFGHI" in done.stderr


def test_a_malformed_reply_message_is_sanitized(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.body({"content": [{"type": "tool_use", "name": HOSTILE, "input": {}}]}))
    done = fisk("run", "-c", str(agent), "hi", cwd=tmp_path)
    assert done.returncode == 1
    assert_clean(done.stderr)
    assert "failed: malformed model reply:" in done.stderr


def test_the_answer_on_a_terminal_is_sanitized(
    agent: Path, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.text(f"line one {HOSTILE}\nline two"))
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [*CLI, "run", "-c", str(agent), "hi"],
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        os.close(follower)
        follower = -1
        out = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.returncode == 0, done.stderr
    text = out.decode()
    assert text.replace("\r\n", "\n") == "line one ABCDEFGHI\nline two\n"
    assert_clean(text.replace("\r\n", "\n"))

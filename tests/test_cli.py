"""The `fisk-sm` command as a user runs it: real subprocesses, real files, loopback only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]


def fisk_sm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "ANTHROPIC_API_KEY": "test", **(env or {})}
    full_env.pop("ANTHROPIC_BASE_URL", None) if env is None else None
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=full_env, timeout=60, check=False
    )


def test_make_demo_prints_the_answer_on_stdout_and_tool_calls_on_stderr() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = done.stdout.splitlines()[-1]
    assert answer == "(17 + 25) × 3 = 126"
    assert "-> add" not in done.stdout
    assert '-> add {"a": 17, "b": 25}' in done.stderr
    assert '-> multiply {"a": 42, "b": 3}' in done.stderr
    assert "· budget_check (iteration 1)" in done.stderr
    assert "3 llm calls · 2 tool calls" in done.stderr


def write_agent(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("llm: {}\n", "llm.model: required"),
        ("llm: {model: m}\nsurprise: 1\n", "surprise: unknown key"),
        ("llm: {model: m, budget: {max_tokens: -5}}\n", "llm.budget.max_tokens: must not be"),
        ("llm: {model: m, budget: {call_timeout: soon}}\n", "llm.budget.call_timeout: invalid"),
        ("llm: {model: m, base_url: 'http://example.com'}\n", "llm.base_url:"),
        ("llm: {model: m, base_url: 'http://localhost.evil.com'}\n", "llm.base_url:"),
        ("llm: {model: m}\ntools: [{python: 'nosuchmodule:f'}]\n", "tools[0].python: cannot"),
    ],
)
def test_config_errors_print_one_line_naming_the_field_and_exit_2(
    tmp_path: Path, body: str, field: str
) -> None:
    agent = write_agent(tmp_path, body)
    done = fisk_sm("run", "-c", str(agent), "hello")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert field in lines[0]
    assert "Traceback" not in done.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "llm: {}\n")
    done = fisk_sm("--debug", "run", "-c", str(agent))
    assert done.returncode != 0
    assert "Traceback" in done.stderr


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    done = fisk_sm("run", "-c", str(tmp_path / "absent.yaml"), "x")
    assert done.returncode == 2
    assert "absent.yaml" in done.stderr and len(done.stderr.splitlines()) == 1


def test_run_loads_python_tools_relative_to_the_config_and_exits_by_outcome(
    tmp_path: Path,
) -> None:
    (tmp_path / "my_tools.py").write_text(
        "def shout(text: str) -> str:\n    '''Shout.'''\n    return text.upper()\n"
    )
    agent = write_agent(tmp_path, "llm: {model: m}\ntools: [{python: 'my_tools:shout'}]\n")
    with FakeMessagesAPI([Reply.tool_use("shout", {"text": "hey"}), Reply.text("HEY")]) as api:
        done = fisk_sm(
            "run", "-c", str(agent), "shout", "hey", env={"ANTHROPIC_BASE_URL": api.base_url}
        )
        [prompt] = api.requests[0]["messages"][0]["content"]  # a block, for its cache breakpoint
        assert prompt["text"] == "shout hey"
        assert api.requests[1]["messages"][-1]["content"][0]["content"] == "HEY"
    assert done.returncode == 0, done.stderr
    assert done.stdout == "HEY\n"
    with FakeMessagesAPI([Reply.text("no", stop_reason="refusal")]) as api:
        done = fisk_sm("run", "-c", str(agent), env={"ANTHROPIC_BASE_URL": api.base_url})
        assert api.requests[0]["messages"][0]["content"][0]["text"] == "assist the user"
    assert done.returncode == 1
    assert done.stdout == ""
    assert "failed: model refused to respond" in done.stderr


def test_fake_api_command_serves_a_script(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- text: served\n")
    proc = subprocess.Popen(
        [*CLI, "fake-api", "--script", str(script), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "listening on http://127.0.0.1:" in line
        base_url = line.split("listening on ")[1].split()[0]
        agent = write_agent(tmp_path, f"llm: {{model: m, base_url: '{base_url}'}}\n")
        done = fisk_sm("run", "-c", str(agent), "hi")
        assert done.stdout == "served\n"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_help_explains_each_command() -> None:
    for command in ("run", "diagram", "fake-api"):
        done = fisk_sm(command, "--help")
        assert done.returncode == 0
        assert "usage: fisk-sm" in done.stdout
    assert "--trace" in fisk_sm("run", "--help").stdout

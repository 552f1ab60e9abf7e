"""Sessions are found where the user is: without `-c` or `--state-dir`, `fisk-sm session ...`
(and `report`/`diagram --session`, which read sessions the same way) use the agent.yaml of the
current directory, and `session ls` names the store it lists on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]


def fisk(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=60
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A private XDG state home, so that the default store is known (and holds one session of
    its own, to tell the two apart)."""
    return {
        **os.environ,
        "ANTHROPIC_API_KEY": "test",
        "XDG_STATE_HOME": str(tmp_path / "xdg"),
    }


def record(cwd: Path, env: dict[str, str], name: str, *where: str) -> None:
    with FakeMessagesAPI([Reply.text(f"answer {name}")]) as api:
        (cwd / "agent.yaml").write_text(
            f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
            "harness: {sessions: {options: {directory: sessions}}}\n"
        )
        done = fisk(cwd, env, "run", *where, "--checkpoint", "--name", name, "go")
        assert done.returncode == 0, done.stderr


def test_session_commands_use_the_agent_yaml_of_the_current_directory(
    tmp_path: Path, env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    record(project, env, "mine", "-c", "agent.yaml")
    assert (project / "sessions" / "mine.json").is_file()
    # one in the XDG default too, which a listing next to the agent must not show
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    record(
        elsewhere,
        env,
        "xdg",
        "-c",
        str(elsewhere / "agent.yaml"),
        "--state-dir",
        str(tmp_path / "xdg" / "fisk-sm" / "runs"),
    )
    (elsewhere / "agent.yaml").unlink()

    listed = fisk(project, env, "session", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in json.loads(listed.stdout)] == ["mine"]  # stdout stays JSON
    assert listed.stderr.splitlines()[0] == (
        f"sessions in {project / 'sessions'} (from ./agent.yaml)"
    )

    table = fisk(project, env, "session", "ls")
    assert table.stdout.splitlines()[0].startswith("ID ")
    assert "mine" in table.stdout and "xdg" not in table.stdout
    assert "(from ./agent.yaml)" in table.stderr

    shown = fisk(project, env, "session", "show", "mine")
    assert shown.returncode == 0, shown.stderr
    assert "session:        mine" in shown.stdout

    # report and diagram --session read sessions through the same choice
    diagram = fisk(project, env, "diagram", "--session", "mine")
    assert diagram.returncode == 0, diagram.stderr

    # elsewhere (no agent.yaml) the default is listed, and the header says so
    default = fisk(elsewhere, env, "session", "ls", "--json")
    assert [row["id"] for row in json.loads(default.stdout)] == ["xdg"]
    xdg_runs = tmp_path / "xdg" / "fisk-sm" / "runs"
    assert default.stderr.splitlines()[0] == (
        f"sessions in {xdg_runs} (the default: no --state-dir, -c or ./agent.yaml)"
    )

    # --state-dir and -c still win over ./agent.yaml, and say so
    explicit = fisk(project, env, "session", "ls", "--json", "--state-dir", str(xdg_runs))
    assert [row["id"] for row in json.loads(explicit.stdout)] == ["xdg"]
    assert explicit.stderr.splitlines()[0] == f"sessions in {xdg_runs} (from --state-dir)"
    named = fisk(elsewhere, env, "session", "ls", "-c", str(project / "agent.yaml"))
    assert "mine" in named.stdout
    assert f"(from -c {project / 'agent.yaml'})" in named.stderr


def test_an_agent_yaml_without_a_sessions_directory_lists_the_default(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "agent.yaml").write_text("llm: {model: m}\n")
    listed = fisk(tmp_path, env, "session", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    xdg_runs = tmp_path / "xdg" / "fisk-sm" / "runs"
    assert listed.stderr.splitlines()[0] == (
        f"sessions in {xdg_runs} (the default: ./agent.yaml sets no sessions directory)"
    )


def test_a_broken_agent_yaml_here_is_named_in_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "agent.yaml").write_text("llm: [not, a, mapping]\n")
    listed = fisk(tmp_path, env, "session", "ls")
    assert listed.returncode == 2
    assert "agent.yaml" in listed.stderr and len(listed.stderr.splitlines()) == 1
    assert "Traceback" not in listed.stderr

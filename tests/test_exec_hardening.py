"""Exec tool hardening: nothing lingers, read-only stdin, no option injection, no credentials."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prockit import alive

from fisk_sm.config.agent import ConfigError
from fisk_sm.config.exec import ExecToolSpec, parse_exec_tool
from fisk_sm.config.names import secret_env_name
from fisk_sm.tools import ToolBox
from fisk_sm.tools.base import ToolError
from fisk_sm.tools.exec import build_argv, exec_tool
from fisk_sm.tools.process import run_command

PY = sys.executable
PRINT_ARGV = [PY, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]
PRINT_ENV = [PY, "-c", "import os, json; print(json.dumps(dict(os.environ)))"]
#: How long to wait for a fact (a call's end, a process gone) before failing: a guard against
#: a hang, never a measure of speed. The leftovers below sleep far longer, so none of them can
#: pass for killed by ending on its own within it.
GUARD = 120.0


def survivors(pids: list[int], within: float = GUARD) -> list[int]:
    """The pids still alive once they all died, or after `within` seconds (a hang guard)."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p for p in pids if alive(p)]


def carrying(marker: str) -> list[int]:
    """Live processes with `marker` among their argv."""
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return [p for p in pids if alive(p)]


def kill_if_alive(*pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


async def run(argv: list[str], tmp_path: Path, **options: Any) -> dict[str, Any]:
    return await asyncio.wait_for(
        run_command(argv, timeout=None, work_dir=tmp_path, **options), GUARD
    )


def spec_of(**raw: Any) -> ExecToolSpec:
    return parse_exec_tool(raw, index=2, source="agent.yaml")


# --- nothing lingers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    [
        "sleep 600 & echo $!",  # the sleeper holds the output pipe
        "sleep 600 >/dev/null 2>&1 & echo $!",  # it does not, and would merely linger
    ],
)
async def test_what_the_program_leaves_behind_is_killed_when_it_exits(
    tmp_path: Path, script: str
) -> None:
    result = await run(["sh", "-c", script], tmp_path)
    grandchild = int(result["output"])
    try:
        assert result["exit_code"] == 0
        assert survivors([grandchild]) == []
    finally:
        kill_if_alive(grandchild)


@pytest.mark.parametrize("lines", [7000, 25600])
async def test_output_written_before_exit_is_whole_although_the_group_is_killed(
    tmp_path: Path, lines: int
) -> None:
    # The program writes, leaves a sleeper holding the pipe and exits at once: the group is
    # killed with its output possibly still unread in the pipe.
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        f"body = ''.join('%07d\\n' % i for i in range({lines}))\n"
        "sys.stdout.write(f'{child.pid}\\n' + body + 'END\\n')\n"
    )
    result = await run([PY, "-c", script], tmp_path)
    output = result["output"]
    grandchild = int(output.split("\n", 1)[0])
    try:
        data = f"{grandchild}\n" + "".join(f"{i:07d}\n" for i in range(lines)) + "END\n"
        if len(data) <= 65536:
            assert output == data and "truncated" not in result
        else:
            left_out = f"{len(data) - 65536} of {len(data)} bytes left out"
            cut = f"\n...[output truncated: {left_out}]...\n"
            assert output == data[:32768] + cut + data[-32768:]
            assert result["truncated"] is True
        assert result["exit_code"] == 0
        assert survivors([grandchild]) == []
    finally:
        kill_if_alive(grandchild)


async def test_a_cancel_landing_while_the_program_starts_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    # The program and the child it starts at once carry a marker: none of them may survive a
    # cancel, whichever step of the start it lands on.
    marker = f"fisk-marker-{uuid.uuid4()}"
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n"
        "time.sleep(600)\n"
    )
    for steps in range(8):
        task = asyncio.create_task(
            run_command([PY, "-c", script, marker], timeout=None, work_dir=tmp_path)
        )
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    try:
        assert survivors(carrying(marker)) == []
    finally:
        for pid in carrying(marker):  # what a failure left: each in a group of its own
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) != os.getpgrp():
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


# --- stdin -----------------------------------------------------------------------------------


async def test_stdin_is_dev_null_opened_read_only(tmp_path: Path) -> None:
    script = (
        "import fcntl, os\n"
        "print(fcntl.fcntl(0, fcntl.F_GETFL) & os.O_ACCMODE)\n"
        "print(os.path.realpath('/proc/self/fd/0'))\n"
    )
    result = await run([PY, "-c", script], tmp_path)
    mode, path = result["output"].splitlines()
    assert int(mode) == os.O_RDONLY
    assert path == os.devnull


# --- option injection ------------------------------------------------------------------------

GREP = {
    "name": "grep",
    "command": [*PRINT_ARGV, "{pattern}", "{count}", "{ratio}", "{mode}", "{flag}"],
    "arguments": [
        {"name": "pattern", "type": "string"},
        {"name": "count", "type": "integer"},
        {"name": "ratio", "type": "number"},
        {"name": "mode", "type": "enum", "values": ["-r", "-l"]},
        {"name": "flag", "type": "string", "default": "--verbose"},
    ],
}
REFUSAL = (
    "tool 'grep': argument 'pattern': must not start with '-' (it would be read as an option);"
    " declare allow_options: true to permit it"
)


@pytest.mark.parametrize("value", ["--help", "-e", "-", "--output=/etc/passwd"])
def test_a_string_value_starting_with_a_dash_is_refused(value: str) -> None:
    with pytest.raises(ToolError) as caught:
        build_argv(spec_of(**GREP), {"pattern": value})
    assert str(caught.value) == REFUSAL


async def test_the_refusal_reaches_the_model_and_nothing_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    spec = spec_of(
        name="grep",
        command=[PY, "-c", f"open({str(ran)!r}, 'w')", "{pattern}"],
        arguments=[{"name": "pattern", "type": "string", "required": True}],
    )
    outcome = await ToolBox.of([exec_tool(spec, work_dir=tmp_path)]).invoke(
        "grep", {"pattern": "--help"}
    )
    assert outcome.is_error
    assert REFUSAL in outcome.content
    assert not ran.exists()


def test_numbers_enum_values_defaults_and_inner_dashes_stay_allowed() -> None:
    spec = spec_of(**GREP)
    argv = build_argv(spec, {"pattern": "a-b", "count": -5, "ratio": -2.5, "mode": "-r"})
    assert argv[len(PRINT_ARGV) :] == ["a-b", "-5", "-2.5", "-r", "--verbose"]


def test_allow_options_lets_a_dash_through() -> None:
    raw = {
        **GREP,
        "arguments": [{"name": "pattern", "allow_options": True}, *GREP["arguments"][1:]],
    }
    spec = spec_of(**raw)
    assert spec.arguments[0].allow_options is True
    assert build_argv(spec, {"pattern": "--help"})[len(PRINT_ARGV)] == "--help"
    assert spec_of(**GREP).arguments[0].allow_options is False


@pytest.mark.parametrize(
    ("argument", "problem"),
    [
        ({"name": "pattern", "allow_options": "yes"}, "expected a bool, got 'yes'"),
        ({"name": "pattern", "type": "integer", "allow_options": True}, "only a string argument"),
    ],
)
def test_a_bad_allow_options_is_a_config_error(argument: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spec_of(name="grep", command=["grep", "{pattern}"], arguments=[argument])
    text = str(caught.value)
    assert text.startswith("agent.yaml: tools[2] (grep).arguments[0].allow_options: ")
    assert problem in text and "\n" not in text


# --- credentials -----------------------------------------------------------------------------

SECRETS = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_ADMIN_KEY",
    "ANTHROPIC_ANYTHING",
    "anthropic_api_key",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
    "GITHUB_TOKEN",
    "github_token",
    "DB_PASSWORD",
    "MY_SECRET_THING",
    "STRIPE_KEY",
]
KEEPERS = [
    "PATH",
    "HOME",
    "LANG",
    "KEYBOARD",
    "TOKENIZERS_PARALLELISM",
    "MONKEY",
    "AWSOME",
    "SECRETARY",
    "PASSWORD_HINT",
]


@pytest.mark.parametrize(
    ("name", "secret"), [(n, True) for n in SECRETS] + [(n, False) for n in KEEPERS]
)
def test_which_names_count_as_secrets(name: str, secret: bool) -> None:
    assert secret_env_name(name) is secret


async def child_env(tmp_path: Path, env: dict[str, str], **options: Any) -> dict[str, str]:
    result = await run(PRINT_ENV, tmp_path, env=env, **options)
    child: dict[str, str] = json.loads(result["output"])
    return child


async def test_credentials_are_stripped_and_the_rest_kept(tmp_path: Path) -> None:
    env = {name: f"value-of-{name}" for name in SECRETS + KEEPERS}
    child = await child_env(tmp_path, env)
    assert [name for name in SECRETS if name in child] == []
    assert {name: child.get(name) for name in KEEPERS} == {name: env[name] for name in KEEPERS}
    assert (child["LLMFORMAT"], child["PWD"]) == ("1", str(tmp_path))


async def test_pass_env_lets_exactly_the_named_ones_through_but_never_anthropic(
    tmp_path: Path,
) -> None:
    env = {name: f"value-of-{name}" for name in SECRETS}
    passed = ["GITHUB_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_ANYTHING"]
    child = await child_env(tmp_path, env, pass_env=passed)
    assert [name for name in SECRETS if name in child] == ["GITHUB_TOKEN"]
    assert child["GITHUB_TOKEN"] == "value-of-GITHUB_TOKEN"


async def test_an_exec_tool_passes_its_declared_pass_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "gh-value")
    monkeypatch.setenv("GITLAB_TOKEN", "gl-value")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-value")
    spec = spec_of(name="env", command=PRINT_ENV, pass_env=["GITHUB_TOKEN"])
    assert spec.pass_env == ("GITHUB_TOKEN",)
    outcome = await ToolBox.of([exec_tool(spec, work_dir=tmp_path)]).invoke("env", {})
    assert not outcome.is_error
    child = json.loads(json.loads(outcome.content)["output"])
    assert child.get("GITHUB_TOKEN") == "gh-value"
    assert "GITLAB_TOKEN" not in child and "ANTHROPIC_API_KEY" not in child


@pytest.mark.parametrize(
    ("pass_env", "field", "problem"),
    [
        ("GITHUB_TOKEN", "pass_env", "expected a list of strings, got 'GITHUB_TOKEN'"),
        ([1], "pass_env", "expected a list of strings"),
        (["GITHUB-TOKEN"], "pass_env[0]", "must be a variable name"),
        (["PATH", ""], "pass_env[1]", "must be a variable name"),
        (["ANTHROPIC_API_KEY"], "pass_env[0]", "ANTHROPIC_API_KEY is never passed to a tool"),
        (["anthropic_api_key"], "pass_env[0]", "is never passed to a tool"),
    ],
)
def test_a_bad_pass_env_is_a_config_error(pass_env: object, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spec_of(name="env", command=["env"], pass_env=pass_env)
    text = str(caught.value)
    assert text.startswith(f"agent.yaml: tools[2] (env).{field}: ")
    assert problem in text and "\n" not in text

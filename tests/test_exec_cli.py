"""Exec tools through `fisk-sm run`: real subprocesses, real signals, loopback only."""

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
from prockit import alive

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
PRINT_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"
ARGV = f"[{json.dumps(sys.executable)}, '-c', '{PRINT_ARGV}', '{{text}}']"


def write(tmp_path: Path, tools: str, extra: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"llm: {{model: m}}\ntools:\n{tools}{extra}")
    return path


def hermetic_env(api_url: str, **env: str) -> dict[str, str]:
    """A child's whole environment: nothing of the developer's shell (an ANTHROPIC_BASE_URL, a
    token, a failpoint) takes part, only what a Python needs to run, and `env`."""
    kept = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return {**kept, "ANTHROPIC_API_KEY": "sk-secret", "ANTHROPIC_BASE_URL": api_url, **env}


def fisk(api_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = hermetic_env(api_url, **env)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full, timeout=STALL)


def test_arguments_reach_the_program_as_one_literal_argv_element(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    agent = write(
        tmp_path,
        f"  - name: show\n    command: {ARGV}\n"
        "    arguments: [{name: text, type: string, required: true}]\n",
    )
    hostile = f"hello; touch {tmp_path}/pwned $(id)"
    api.add(Reply.tool_use("show", {"text": hostile}), Reply.text("shown"))
    done = fisk(api.base_url, "run", "-c", str(agent), "go")
    assert done.returncode == 0, done.stderr
    result = json.loads(api.requests[1]["messages"][-1]["content"][0]["content"])
    assert json.loads(result["output"]) == [hostile]
    assert result["exit_code"] == 0
    assert not (tmp_path / "pwned").exists()
    assert api.requests[0]["tools"][0]["input_schema"]["required"] == ["text"]


def test_exec_tools_see_no_credentials_but_pass_env_and_llmformat(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    agent = write(
        tmp_path,
        "  - {name: env, command: [env], pass_env: [GITHUB_TOKEN]}\n",
        "harness: {work_dir: .}\n",
    )
    api.add(Reply.tool_use("env", {}), Reply.text("ok"))
    secrets = {"GITHUB_TOKEN": "gh-passed", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    done = fisk(api.base_url, "run", "-c", str(agent), "go", **secrets)
    assert done.returncode == 0, done.stderr
    output = json.loads(api.requests[1]["messages"][-1]["content"][0]["content"])["output"]
    lines = output.splitlines()
    assert "LLMFORMAT=1" in lines
    assert f"PWD={tmp_path}" in lines
    assert "GITHUB_TOKEN=gh-passed" in lines
    assert not [line for line in lines if line.startswith(("ANTHROPIC_", "AWS_SECRET"))]
    assert "sk-secret" not in output and "aws-secret" not in output


def test_a_second_sigint_kills_the_tool_with_its_whole_process_group(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 900 & echo $! > {pids}; echo $$ >> {pids}; wait"
    agent = write(tmp_path, f"  - {{name: hang, command: [sh, -c, '{script}']}}\n")
    api.add(Reply.tool_use("hang", {}))
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*CLI, "run", "-c", str(agent), "--checkpoint", "--state-dir", str(state), "go"],
        env=hermetic_env(api.base_url),
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    err = Lines(proc.stderr)
    try:
        deadline = time.monotonic() + STALL  # a hang guard: the tool starts in a moment
        while len(pids.read_text().split() if pids.exists() else []) < 2:
            assert proc.poll() is None, f"fisk-sm exited {proc.returncode}: {err.text()}"
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        err.wait_for("suspending at the next loop boundary")  # the first one was taken
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STALL) == 130, err.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    survivors = [pid for pid in map(int, pids.read_text().split()) if not _dies(pid)]
    assert survivors == [], f"processes {survivors} survived"


def _dies(pid: int) -> bool:
    """Whether `pid` is gone (or a zombie) once killed; a guard, far above the moment it takes."""
    deadline = time.monotonic() + STALL
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ("  - {name: say, command: [echo, '{msg}']}\n", "tools[0] (say).command[1]"),
        (
            "  - {name: say, command: [echo, '{m}'], arguments: [{name: m, type: str}]}\n",
            "tools[0] (say).arguments[0].type",
        ),
        (
            "  - {name: say, command: [echo]}\n  - {name: say, command: [ls]}\n",
            "tools[1] (say).name",
        ),
        ("  - {name: 'bad name', command: [echo]}\n", "tools[0].name"),
        ("  - {name: env, command: [env], pass_env: GITHUB_TOKEN}\n", "tools[0] (env).pass_env"),
        (
            "  - {name: env, command: [env], pass_env: [ANTHROPIC_API_KEY]}\n",
            "tools[0] (env).pass_env[0]",
        ),
        (
            "  - {name: g, command: [grep, '{p}'], arguments: [{name: p, allow_options: 1}]}\n",
            "tools[0] (g).arguments[0].allow_options",
        ),
    ],
)
def test_malformed_tool_declarations_name_the_tool_and_field(
    api: FakeMessagesAPI, tmp_path: Path, tools: str, field: str
) -> None:
    agent = write(tmp_path, tools)
    done = fisk(api.base_url, "run", "-c", str(agent), "go")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and field in done.stderr, done.stderr
    assert api.requests == []


def test_an_argument_that_would_be_an_option_is_refused_to_the_model(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    agent = write(
        tmp_path,
        f"  - name: show\n    command: {ARGV}\n"
        "    arguments: [{name: text, type: string, required: true}]\n",
    )
    api.add(Reply.tool_use("show", {"text": "--help"}), Reply.text("refused"))
    done = fisk(api.base_url, "run", "-c", str(agent), "go")
    assert done.returncode == 0, done.stderr
    block = api.requests[1]["messages"][-1]["content"][0]
    assert block.get("is_error") is True
    assert "must not start with '-' (it would be read as an option)" in block["content"]


def test_a_bad_selection_regex_is_named(api: FakeMessagesAPI, tmp_path: Path) -> None:
    agent = write(
        tmp_path,
        "  - {name: a, command: [echo]}\n",
        "harness: {tools: {exclude: {names: ['(']}}}\n",
    )
    done = fisk(api.base_url, "info", "-c", str(agent))
    assert done.returncode == 2
    assert "harness.tools.exclude.names: invalid regex '('" in done.stderr


def test_info_lists_tools_with_kind_tags_and_gating(api: FakeMessagesAPI, tmp_path: Path) -> None:
    agent = write(
        tmp_path,
        "  - {name: say, command: [echo], tags: [ai:confirm]}\n"
        "  - {name: gone, command: [echo], tags: [ai:deny]}\n",
        "harness: {confirm_tags: [deploy], memory: {enabled: true, options: {directory: mem}}}\n",
    )
    done = fisk(api.base_url, "info", "-c", str(agent))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert rows["say"].split()[1] == "exec" and "yes (ai:confirm)" in rows["say"]
    assert rows["memory_write"].split()[1] == "memory" and rows["memory_write"].endswith("no")
    assert "not offered (ai:deny or the tool selection): gone" in done.stdout
    assert f"location        {tmp_path / 'mem'}" in done.stdout
    assert "warning: confirm_tag_unmatched deploy" in done.stdout

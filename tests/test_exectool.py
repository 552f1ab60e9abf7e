"""Exec tools: declarations, argv building (never a shell), and real subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prockit import alive

from fisk_sm.config.agent import ConfigError
from fisk_sm.config.exec import Argument, ExecToolSpec, parse_exec_tool, placeholders
from fisk_sm.tools import ToolBox
from fisk_sm.tools.base import ToolError
from fisk_sm.tools.exec import build_argv, exec_tool, input_schema
from fisk_sm.tools.process import run_command

PY = sys.executable
PRINT_ARGV = [PY, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]
#: 200 KiB of output keeps 64 KiB; the marker says how much of it was left out.
MARKER = "\n...[output truncated: 139264 of 204800 bytes left out]...\n"


def spec_of(**raw: Any) -> ExecToolSpec:
    return parse_exec_tool(raw, index=2, source="agent.yaml")


#: How long to wait for a fact (a process gone, a file written) before failing: a guard
#: against a hang, far above what any machine needs, never a measure of speed.
GUARD = 120.0


def wait_dead(*pids: int, within: float = GUARD) -> list[int]:
    """The pids still alive once they all died, or after `within` seconds (a hang guard)."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p for p in pids if alive(p)]


def resolved(path: Path) -> str:
    return str(path.resolve())


def read_if_there(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


async def wait_for_file(path: Path, within: float = GUARD) -> str:
    deadline = time.monotonic() + within
    while not (text := read_if_there(path)):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)
    return text


def hanging_family(tmp_path: Path) -> list[str]:
    """A shell that starts a grandchild, records both pids, and waits forever.

    Each pid file is written whole and then renamed into place, so a reader never sees half.
    """
    script = (
        f"sleep 300 & echo $! > {tmp_path}/grandchild.tmp; mv {tmp_path}/grandchild.tmp"
        f" {tmp_path}/grandchild; echo $$ > {tmp_path}/child.tmp; mv {tmp_path}/child.tmp"
        f" {tmp_path}/child; wait"
    )
    return ["sh", "-c", script]


async def family_pids(tmp_path: Path) -> tuple[int, int]:
    """The (child, grandchild) pids of `hanging_family`, once both are running."""
    grandchild = int(await wait_for_file(tmp_path / "grandchild"))
    child = int(await wait_for_file(tmp_path / "child"))
    return child, grandchild


# --- declarations ---------------------------------------------------------------------------


def test_a_full_declaration_parses() -> None:
    spec = spec_of(
        name="say",
        description="Say something with a cow",
        command=["cowsay", "{message}", "--style={style}"],
        arguments=[
            {"name": "message", "type": "string", "required": True, "description": "What"},
            {"name": "style", "type": "enum", "values": ["plain", "fancy"]},
        ],
        tags=["ai:confirm"],
        timeout="1m30s",
        crash_policy="ask",
    )
    assert spec == ExecToolSpec(
        name="say",
        description="Say something with a cow",
        command=("cowsay", "{message}", "--style={style}"),
        arguments=(
            Argument("message", "string", required=True, description="What"),
            Argument("style", "enum", values=("plain", "fancy")),
        ),
        tags=("ai:confirm",),
        timeout=90.0,
        crash_policy="ask",
    )
    bare = spec_of(name="ls", command=["ls"])
    assert (bare.description, bare.timeout, bare.crash_policy) == ("Run ls", None, "retry")


def test_placeholders_and_literal_braces() -> None:
    assert placeholders("--{a}={b_2}") == ["a", "b_2"]
    assert placeholders("{{a}} {{}}") == []
    with pytest.raises(ValueError, match="stray"):
        placeholders("{1}")


MESSAGE = {"name": "message", "type": "string"}


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (
            {"command": ["echo", "{x}"], "arguments": [MESSAGE]},
            "tools[2] (say).arguments[0]",
            "argument 'message' is not used by the command",
        ),
        (
            {"command": ["echo", "{message}", "{x}"], "arguments": [MESSAGE]},
            "tools[2] (say).command[2]",
            "placeholder {x} has no argument",
        ),
        (
            {"command": ["echo", "{message}"], "arguments": [{"name": "message", "type": "str"}]},
            "tools[2] (say).arguments[0].type",
            "type must be one of string, integer, number, boolean, enum; got 'str'",
        ),
        (
            {"command": ["echo", "{message}"], "arguments": [MESSAGE, MESSAGE]},
            "tools[2] (say).arguments[1].name",
            "duplicate argument name 'message'",
        ),
        (
            {"command": ["echo", "{message}"], "arguments": [{"name": "message", "type": "enum"}]},
            "tools[2] (say).arguments[0].values",
            "an enum argument needs a non-empty list of values",
        ),
        (
            {
                "command": ["echo", "{m}"],
                "arguments": [{"name": "m", "type": "enum", "values": []}],
            },
            "tools[2] (say).arguments[0].values",
            "must not be empty",
        ),
        ({"command": ["sleep"], "timeout": "soon"}, "tools[2] (say).timeout", "invalid duration"),
        ({"command": ["sleep"], "timeout": "0s"}, "tools[2] (say).timeout", "must be a positive"),
        ({"command": ["ls"], "shell": True}, "tools[2] (say).shell", "unknown key"),
        ({"command": "ls -l"}, "tools[2] (say).command", "expected a list of strings"),
        ({"command": []}, "tools[2] (say).command", "must not be empty"),
        ({}, "tools[2] (say).command", "missing"),
        ({"command": ["{message}"], "arguments": [MESSAGE]}, "tools[2] (say).command[0]", "fixed"),
        ({"command": ["awk", "{print $1}"]}, "tools[2] (say).command[1]", "stray"),
        ({"command": ["ls"], "crash_policy": "never"}, "tools[2] (say).crash_policy", "one of"),
        ({"command": ["ls"], "tags": "ai:confirm"}, "tools[2] (say).tags", "list of strings"),
        ({"command": ["ls"], "description": 3}, "tools[2] (say).description", "a string"),
        ({"name": "say it", "command": ["ls"]}, "tools[2].name", "'say it'"),
        ({"name": "x" * 65, "command": ["ls"]}, "tools[2].name", "must match"),
        ({"name": None, "command": ["ls"]}, "tools[2].name", "missing"),
    ],
)
def test_malformed_declarations_name_the_tool_and_field(
    raw: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        spec_of(**{"name": "say", **raw})
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"agent.yaml: {field}: ")
    assert problem in text


def test_input_schema_is_exact() -> None:
    spec = spec_of(
        name="t",
        command=["t", "{s}", "{i}", "{n}", "{b}", "{e}"],
        arguments=[
            {"name": "s", "type": "string", "required": True, "description": "a string"},
            {"name": "i", "type": "integer", "default": 3},
            {"name": "n", "type": "number"},
            {"name": "b", "type": "boolean", "description": "a flag"},
            {"name": "e", "type": "enum", "values": ["x", "y"], "required": True},
        ],
    )
    assert input_schema(spec) == {
        "type": "object",
        "properties": {
            "s": {"type": "string", "description": "a string"},
            "i": {"type": "integer", "default": 3},
            "n": {"type": "number"},
            "b": {"type": "boolean", "description": "a flag"},
            "e": {"type": "string", "enum": ["x", "y"]},
        },
        "required": ["s", "e"],
        "additionalProperties": False,
    }
    assert "required" not in input_schema(spec_of(name="ls", command=["ls"]))


# --- argv ------------------------------------------------------------------------------------

TYPED = {
    "name": "typed",
    "command": ["prog", "--count={count}", "{ratio}", "--flag={flag}", "{mode}", "{{lit}}"],
    "arguments": [
        {"name": "count", "type": "integer"},
        {"name": "ratio", "type": "number"},
        {"name": "flag", "type": "boolean"},
        {"name": "mode", "type": "enum", "values": ["fast", "slow"], "default": "slow"},
    ],
}


def test_values_are_rendered_and_missing_optional_elements_dropped() -> None:
    spec = spec_of(**TYPED)
    argv = build_argv(spec, {"count": 3, "ratio": 2.5, "flag": True, "mode": "fast"})
    assert argv == ["prog", "--count=3", "2.5", "--flag=true", "fast", "{lit}"]
    assert build_argv(spec, {"flag": False}) == ["prog", "--flag=false", "slow", "{lit}"]
    assert build_argv(spec, {"ratio": 3, "count": 4.0}) == [
        "prog",
        "--count=4",
        "3",
        "slow",
        "{lit}",
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"count": "3"}, "argument 'count': expected an integer, got '3'"),
        ({"count": True}, "argument 'count': expected an integer"),
        ({"count": 2.5}, "argument 'count': expected an integer"),
        ({"ratio": "2.5"}, "argument 'ratio': expected a number"),
        ({"flag": "true"}, "argument 'flag': expected a boolean"),
        ({"mode": "medium"}, "argument 'mode': must be one of fast, slow; got 'medium'"),
        ({"color": "red"}, "has no argument(s): color"),
    ],
)
def test_values_that_do_not_fit_are_tool_errors(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolError) as caught:
        build_argv(spec_of(**TYPED), arguments)
    assert problem in str(caught.value)


def test_a_missing_required_argument_is_a_tool_error() -> None:
    spec = spec_of(name="e", command=["echo", "{m}"], arguments=[{"name": "m", "required": True}])
    with pytest.raises(ToolError, match="argument 'm' is required"):
        build_argv(spec, {})


# --- processes --------------------------------------------------------------------------------


async def test_a_hostile_value_is_one_literal_argv_element(tmp_path: Path) -> None:
    spec = spec_of(
        name="argv",
        command=[*PRINT_ARGV, "{text}"],
        arguments=[{"name": "text", "type": "string", "required": True}],
    )
    hostile = f"hello; touch {tmp_path}/pwned $(id) `id` && echo hi > {tmp_path}/pwned"
    outcome = await ToolBox.of([exec_tool(spec, work_dir=tmp_path)]).invoke(
        "argv", {"text": hostile}
    )
    assert not outcome.is_error
    result = json.loads(outcome.content)
    assert json.loads(result["output"]) == [hostile]
    assert result["exit_code"] == 0
    assert not (tmp_path / "pwned").exists()


#: An environment given in full, so that nothing of the developer's shell (an
#: ANTHROPIC_BASE_URL, a token) takes part in the test.
HERMETIC = {
    "PATH": os.defpath,
    "ANTHROPIC_API_KEY": "sk-secret",
    "ANTHROPIC_AUTH_TOKEN": "tok-secret",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/secret",
    "FISK_KEEP_ME": "kept",
}


async def test_the_environment_is_scrubbed(tmp_path: Path) -> None:
    result = await run_command(["env"], timeout=None, work_dir=tmp_path, env=HERMETIC)
    lines = result["output"].splitlines()
    # Plus the containment cookie that marks the tool's processes (fisk_sm.tools.reaper).
    [cookie] = [line for line in lines if line.startswith("FISK_SM_COOKIE=")]
    assert cookie.startswith(f"FISK_SM_COOKIE={os.getpid()}-")
    assert sorted(lines) == sorted(
        [f"PATH={os.defpath}", "FISK_KEEP_ME=kept", "LLMFORMAT=1", f"PWD={tmp_path}", cookie]
    )
    pwd = await run_command(
        [PY, "-c", "import os; print(os.getcwd())"], timeout=None, work_dir=tmp_path, env={}
    )
    assert pwd["output"].strip() == resolved(tmp_path)


async def test_by_default_the_scrubbed_environment_is_this_process_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in HERMETIC.items():
        monkeypatch.setenv(name, value)
    result = await run_command(["env"], timeout=None, work_dir=tmp_path)
    lines = result["output"].splitlines()
    assert "FISK_KEEP_ME=kept" in lines and "LLMFORMAT=1" in lines
    assert not [line for line in lines if line.startswith("ANTHROPIC_")]
    assert "sk-secret" not in result["output"] and "tok-secret" not in result["output"]


async def test_large_output_keeps_head_and_tail(tmp_path: Path) -> None:
    script = "import sys; sys.stdout.buffer.write(b''.join(b'%07d\\n' % i for i in range(25600)))"
    data = b"".join(b"%07d\n" % i for i in range(25600)).decode()
    assert len(data) == 200 * 1024
    result = await run_command([PY, "-c", script], timeout=30, work_dir=tmp_path)
    assert result["truncated"] is True
    assert result["output"] == data[:32768] + MARKER + data[-32768:]
    exact = await run_command(
        [PY, "-c", "import sys; sys.stdout.write('x' * 65536)"], timeout=30, work_dir=tmp_path
    )
    assert exact["output"] == "x" * 65536 and "truncated" not in exact


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    # The family never exits by itself: only the timeout can end the call (GUARD: a hang guard).
    # On a loaded machine the timeout may fire before the shell wrote its pid files; then there
    # is nothing to check, so the trial is repeated with a longer timeout rather than passed.
    for timeout in (2, 8, 30):
        family = tmp_path / f"t{timeout}"
        family.mkdir()
        call = run_command(hanging_family(family), timeout=timeout, work_dir=family)
        with pytest.raises(ToolError, match=rf"^command timed out after {timeout}s: sh -c "):
            await asyncio.wait_for(call, GUARD)
        if (family / "child").exists() and (family / "grandchild").exists():
            pids = [int((family / name).read_text()) for name in ("child", "grandchild")]
            assert wait_dead(*pids) == []
            return
    pytest.fail("the shell never wrote its pid files before the timeout")


async def test_cancellation_kills_the_whole_process_group(tmp_path: Path) -> None:
    task = asyncio.create_task(
        run_command(hanging_family(tmp_path), timeout=None, work_dir=tmp_path)
    )
    child, grandchild = await family_pids(tmp_path)  # both run: the cancel lands mid-wait
    assert alive(child) and alive(grandchild)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_dead(child, grandchild) == []


async def test_a_cancel_landing_inside_the_spawn_kills_the_whole_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spawn (loop.subprocess_exec) is held open until the program and its grandchild both
    # run, and the cancel lands right there: inside the spawn, with a family already started.
    loop = asyncio.get_running_loop()
    spawning, release = asyncio.Event(), asyncio.Event()
    real_exec = loop.subprocess_exec

    async def held_exec(*args: Any, **kwargs: Any) -> Any:
        spawned = await real_exec(*args, **kwargs)
        spawning.set()
        await release.wait()
        return spawned

    monkeypatch.setattr(loop, "subprocess_exec", held_exec)
    task = asyncio.create_task(
        run_command(hanging_family(tmp_path), timeout=None, work_dir=tmp_path)
    )
    await spawning.wait()
    child, grandchild = await family_pids(tmp_path)
    task.cancel()
    await asyncio.sleep(0)  # the cancel is delivered while the spawn is still held ...
    release.set()  # ... and only then does the spawn return
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_dead(child, grandchild) == []


async def test_a_process_that_escaped_holds_the_pipe_only_for_wait_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The group and the containment are killed when the program exits; without a cgroup, a
    # child that made its own session and cleared its environment (no cookie), orphaned by then,
    # escapes both and keeps the pipe open, so the output is cut after WAIT_DELAY.
    monkeypatch.setattr("fisk_sm.tools.process.WAIT_DELAY", 0.3)
    monkeypatch.setenv("FISK_SM_CGROUP", "0")
    script = (
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True, env={})\n"
        "print(child.pid)\n"
        "print('done')\n"
    )
    result = await asyncio.wait_for(
        run_command([PY, "-c", script], timeout=None, work_dir=tmp_path), GUARD
    )
    pid_line, done = result["output"].splitlines()
    try:
        assert (done, result["exit_code"]) == ("done", 0)
    finally:
        os.kill(int(pid_line), signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # an orphan re-parented to us (subreaper)
            await asyncio.to_thread(os.waitpid, int(pid_line), 0)


async def test_stdin_is_closed(tmp_path: Path) -> None:
    # Our own stdin becomes a pipe nobody writes to: a child inheriting it would block.
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        argv = [PY, "-c", "import sys; print(repr(sys.stdin.read()))"]
        call = run_command(argv, timeout=None, work_dir=tmp_path)
        result = await asyncio.wait_for(call, GUARD)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert result["output"] == "''\n"


async def test_stdout_and_stderr_are_merged_in_order_and_a_failure_is_a_result(
    tmp_path: Path,
) -> None:
    script = (
        "import sys\n"
        "for i in range(3):\n"
        "    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "sys.exit(3)\n"
    )
    result = await run_command([PY, "-c", script], timeout=10, work_dir=tmp_path)
    assert result == {
        "command": f"{PY} -c {__import__('shlex').quote(script)}",
        "exit_code": 3,
        "output": "out 0\nerr 0\nout 1\nerr 1\nout 2\nerr 2\n",
    }


async def test_a_missing_program_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot start 'no-such-program-fisk'"):
        await run_command(["no-such-program-fisk", "x"], timeout=None, work_dir=tmp_path)
    spec = spec_of(name="gone", command=["no-such-program-fisk"])
    outcome = await ToolBox.of([exec_tool(spec, work_dir=tmp_path)]).invoke("gone", {})
    assert outcome.is_error and "no-such-program-fisk" in outcome.content


async def test_a_bad_value_through_the_toolbox_is_an_error_result(tmp_path: Path) -> None:
    box = ToolBox.of([exec_tool(spec_of(**TYPED), work_dir=tmp_path)])
    outcome = await box.invoke("typed", {"count": "3"})
    assert outcome.is_error and "argument 'count'" in outcome.content


def test_the_tool_record_and_its_display() -> None:
    spec = spec_of(
        name="say",
        command=["echo", "{message}"],
        arguments=[{"name": "message", "required": True}],
        tags=["ai:confirm"],
        crash_policy="fail",
    )
    t = exec_tool(spec)
    assert (t.kind, t.tags, t.crash_policy) == ("exec", ("ai:confirm",), "fail")
    assert t.input_schema == input_schema(spec)
    assert t.describe({"message": "hi there"}) == "echo 'hi there'"
    assert t.describe({"message": "a\x1b[31mred\nline"}) == "echo 'a\\u001b[31mred\\nline'"
    assert t.describe({"message": 5}) == 'say {"message": 5}'

"""Nothing a tool starts outlives it: an exec tool's and an MCP stdio server's descendants that
left the process group (setsid, a double fork) are gone once the call ends or the run's close
returns, through the cgroup where one can be had and through the environment cookie and the
subreaper without it (`fisk_sm.tools.reaper`)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prockit import alive

from fisk_sm import MemoryJournal, Recorder, Run, parse_config
from fisk_sm.config.agent import AgentConfig
from fisk_sm.loop.harness import RunOptions
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools import reaper
from fisk_sm.tools.process import run_command

SPAWNER = Path(__file__).with_name("mcp_server_spawner.py")
PY = sys.executable
CLI = [PY, "-m", "fisk_sm.cli"]
PR_GET_CHILD_SUBREAPER = 37
#: A guard against a hang, far above what any machine needs.
GUARD = 120.0

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


@pytest.fixture(params=["cgroup", "cookie"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the cgroup (where one can be had) and with the cookie alone."""
    if request.param == "cookie":
        monkeypatch.setenv(reaper.CGROUP_SWITCH, "0")
    elif reaper._cgroup_base() is None:
        pytest.skip("no delegated cgroup v2 here")
    yield request.param


def family(pid_file: Path) -> dict[str, int]:
    """The pids a spawner wrote, by kind (`setsid`, `double`)."""
    lines = pid_file.read_text().splitlines()
    return {kind: int(pid) for kind, pid in (line.split() for line in lines)}


def exists(pid: int) -> bool:
    """Whether `pid` is in the process table at all (a zombie is)."""
    return Path(f"/proc/{pid}").exists()


def cookies_of(owner: int) -> list[int]:
    """The processes carrying a cookie that process `owner` handed out."""
    prefix = f"{owner}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for variable in environ.split(b"\0"):
            name, _, value = variable.partition(b"=")
            if name == reaper.COOKIE_NAME.encode() and any(
                cookie.startswith(prefix) for cookie in value.split(b":")
            ):
                found.append(int(entry.name))
    return found


def our_cgroups() -> list[Path]:
    base = reaper._cgroup_base()
    return [] if base is None else sorted(base.glob(f"fisk-sm-{os.getpid()}-*"))


def agent(api: FakeMessagesAPI, exec_pids: Path, mcp_pids: Path) -> AgentConfig:
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    spawn = {"name": "spawn", "command": [PY, str(SPAWNER), str(exec_pids)]}
    server = {
        "alias": "kids",
        "command": [PY, str(SPAWNER), str(mcp_pids), "--serve"],
        "confirm": False,
    }
    return parse_config({"llm": llm, "tools": [spawn], "mcp_servers": [server]}, env={})


async def test_what_left_the_group_is_gone_when_the_runs_close_returns(
    mode: str, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    exec_pids, mcp_pids = tmp_path / "exec-pids", tmp_path / "mcp-pids"
    api.add_conversation("go", Reply.tool_use("spawn", {}, id="t1"), Reply.text("done"))
    options = RunOptions(events=Recorder(), journal=MemoryJournal())
    async with Run.create(agent(api, exec_pids, mcp_pids), "go", options) as run:
        assert await asyncio.wait_for(run.run(), GUARD) == "completed"
        [result] = [
            b
            for m in api.requests_for("go")[1]["messages"]
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        assert '"exit_code": 0' in result["content"] and "spawned" in result["content"]
        # The exec tool's family went when its call ended; the server's lives with the run.
        assert [pid for pid in family(exec_pids).values() if exists(pid)] == []
        server_family = family(mcp_pids)
        assert all(alive(pid) for pid in server_family.values())
        assert cookies_of(os.getpid()) != []
    # Gone and reaped (no zombie left either), and no process carries our cookies.
    assert [pid for pid in server_family.values() if exists(pid)] == []
    assert cookies_of(os.getpid()) == []
    assert our_cgroups() == []


async def test_a_cancelled_exec_call_kills_its_orphans(mode: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    script = (
        f"import runpy, sys; sys.argv = [{str(SPAWNER)!r}, {str(pid_file)!r}];"
        f" runpy.run_path({str(SPAWNER)!r}, run_name='__main__');"
        " import time; time.sleep(1000)"
    )
    call = run_command([PY, "-c", script], timeout=None, work_dir=tmp_path)
    task = asyncio.create_task(call)
    while not pid_file.exists() or len(pid_file.read_text().splitlines()) < 2:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    pids = family(pid_file)
    assert all(alive(pid) for pid in pids.values())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [pid for pid in pids.values() if exists(pid)] == []


async def test_a_cgroup_catches_a_descendant_that_cleared_its_environment(
    tmp_path: Path,
) -> None:
    if reaper._cgroup_base() is None:
        pytest.skip("no delegated cgroup v2 here")
    pid_file = tmp_path / "pids"
    result = await asyncio.wait_for(
        run_command(
            [PY, str(SPAWNER), str(pid_file), "--clear-env"], timeout=None, work_dir=tmp_path
        ),
        GUARD,
    )
    assert result["exit_code"] == 0
    double = family(pid_file)["double"]
    assert not exists(double)
    assert our_cgroups() == []


async def test_a_nested_tools_environment_carries_both_cookies(tmp_path: Path) -> None:
    outer = {"PATH": os.environ["PATH"], reaper.COOKIE_NAME: "outer-1"}
    argv = [PY, "-c", f"import os; print(os.environ[{reaper.COOKIE_NAME!r}])"]
    result = await run_command(argv, timeout=GUARD, work_dir=tmp_path, env=outer)
    first, second = result["output"].strip().split(":")
    assert first == "outer-1" and second.startswith(f"{os.getpid()}-")


def test_fisk_sm_run_leaves_nothing_when_it_exits(
    mode: str, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    exec_pids, mcp_pids = tmp_path / "exec-pids", tmp_path / "mcp-pids"
    (tmp_path / "agent.yaml").write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        f"tools:\n  - {{name: spawn, command: ['{PY}', '{SPAWNER}', '{exec_pids}']}}\n"
        f"mcp_servers:\n  - {{alias: kids, command: ['{PY}', '{SPAWNER}', '{mcp_pids}',"
        " '--serve'], confirm: false}\n"
    )
    api.add_conversation("go", Reply.tool_use("spawn", {}, id="t1"), Reply.text("done"))
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    run = subprocess.Popen(
        [*CLI, "run", "-c", str(tmp_path / "agent.yaml"), "go"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = run.communicate(timeout=GUARD)
    assert (run.returncode, out.strip()) == (0, "done"), err
    pids = [*family(exec_pids).values(), *family(mcp_pids).values()]
    assert [pid for pid in pids if alive(pid)] == []
    assert cookies_of(run.pid) == []


def test_the_subreaper_is_set() -> None:
    linux = sys.platform.startswith("linux")
    assert reaper.enable_subreaper() is linux
    if linux:  # the attribute is not in /proc: ask the kernel
        value = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0
        assert value.value == 1


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_sigkilled_fisk_sm_run_leaves_nothing_behind(
    mode: str, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    # The run is killed while the server (and its setsid and double-forked children) live and an
    # exec call's family is running: only the guard is left to clean up.
    exec_pids, mcp_pids = tmp_path / "exec-pids", tmp_path / "mcp-pids"
    script = (
        f"import runpy, sys, time, pathlib; sys.argv = ['spawner', {str(exec_pids)!r}];"
        f" runpy.run_path({str(SPAWNER)!r}, run_name='__main__'); time.sleep(1000)"
    )
    (tmp_path / "agent.yaml").write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        f'tools:\n  - {{name: spawn, command: ["{PY}", "-c", "{script}"]}}\n'
        f"mcp_servers:\n  - {{alias: kids, command: ['{PY}', '{SPAWNER}', '{mcp_pids}',"
        " '--serve'], confirm: false}\n"
    )
    api.add_conversation("go", Reply.tool_use("spawn", {}, id="t1"), Reply.text("never"))
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    run = subprocess.Popen(
        [*CLI, "run", "-c", str(tmp_path / "agent.yaml"), "go"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lines = lambda path: len(path.read_text().splitlines()) if path.exists() else 0  # noqa: E731
        wait_until(lambda: lines(exec_pids) == 2 and lines(mcp_pids) == 2, "no family")
        pids = [*family(exec_pids).values(), *family(mcp_pids).values()]
        assert all(alive(pid) for pid in pids)
    finally:
        run.kill()
        run.wait()
    wait_until(lambda: not any(alive(pid) for pid in pids), f"survivors of {pids}")
    wait_until(lambda: cookies_of(run.pid) == [], "carriers of its cookies")
    for pid in pids:  # orphans of the killed run, re-parented to this process (a subreaper)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


#: Forks a child that forks a grandchild and exits; the grandchild exits at once (after setsid
#: with `setsid`), so it is an orphan's zombie, re-parented to the subreaper; prints its pid
#: once it is.
ORPHAN_ZOMBIE = """
import os, sys, time
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        if sys.argv[1] == "setsid":
            os.setsid()
        os._exit(0)
    os.write(write_end, str(grandchild).encode())
    os._exit(0)
os.close(write_end)
grandchild = int(os.read(read_end, 32))
os.waitpid(child, 0)
while True:
    fields = open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()
    if fields[0] == "Z" and int(fields[1]) != child:
        break
    time.sleep(0.01)
print(grandchild)
"""


@pytest.mark.parametrize("session", ["group", "setsid"])
async def test_an_orphan_that_exited_before_the_clean_up_is_reaped(
    mode: str, session: str, tmp_path: Path
) -> None:
    if (mode, session) == ("cookie", "setsid"):
        pytest.skip("without a cgroup, nothing tells that zombie apart (see the README)")
    argv = [PY, "-c", ORPHAN_ZOMBIE, session]
    result = await asyncio.wait_for(run_command(argv, timeout=None, work_dir=tmp_path), GUARD)
    assert result["exit_code"] == 0, result["output"]
    assert not exists(int(result["output"]))  # reaped, not left a zombie of ours


async def test_an_exec_program_is_in_its_cgroup_before_it_runs(tmp_path: Path) -> None:
    if reaper._cgroup_base() is None:
        pytest.skip("no delegated cgroup v2 here")
    # cat reads its cgroup first thing: only a move between fork and exec is surely before.
    result = await run_command(["cat", "/proc/self/cgroup"], timeout=GUARD, work_dir=tmp_path)
    [v2] = [line for line in result["output"].splitlines() if line.startswith("0::")]
    assert v2.rsplit("/", 1)[-1].startswith(f"fisk-sm-{os.getpid()}-")


#: A program that does nothing but exec itself again, forever: most of its time it is in the
#: middle of an exec, when its environment (and so its cookie) cannot be read.
REEXEC = '#!/bin/sh\nexec "$0"\n'
#: Starts copies of the program, each in a session of its own, prints their pids and exits: they
#: are then orphans of ours (the subreaper), which no parent link leads the scan to.
LAUNCH = """
import subprocess, sys
for _ in range(int(sys.argv[2])):
    print(subprocess.Popen([sys.argv[1]], start_new_session=True, stdout=subprocess.DEVNULL).pid)
"""


async def test_a_carrier_caught_in_the_middle_of_an_exec_is_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cookie scan ends only once every live process could be told, and a carrier it did
    not manage to kill is looked at again: one that reads as unmarked only because it is in the
    middle of an exec is not missed. Each carrier is caught there with a fair chance; a scan
    that trusts its first clean round misses one in most attempts."""
    monkeypatch.setenv(reaper.CGROUP_SWITCH, "0")  # the cookie alone: no cgroup to catch them
    program = tmp_path / "again"
    program.write_text(REEXEC)
    program.chmod(0o755)
    for attempt in range(30):
        contained = reaper.Containment()
        await contained.open()
        env = contained.environ(dict(os.environ))
        launch = await asyncio.create_subprocess_exec(
            PY, "-c", LAUNCH, str(program), "12", env=env, stdout=subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(launch.communicate(), GUARD)
        carriers = [int(word) for word in out.split()]
        try:
            await contained.close()
            assert list(filter(alive, carriers)) == [], f"attempt {attempt}: carriers survived"
        finally:
            for pid in carriers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)

"""A connect to a stdio MCP server cancelled at any point of its start leaves no process behind.

`fisk_sm.tools.mcp.connect` is cancelled at many points of the start (after each of the first
loop iterations, then after growing delays), against real servers: a small one that speaks just
enough MCP and first leaves a process in a session of its own (what only the containment of
`fisk_sm.tools.reaper` takes down), and the demo server written with the `mcp` SDK. Every process
of a server is found by a token in its command line (a descendant carries its parent's until it
execs, and this one execs with the token too); after each cancel, none may be left alive, and the
caller must see its own CancelledError.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prockit import alive

from fisk_sm.config.mcp import McpServer
from fisk_sm.tools.mcp import connect

DEMO = Path(__file__).with_name("mcp_server_demo.py")
#: A guard against a hang, far above what any machine needs (the clean-up of a cancelled start
#: takes the server's stop grace at most, and the containment's bounded clean-up).
DEADLINE = 30.0
#: Loop turns each cancelled after: the containment, the spawn and the move take about this
#: many (a cancel in them left the server alive before the start ran in a task of its own).
DENSE_TURNS = 32

#: A minimal MCP server over stdio: it first leaves a `sleep` in a session of its own (with the
#: token, argv[1], in its command line), then answers `initialize` and `tools/list`, and exits
#: at the end of its input.
TINY = r"""
import json, subprocess, sys
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
sleeper = "import time; time.sleep(3600)"
subprocess.Popen([sys.executable, "-c", sleeper, sys.argv[1]], start_new_session=True, **quiet)
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue  # a notification
    if message["method"] == "initialize":
        result = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"},
        }
    else:
        result = {"tools": [{"name": "noop", "inputSchema": {"type": "object"}}]}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


def carriers(token: str) -> list[int]:
    """The live processes (not zombies) whose command line has `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != "Z":
            found.append(int(entry.name))
    return found


def kill_all(token: str, pid_file: Path) -> None:
    """Leave nothing behind, whatever the test found (SIGKILL, no waiting)."""
    for pid in left_alive(token, pid_file):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def left_alive(token: str, pid_file: Path) -> list[int]:
    """The server's processes still alive: those with `token` in their command line, and those
    in `pid_file` (the demo server's, if it got to write it)."""
    listed = [int(word) for word in pid_file.read_text().split()] if pid_file.exists() else []
    return sorted({*carriers(token), *filter(alive, listed)})


def described(pid: int) -> str:
    """`pid`'s state, parent, cgroup and command line, for a failure's message."""
    proc = Path(f"/proc/{pid}")
    try:
        status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines())
        cgroup = (proc / "cgroup").read_text().splitlines()[-1]
        argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:80]
    except (OSError, ValueError):
        return f"{pid} (gone)"
    return f"{pid} ({status.get('State')}, parent {status.get('PPid')}, {cgroup}, {argv!r})"


async def until_gone(token: str, pid_file: Path, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while left := left_alive(token, pid_file):
        if loop.time() > end:
            pytest.fail(f"{what}: still alive: {'; '.join(map(described, left))}")
        await asyncio.sleep(0.01)


async def attempt(server: McpServer, work_dir: Path, pause: Callable[[], Awaitable[None]]) -> bool:
    """Connect, cancel the caller after `pause`, and check that the caller sees its own cancel;
    whether the connect was done before the cancel (its connection is then closed)."""
    task = asyncio.ensure_future(connect(server, work_dir))
    await pause()
    task.cancel("the caller's")
    try:
        connection = await task
    except asyncio.CancelledError as exc:
        assert exc.args == ("the caller's",)  # ours, not the starting task's
        return False
    await connection.aclose()
    return True


def loop_turns(count: int) -> Callable[[], Awaitable[None]]:
    async def pause() -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    return pause


def seconds(delay: float) -> Callable[[], Awaitable[None]]:
    async def pause() -> None:
        await asyncio.sleep(delay)

    return pause


async def sweep(
    tmp_path: Path,
    argv: Callable[[str], tuple[str, ...]],
    pauses: list[tuple[str, Callable[[], Awaitable[None]]]],
) -> int:
    """Cancel a connect after each pause in turn, until one connects first; check each time that
    no process of the server is left. Returns how many were cancelled while starting."""
    cancelled = 0
    for label, pause in pauses:
        token = f"fisk-cancel-{uuid.uuid4().hex}"
        server = McpServer("tiny", command=argv(token), timeout=DEADLINE)
        try:
            connected = await attempt(server, tmp_path, pause)
            await until_gone(token, tmp_path / token, f"cancelled after {label}")
        finally:
            kill_all(token, tmp_path / token)
        if connected:
            break
        cancelled += 1
    return cancelled


def tiny(token: str) -> tuple[str, ...]:
    return (sys.executable, "-c", TINY, token)


async def test_a_cancel_after_any_loop_turn_of_the_start_leaves_no_process(tmp_path: Path) -> None:
    """Cancelled after 0, 1, 2, ... turns of the event loop through opening the containment,
    the spawn and the move into the cgroup (the first few dozen turns, each one), then after
    turns drawn at random further on, into the handshake (a sample per run: each turn, every
    run, took 20 s for little more)."""
    turns = [*range(DENSE_TURNS), *sorted(random.sample(range(DENSE_TURNS, 200), 12))]
    cancelled = await sweep(tmp_path, tiny, [(f"{n} turns", loop_turns(n)) for n in turns])
    assert cancelled > 10  # the sweep went through the start, not past it


async def test_a_cancel_after_any_delay_of_the_start_leaves_no_process(tmp_path: Path) -> None:
    """Cancelled after growing delays, until the connect is done first."""
    delays = [n * 0.002 for n in range(500)]
    cancelled = await sweep(tmp_path, tiny, [(f"{d:g}s", seconds(d)) for d in delays])
    assert cancelled > 3


async def test_a_cancel_while_an_sdk_server_starts_leaves_no_process(tmp_path: Path) -> None:
    """The demo server (the `mcp` SDK's, which takes a while to import), cancelled after
    doubling delays, until the connect is done first."""
    # Quadrupling, each shifted at random by up to half a step (the server's start is long).
    delays = [0.0] + [0.001 * 4**n * random.uniform(1, 2) for n in range(7)]

    def demo(token: str) -> tuple[str, ...]:
        return (sys.executable, str(DEMO), "--pid-file", str(tmp_path / token), "--child")

    cancelled = await sweep(tmp_path, demo, [(f"{d:g}s", seconds(d)) for d in delays])
    assert cancelled > 3

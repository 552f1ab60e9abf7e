"""Running one program for an exec tool: its own process group, no shell, bounded output.

The process gets stdin read-only on /dev/null, a scrubbed environment (see
:func:`secret_env_name`; ``LLMFORMAT=1`` and ``PWD`` set), and its own process group and
`Containment` (`fisk_sm.tools.reaper`: a cookie in its environment, a cgroup where one can be
had), both killed whole when the program exits, times out or is cancelled, so nothing it started
lingers, not even what left the group (``setsid``, a double fork).
stdout and stderr are merged in order; output over 64 KiB keeps the first and last 32 KiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from fisk_sm.config.limits import MAX_OUTPUT
from fisk_sm.config.names import always_stripped_env_name, secret_env_name
from fisk_sm.tools.base import ToolError
from fisk_sm.tools.output import HEAD_BYTES, TAIL_BYTES, head_and_tail
from fisk_sm.tools.reaper import Containment

__all__ = [
    "HEAD_BYTES",
    "MAX_OUTPUT",
    "TAIL_BYTES",
    "WAIT_DELAY",
    "child_env",
    "kill_group",
    "run_command",
]

#: Seconds to wait for the output pipe to close after the program exited and its group and
#: containment were killed (only a process that escaped both can still hold it); then it is
#: closed and the result returned.
WAIT_DELAY = 2.0


class _Capture(asyncio.SubprocessProtocol):
    """Keeps the first and last bytes of the merged output; signals exit and end of output."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head, self.tail, self.total = bytearray(), bytearray(), 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.total += len(data)
        view = memoryview(data)
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += view[:room]
            view = view[room:]
        self.tail += view
        if len(self.tail) > TAIL_BYTES:
            del self.tail[:-TAIL_BYTES]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def output(self) -> tuple[str, bool]:
        return head_and_tail(self.head, self.tail, self.total)


_Spawned = tuple[asyncio.SubprocessTransport, _Capture]
_Started = tuple[asyncio.SubprocessTransport, _Capture, Containment]
#: Clean-ups of spawns cancelled midway, kept referenced until done.
_ABANDONED: set[asyncio.Task[None]] = set()


def child_env(
    work_dir: Path, env: Mapping[str, str] | None, pass_env: Collection[str]
) -> dict[str, str]:
    """The environment of a program fisk-sm starts (an exec tool, an MCP server): secrets
    stripped unless listed in `pass_env` (never `ANTHROPIC_*`), `PWD`, `LLMFORMAT=1`."""
    base = os.environ if env is None else env
    child = {
        name: value
        for name, value in base.items()
        if not secret_env_name(name) or (name in pass_env and not always_stripped_env_name(name))
    }
    child["LLMFORMAT"] = "1"
    child["PWD"] = str(work_dir)
    return child


def _work_dir(work_dir: Path | None) -> Path:
    cwd = Path(work_dir if work_dir is not None else Path.cwd()).absolute()
    if not cwd.is_dir():
        raise ToolError(f"work dir {str(cwd)!r} is not a directory")
    return cwd


def kill_group(pid: int) -> None:
    """SIGKILL the process group that `pid` leads (what it left behind included)."""
    # The group outlives its reaped leader while any member lives (and its id stays taken
    # meanwhile); an empty group is ProcessLookupError.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _kill_all(
    transport: asyncio.SubprocessTransport, capture: _Capture, contained: Containment
) -> None:
    """SIGKILL the whole process group and the containment, and reap the leader (the pipe is
    closed by the caller)."""
    # The containment first: it finds the processes while they live, so it can reap them.
    await contained.close()
    kill_group(transport.get_pid())
    await asyncio.wait({capture.exited}, timeout=5)


async def _abandon(spawn: asyncio.Future[_Spawned], contained: Containment) -> None:
    """Let a spawn whose caller was cancelled finish, then kill and reap what it started."""
    try:
        transport, capture = await spawn
    except (OSError, ValueError):  # it never started (as `run_command` says): nothing to kill
        await contained.close()
        return
    except BaseException:
        await contained.close()
        raise
    try:
        await _kill_all(transport, capture, contained)
    finally:
        transport.close()


async def _spawn(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> _Started:
    loop = asyncio.get_running_loop()
    contained = Containment()
    contained.environ(env)
    try:
        await contained.open()
    except BaseException:
        await contained.close()
        raise
    # subprocess.DEVNULL would be opened read-write; the program gets nothing to write to.
    stdin = os.open(os.devnull, os.O_RDONLY)
    enter = contained.enter_in_child()
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _Capture(loop),
            *argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=enter,  # into the cgroup before exec: not even its first fork is out
        )
    )
    # The child has its own copy once the spawn is done (or failed).
    spawn.add_done_callback(lambda _: os.close(stdin))
    try:
        transport, capture = await asyncio.shield(spawn)
        await contained.adopt(transport.get_pid(), entered=enter is not None)
        return transport, capture, contained
    except asyncio.CancelledError:
        # A cancel landing mid-spawn must not orphan a program that already runs: the spawn
        # goes on (shielded), and the clean-up too, even if this wait is cancelled again.
        cleanup = asyncio.ensure_future(_abandon(spawn, contained))
        _ABANDONED.add(cleanup)
        cleanup.add_done_callback(_ABANDONED.discard)
        await asyncio.shield(cleanup)
        raise
    except BaseException:
        await contained.close()  # the spawn failed: the cgroup made for it goes
        raise


async def run_command(
    argv: Sequence[str],
    *,
    timeout: float | None,  # noqa: ASYNC109 - also bounds the wait for the output
    work_dir: Path | None,
    env: Mapping[str, str] | None = None,
    pass_env: Collection[str] = (),
) -> dict[str, Any]:
    """Run argv (no shell) and return ``{"command", "exit_code", "output", "truncated"?}``.

    ``env`` replaces ``os.environ`` as the base environment; either way the names for which
    :func:`secret_env_name` holds are removed, except those in ``pass_env`` (never
    ``ANTHROPIC_*``), and ``LLMFORMAT=1`` and ``PWD=<work dir>`` are set. When the program
    exits, everything left in its process group and its containment (what left the group) is
    killed, and the output it wrote is read to the end. A non-zero exit is a normal result. A
    program that cannot start and a timeout raise :class:`ToolError`; on timeout and on
    cancellation the whole process group and containment are killed and reaped.
    """
    if not argv:
        raise ToolError("empty command")
    command = shlex.join(argv)
    cwd = _work_dir(work_dir)
    try:
        transport, capture, contained = await _spawn(argv, cwd, child_env(cwd, env, pass_env))
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ToolError(f"cannot start {argv[0]!r}: {reason}") from None
    try:
        async with asyncio.timeout(timeout):
            await asyncio.wait({capture.exited})
            # Whatever the program left behind goes with it, so that nothing lingers or holds
            # the pipe; what it wrote is still in the pipe, read up to the end of output.
            await contained.close()
            kill_group(transport.get_pid())  # where there is no /proc, the group alone
            await asyncio.wait({capture.closed}, timeout=WAIT_DELAY)
    except TimeoutError:
        await _kill_all(transport, capture, contained)
        raise ToolError(f"command timed out after {timeout:g}s: {command}") from None
    except BaseException:
        await _kill_all(transport, capture, contained)
        raise
    finally:
        transport.close()
    output, truncated = capture.output()
    exit_code = transport.get_returncode()
    result: dict[str, Any] = {
        "command": command,
        "exit_code": -1 if exit_code is None else exit_code,
        "output": output,
    }
    if truncated:
        result["truncated"] = True
    return result

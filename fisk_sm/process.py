"""Running one program for an exec tool: its own process group, no shell, bounded output.

The process gets a closed stdin, a scrubbed environment (`ANTHROPIC_*` credentials removed,
`LLMFORMAT=1`, `PWD`), its own process group (killed whole on timeout or cancellation), and
stdout and stderr merged in order; output over 64 KiB keeps the first and last 32 KiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fisk_sm.tools import ToolError

__all__ = [
    "HEAD_BYTES",
    "MAX_OUTPUT",
    "STRIPPED_ENV",
    "TAIL_BYTES",
    "TRUNCATION_MARKER",
    "WAIT_DELAY",
    "run_command",
]

STRIPPED_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_IDENTITY_TOKEN",
    "ANTHROPIC_WEBHOOK_SIGNING_KEY",
    "ANTHROPIC_CUSTOM_HEADERS",
)
MAX_OUTPUT = 65536
HEAD_BYTES = TAIL_BYTES = 32768
TRUNCATION_MARKER = "\n...[output truncated]...\n"
#: Seconds to wait for the output pipe to close after the program exited (a background
#: grandchild may hold it open); then it is closed and the result returned.
WAIT_DELAY = 10.0


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
        head, tail = (bytes(b).decode("utf-8", errors="replace") for b in (self.head, self.tail))
        if self.total > MAX_OUTPUT:
            return head + TRUNCATION_MARKER + tail, True
        return head + tail, False


def _child_env(work_dir: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    child = dict(os.environ if env is None else env)
    for name in STRIPPED_ENV:
        child.pop(name, None)
    child["LLMFORMAT"] = "1"
    child["PWD"] = str(work_dir)
    return child


def _work_dir(work_dir: Path | None) -> Path:
    cwd = Path(work_dir if work_dir is not None else Path.cwd()).absolute()
    if not cwd.is_dir():
        raise ToolError(f"work dir {str(cwd)!r} is not a directory")
    return cwd


async def _kill_group(transport: asyncio.SubprocessTransport, capture: _Capture) -> None:
    """SIGKILL the whole process group and reap its leader (the pipe is closed by the caller)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(transport.get_pid(), signal.SIGKILL)
    await asyncio.wait({capture.exited}, timeout=5)


async def run_command(
    argv: Sequence[str],
    *,
    timeout: float | None,  # noqa: ASYNC109 - also bounds the wait for the output
    work_dir: Path | None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run argv (no shell) and return ``{"command", "exit_code", "output", "truncated"?}``.

    ``env`` replaces ``os.environ`` as the base environment; either way ``STRIPPED_ENV`` is
    removed and ``LLMFORMAT=1`` and ``PWD=<work dir>`` are set. A non-zero exit is a normal
    result. A program that cannot start and a timeout raise :class:`ToolError`; on timeout and
    on cancellation the whole process group is killed and reaped.
    """
    if not argv:
        raise ToolError("empty command")
    command = shlex.join(argv)
    cwd = _work_dir(work_dir)
    loop = asyncio.get_running_loop()
    try:
        transport, capture = await loop.subprocess_exec(
            lambda: _Capture(loop),
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_child_env(cwd, env),
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ToolError(f"cannot start {argv[0]!r}: {reason}") from None
    try:
        async with asyncio.timeout(timeout):
            await asyncio.wait({capture.exited})
            # A grandchild may still hold the pipe: wait for it a while, then stop reading.
            await asyncio.wait({capture.closed}, timeout=WAIT_DELAY)
    except TimeoutError:
        await _kill_group(transport, capture)
        raise ToolError(f"command timed out after {timeout:g}s: {command}") from None
    except BaseException:
        await _kill_group(transport, capture)
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

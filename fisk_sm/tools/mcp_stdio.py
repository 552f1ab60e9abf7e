"""An MCP server over stdio, as a process the run owns.

The program runs as an argv (no shell) in the work dir, with the exec tools' scrubbed
environment (`fisk_sm.tools.process`: no credentials but `pass_env`), in its own process group
and `Containment` (`fisk_sm.tools.reaper`: a cookie in its environment, a cgroup where one can
be had).
Messages are newline-delimited JSON-RPC on its stdin and stdout, handed to the `mcp` SDK's
`ClientSession` as its two streams; the last bytes of its stderr are kept to explain a failed
start. When the transport closes, the server's stdin is closed (an MCP server exits on end of
input), it gets `STOP_GRACE` seconds to do so, and then its whole process group and containment
are killed, so nothing it started outlives the run, not even what left the group (``setsid``, a
double fork). If the run's process dies without closing it, the end of input still reaches the
server (but what the server left in other sessions lives on).

A cancel at any point, the start included, leaves nothing of the server alive: the start (the
containment, the spawn, the move into the cgroup) and the stop run in tasks of their own, which a
cancel does not interrupt (anyio's shield does not stop `asyncio.Task.cancel`, which is how
`fisk_sm.tools.mcp.connect` cancels); the cancelled caller waits for the clean-up, then sees its
own CancelledError.

The SDK's own `stdio_client` does not give out the process, and kills the group only if the
server outstays its grace; owning the group is why this module exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Collection, Coroutine, Sequence
from pathlib import Path
from typing import TypeVar

import anyio
import attrs
import mcp.types
from anyio.abc import Process
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from fisk_sm.tools.process import child_env, kill_group
from fisk_sm.tools.reaper import Containment

__all__ = ["STOP_GRACE", "ServerProcess", "stdio_transport"]

#: Seconds a server has to exit once its stdin is closed, before its group is killed.
STOP_GRACE = 2.0
#: Bytes of the server's stderr kept for an error message.
STDERR_TAIL = 2000
_POLL = 0.02
#: Pipe failures that only mean the other end is gone.
_GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)
#: Starts and stops that run on past a cancel of their caller, kept referenced until done.
_RUNNING: set[object] = set()
_T = TypeVar("_T")


@attrs.define(eq=False)
class ServerProcess:
    """The running server: its pid (also its process group's id) and its stderr's last bytes."""

    pid: int
    stderr: bytearray = attrs.field(factory=bytearray)

    def last_words(self) -> str:
        """The last line the server wrote to stderr (empty if none)."""
        lines = bytes(self.stderr).decode("utf-8", errors="replace").strip().splitlines()
        return lines[-1].strip() if lines else ""


def _message(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp.types.jsonrpc_message_adapter.validate_json(line))
    except ValueError as exc:  # handed to the session, which reports it
        return exc


async def _exited(process: Process, seconds: float) -> bool:
    """Whether the process exited within `seconds`. The return code is polled: waiting would
    also wait for its pipes, which a child left in the group may still hold."""
    with anyio.move_on_after(seconds):
        while process.returncode is None:  # noqa: ASYNC110 - nothing to wait on but the code
            await anyio.sleep(_POLL)
    return process.returncode is not None


async def _stop(process: Process, contained: Containment, grace: float = STOP_GRACE) -> None:
    """Close stdin, give the server `grace` seconds, then kill its whole group and containment,
    and reap it."""
    assert process.stdin is not None
    with contextlib.suppress(*_GONE):
        await process.stdin.aclose()
    await _exited(process, grace)
    # The containment first (what it left behind, in its group or not, and itself if it is
    # still there): it finds the processes while they live, so it can reap them. The group is
    # what is left to kill where there is no /proc.
    await contained.close()
    kill_group(process.pid)
    await _exited(process, STOP_GRACE)


async def _release(process: Process) -> None:
    """Close the pipes and reap the process (dead by now; a cancel would kill it)."""
    with anyio.move_on_after(STOP_GRACE):
        await process.aclose()


def _kept(work: Coroutine[object, object, _T]) -> asyncio.Task[_T]:
    """`work` as a task, referenced until it is done (the loop keeps only weak references)."""
    task = asyncio.ensure_future(work)
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    return task


async def _through(work: Coroutine[object, object, _T]) -> _T:
    """Run `work` in a task of its own and wait for it. A cancel of ours never stops the work:
    an anyio cancel scope's does not even end the wait (shielded), a native one
    (`asyncio.Task.cancel`, which anyio cannot shield from: `connect` cancels so) ends only the
    wait."""
    task = _kept(work)
    with anyio.CancelScope(shield=True):
        result = await asyncio.shield(task)
    return result


async def _start(
    argv: Sequence[str], cwd: Path, env: dict[str, str], contained: Containment
) -> Process:
    """Open the containment, spawn the server and move it into the containment's cgroup. Run
    through `_through`, so never cancelled halfway: a server it started is either returned or
    killed."""
    try:
        await contained.open()
        process = await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        await contained.close()  # the cgroup made for it
        raise
    try:
        await contained.adopt(process.pid)
    except BaseException:
        await _stop(process, contained, grace=0)
        await _release(process)
        raise
    return process


async def _abandon(starting: asyncio.Future[Process], contained: Containment) -> None:
    """Let a start whose caller was cancelled finish, then kill what it started (no grace: the
    server was never spoken to)."""
    await asyncio.wait({starting})
    if starting.cancelled() or starting.exception() is not None:
        return  # it killed what it had started itself
    process = starting.result()
    await _stop(process, contained, grace=0)
    await _release(process)


@contextlib.asynccontextmanager
async def stdio_transport(
    argv: Sequence[str], *, work_dir: Path, pass_env: Collection[str]
) -> AsyncIterator[tuple[TransportStreams, ServerProcess]]:
    """Start the server; yield the session's streams and the process. Raises OSError if the
    program cannot be started. Enter and leave it in one task (it holds a task group).

    A cancel at any point leaves no process of the server alive once the clean-up is done, and
    that clean-up is waited for (but by a second native cancel, which ends only the wait)."""
    contained = Containment()
    env = child_env(work_dir, None, pass_env)
    contained.environ(env)
    # The start runs in a task of its own: a cancel of ours must not land between the spawn and
    # the `try` that stops the server (in `open_process`, in `adopt`), nor leave a move into
    # the cgroup to race the clean-up.
    starting = _kept(_start(argv, work_dir, env, contained))
    try:
        with anyio.CancelScope(shield=True):
            process = await asyncio.shield(starting)
    except BaseException:
        # Cancelled while starting (the start goes on, then the server is killed), or the start
        # failed (then nothing of it is left).
        await _through(_abandon(starting, contained))
        raise
    server = ServerProcess(process.pid)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        assert process.stdout is not None
        async with to_session:
            with contextlib.suppress(*_GONE):
                buffer = bytearray()
                async for chunk in process.stdout:
                    buffer += chunk
                    if b"\n" not in chunk:
                        continue  # a long message: splitting it at every chunk is quadratic
                    *lines, rest = bytes(buffer).split(b"\n")
                    buffer = bytearray(rest)
                    for line in lines:
                        if line.strip():
                            await to_session.send(_message(line))

    async def write_stdin() -> None:
        assert process.stdin is not None
        async with from_session:
            try:
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
            except _GONE:
                await to_session.aclose()  # the session then sees the end, not a hang

    async def read_stderr() -> None:
        assert process.stderr is not None
        with contextlib.suppress(*_GONE):
            async for chunk in process.stderr:
                server.stderr += chunk
                del server.stderr[:-STDERR_TAIL]

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_stdout)
            tasks.start_soon(write_stdin)
            tasks.start_soon(read_stderr)
            try:
                yield (read_stream, write_stream), server
            finally:
                await _through(_stop(process, contained))
                tasks.cancel_scope.cancel()
    finally:
        for stream in (read_stream, write_stream, to_session, from_session):
            stream.close()
        await _through(_release(process))

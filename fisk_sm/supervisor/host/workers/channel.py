"""`Channel`: calls and notes both ways over one stream socket (a front's and a worker's end of
a `socket.socketpair`), as the frames of `fisk_sm.supervisor.host.workers.frames`.

`call(body)` sends a `Call` with a fresh id and waits for the `Reply` of that id: its value, or
the refusal raised again. `notify(body)` sends a `Note`. `serve(handler, on_note)` starts
reading: each call is answered by `handler(body)` in a task of its own (so a slow one holds no
other), each note is handed to `on_note` in the order it came. Either side may call the other.

The end of the stream (EOF, a frame torn or over `MAX_FRAME`, an error writing) closes the
channel: every pending call raises `WorkerLost`, later ones too, and `closed` resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from fisk_sm.supervisor.host.workers.frames import (
    CROSSING,
    HEADER,
    MAX_FRAME,
    Body,
    Call,
    Message,
    Note,
    Reply,
    WorkerLost,
    decode,
    encode,
    raise_refusal,
    refusal_of,
)

__all__ = ["Channel", "Handler", "NoteHandler"]

Handler = Callable[[Body], Awaitable[Any]]
NoteHandler = Callable[[Body], None]


async def _refuse(body: Body) -> Any:
    raise RuntimeError(f"this end takes no calls ({type(body).__name__})")


class Channel:
    """One end of a front-worker connection."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str = "peer"
    ) -> None:
        self.reader, self.writer, self.name = reader, writer, name
        self._ids = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Task[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.why = ""  # why it closed
        #: frames received, by body kind (what crossed: for tests and benches)
        self.received: dict[str, int] = {}

    @classmethod
    async def open(cls, sock: socket.socket, name: str = "peer") -> Channel:
        """A channel over `sock` (a connected stream socket; the channel owns it now)."""
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        return cls(reader, writer, name)

    @property
    def is_closed(self) -> bool:
        """Whether the channel closed (nothing more goes through)."""
        return self.closed.done()

    def _send(self, message: Message) -> None:
        if self.is_closed:
            raise WorkerLost(f"{self.name}: the channel is closed ({self.why})")
        try:
            self.writer.write(encode(message))
        except (OSError, RuntimeError) as exc:  # a transport closed under us
            self._close(f"writing: {exc}")
            raise WorkerLost(f"{self.name}: {self.why}") from exc

    async def call(self, body: Body) -> Any:
        """Send `body` as a call; its reply's value (or its refusal, raised)."""
        self._ids += 1
        call_id = self._ids
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            self._send(Call(call_id, body))
            reply: Reply = await future
        finally:
            self._pending.pop(call_id, None)
        if reply.error is not None:
            raise_refusal(reply.error)
        return reply.value

    def notify(self, body: Body) -> None:
        """Send `body` as a note (no reply)."""
        self._send(Note(body))

    async def drain(self) -> None:
        """Wait until what was sent is handed to the kernel (or the channel closed)."""
        with contextlib.suppress(OSError, RuntimeError):
            await self.writer.drain()

    def serve(self, handler: Handler = _refuse, on_note: NoteHandler | None = None) -> None:
        """Start reading: calls answered by `handler`, notes handed to `on_note`."""
        if self._reading is not None:
            raise RuntimeError("the channel is served already")
        self._reading = asyncio.ensure_future(self._read(handler, on_note))

    async def _read(self, handler: Handler, on_note: NoteHandler | None) -> None:
        why = "end of stream"
        try:
            while True:
                header = await self.reader.readexactly(HEADER.size)
                (size,) = HEADER.unpack(header)
                if size > MAX_FRAME:
                    why = f"a frame of {size} bytes is over {MAX_FRAME}: torn"
                    return
                message = decode(await self.reader.readexactly(size))
                self._take(message, handler, on_note)
        except asyncio.IncompleteReadError as exc:
            why = "a torn frame" if exc.partial else "end of stream"
        except msgspec.DecodeError as exc:
            why = f"a frame that does not decode: {exc}"
        except OSError as exc:
            why = f"reading: {exc}"
        finally:
            self._close(why)

    def _take(self, message: Message, handler: Handler, on_note: NoteHandler | None) -> None:
        if isinstance(message, Reply):
            future = self._pending.get(message.id)
            if future is not None and not future.done():
                future.set_result(message)
            return
        kind = type(message.body).__name__
        self.received[kind] = self.received.get(kind, 0) + 1
        if isinstance(message, Note):
            if on_note is not None:
                on_note(message.body)
            return
        task = asyncio.ensure_future(self._answer(message, handler))
        self._tasks.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[None]) -> None:
        """A call answered; one whose handler raised what no refusal is (a bug) closes the
        channel: this end is not to be trusted with more, and the other sees it lost."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._close(f"a bug answering a call: {task.exception()!r}")

    async def _answer(self, call: Call, handler: Handler) -> None:
        try:
            value = await handler(call.body)
        except CROSSING as exc:  # a refusal, a disk: the caller's answer (anything else: a bug)
            reply = Reply(call.id, error=refusal_of(exc))
        else:
            reply = Reply(call.id, value=value)
        if self.is_closed:
            return
        try:
            self._send(reply)
        except (TypeError, ValueError) as exc:  # a value msgpack cannot carry: a bug here
            self._send(Reply(call.id, error=refusal_of(RuntimeError(f"unsendable reply: {exc}"))))
        except WorkerLost:
            pass

    def _close(self, why: str) -> None:
        if self.is_closed:
            return
        self.why = why
        self.closed.set_result(None)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerLost(f"{self.name}: {why}"))
        self._pending.clear()
        self.writer.close()

    async def aclose(self) -> None:
        """Close the channel (pending calls raise `WorkerLost`) and stop reading."""
        self._close("closed by this end")
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        for task in tuple(self._tasks):
            task.cancel()

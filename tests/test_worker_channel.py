"""The front-worker channel: every frame round-trips, concurrent calls in both directions get
their own replies, refusals come back as the same exceptions, and a real peer killed with
SIGKILL in the middle of a frame fails every pending call with `WorkerLost`."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from typing import Any

import msgspec
import pytest

from fisk_sm.supervisor.errors import AlreadyAnswered, Conflict, NotFound
from fisk_sm.supervisor.host.workers import frames as f
from fisk_sm.supervisor.host.workers.channel import Channel

ENTRY = f.Entry("r1", "one", "/a/agent.yaml", 12.5, "submitted")
BODIES: list[f.Body] = [
    f.Hello(f.WorkerSpec(1, "/a/agent.yaml", "/s", 8, ("/c",), True, f.Watch(True))),
    f.Submit("r1", "hello \u00e9", "one", "/a/b.yaml", chat=True),
    f.Adopt((ENTRY, f.Entry("r2", "two", "", 13.0, "resumed"))),
    f.Act("r1", "suspend"),
    f.Say("r1", "more"),
    f.AnswerCall("r1", "toolu_1", "once"),
    f.Show("r1"),
    f.PathOf("r1"),
    f.List(),
    f.ListApprovals(),
    f.Shutdown(),
    f.Watch(False, frozenset({"r1", "r2"})),
    f.RowOf("r1"),
    f.Register("r1", "one", "/a/agent.yaml"),
    f.Mark("aborted", ("r1", "r2")),
    f.Events((("r1", "StateEntered", '{"type": "StateEntered"}'),)),
    f.Stopped("r1"),
]


def test_every_frame_round_trips() -> None:
    kinds = {type(b) for b in BODIES}
    assert kinds == set(f.Body.__args__)  # type: ignore[attr-defined]
    messages: list[f.Message] = [f.Call(7, b) for b in BODIES] + [f.Note(b) for b in BODIES]
    refusal = f.Refusal("already_answered", "m", "r1", "toolu_1", "deny")
    value = {"runs": [{"run_id": "r1", "tokens": {"total": 3}}], "summary": [1, 2]}
    messages += [f.Reply(7, value), f.Reply(8, None, refusal)]
    for message in messages:
        frame = f.encode(message)
        (size,) = f.HEADER.unpack(frame[: f.HEADER.size])
        assert size == len(frame) - f.HEADER.size
        assert f.decode(frame[f.HEADER.size :]) == message
    summary = f.Summary(("r1",), 1, 2, 3)
    assert msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(summary)), f.Summary) == (
        summary
    )


def test_refusals_are_raised_again_as_the_same_exceptions() -> None:
    cases: list[Exception] = [
        NotFound("no run 'x'"),
        Conflict("busy"),
        AlreadyAnswered("r1", "toolu_1", "always"),
        ValueError("bad"),
        KeyError("bug"),
    ]
    for exc in cases:
        with pytest.raises(Exception) as raised:
            f.raise_refusal(f.refusal_of(exc))
        expected = f.RemoteError if isinstance(exc, KeyError) else type(exc)
        assert type(raised.value) is expected
        if isinstance(exc, AlreadyAnswered):
            assert isinstance(raised.value, AlreadyAnswered) and raised.value.answer == "always"
        elif not isinstance(exc, KeyError):
            assert str(raised.value) == str(exc)


async def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    return await Channel.open(a, "front"), await Channel.open(b, "worker")


async def test_concurrent_calls_both_ways_get_their_own_replies() -> None:
    front, worker = await _pair()
    notes: list[f.Body] = []

    async def worker_side(body: f.Body) -> Any:
        assert isinstance(body, f.Show)
        n = int(body.run_id)
        await asyncio.sleep((50 - n) / 2000)  # the later calls answer first
        if n % 7 == 0:
            raise NotFound(f"no run {n}")
        return {"run_id": body.run_id, "n": n}

    async def front_side(body: f.Body) -> Any:
        assert isinstance(body, f.Mark)
        await asyncio.sleep(0)
        return len(body.run_ids)

    worker.serve(worker_side)
    front.serve(front_side, notes.append)

    async def show(n: int) -> Any:
        try:
            return await front.call(f.Show(str(n)))
        except NotFound as exc:
            return str(exc)

    writes = [worker.call(f.Mark("resumed", tuple(f"r{i}" for i in range(k)))) for k in range(20)]
    got = await asyncio.wait_for(asyncio.gather(*(show(n) for n in range(50)), *writes), 30)
    for n in range(50):
        assert got[n] == (f"no run {n}" if n % 7 == 0 else {"run_id": str(n), "n": n})
    assert got[50:] == list(range(20))
    for i in range(5):
        worker.notify(f.Stopped(f"r{i}"))
    await front.call(f.Show("1"))  # the notes sent before this reply arrive before it
    assert notes == [f.Stopped(f"r{i}") for i in range(5)]
    assert worker.received == {"Show": 51}
    await front.aclose()
    await asyncio.wait_for(worker.closed, 5)
    with pytest.raises(f.WorkerLost):
        await worker.call(f.Mark("resumed", ()))


PEER = """
import os, signal, socket, sys, time
from fisk_sm.supervisor.host.workers import frames as f
sock = socket.socket(fileno=int(sys.argv[1]))
got = b""
while len(got) < f.HEADER.size or len(got) < f.HEADER.size + f.HEADER.unpack(got[:4])[0]:
    got += sock.recv(65536)
size = f.HEADER.unpack(got[: f.HEADER.size])[0]
call = f.decode(got[f.HEADER.size : f.HEADER.size + size])
frame = f.encode(f.Reply(call.id, value="x" * 100_000))
sock.sendall(frame[: len(frame) // 2])   # half a frame, then nothing
print("half", flush=True)
time.sleep(60)
"""


async def test_a_peer_killed_mid_frame_fails_every_pending_call_with_worker_lost() -> None:
    mine, theirs = socket.socketpair()
    child = subprocess.Popen(  # noqa: ASYNC220 - a short start, the test's own loop
        [sys.executable, "-c", PEER, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
    )
    theirs.close()
    try:
        channel = await Channel.open(mine, "worker 1")
        channel.serve()
        calls = [asyncio.ensure_future(channel.call(f.Show(f"r{i}"))) for i in range(3)]
        line = await asyncio.to_thread(child.stdout.readline)  # type: ignore[union-attr]
        assert line == b"half\n"
        await asyncio.sleep(0.05)  # the half frame is read (nothing of it completes a call)
        assert not any(c.done() for c in calls)
        child.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        assert all(isinstance(r, f.WorkerLost) for r in results), results
        assert channel.is_closed and channel.why == "a torn frame"
        with pytest.raises(f.WorkerLost):
            await channel.call(f.List())
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


def _loaded(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after `code`."""
    shown = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(shown.stdout.split())


def test_a_worker_loads_no_web_stack_and_the_supervisor_loads_no_worker() -> None:
    worker = _loaded("import fisk_sm.supervisor.host.workers.child")
    assert not {m.split(".")[0] for m in worker} & {"uvicorn", "starlette", "sse_starlette", "nats"}
    assert "fisk_sm.supervisor.api" not in worker
    lone = _loaded("import fisk_sm, fisk_sm.supervisor\nfisk_sm.supervisor.Supervisor")
    assert not {m for m in lone if m.startswith("fisk_sm.supervisor.host.workers")}

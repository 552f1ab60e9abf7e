"""The shared SDK client runs on aiohttp (`fisk_sm.model.transport`), and still keeps its call
timeout, its cancellation, its streaming and one client per (base URL, API key).

The fake here is a loopback HTTP/1.1 server that keeps connections open, as the real API does,
and tells which connection each request came on and when a connection is closed: so a test sees
that two models share one connection pool, and that a call that timed out or was cancelled
closed its request.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import anthropic
import pytest

from fisk_sm import parse_config
from fisk_sm.config.agent import LLMConfig
from fisk_sm.model import clients
from fisk_sm.model.anthropic import AnthropicModel, ModelError, ModelRequest
from fisk_sm.model.blocks import Message
from fisk_sm.testing import FakeMessagesAPI, Reply

WAIT = 30.0  # seconds to wait for what must happen (never reached when it does)
MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
REQUEST = ModelRequest(model="m", max_tokens=10, messages=[Message("user", "hello")])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a connection serves request after request
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        wire = self.server.wire
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers.get("authorization", "").removeprefix("Bearer ")
        wire.seen(self.client_address[1], body, key)
        if wire.hang:
            self.rfile.read(1)  # no answer: wait for the client to close the connection
            self.close_connection = True
            return
        data = json.dumps(MESSAGE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def finish(self) -> None:
        super().finish()
        self.server.wire.gone(self.client_address[1])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    wire: Wire


class Wire:
    """The fake: `requests` are (client port, body, API key); `closed[port]` is set once the
    client closed that connection."""

    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang
        self.requests: list[tuple[int, dict[str, Any], str]] = []
        self.closed: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.wire = self
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def seen(self, port: int, body: dict[str, Any], key: str) -> None:
        with self._lock:
            self.requests.append((port, body, key))
            self.closed.setdefault(port, threading.Event())

    def gone(self, port: int) -> None:
        with self._lock:
            self.closed.setdefault(port, threading.Event()).set()

    async def until_requests(self, n: int) -> None:
        for _ in range(int(WAIT / 0.01)):
            if len(self.requests) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the fake got {len(self.requests)} requests, not {n}")

    async def until_closed(self, port: int) -> None:
        assert await asyncio.to_thread(self.closed[port].wait, WAIT), "the connection stayed open"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def wire() -> Iterator[Wire]:
    fake = Wire()
    yield fake
    fake.stop()


@pytest.fixture
def hanging() -> Iterator[Wire]:
    fake = Wire(hang=True)
    yield fake
    fake.stop()


def llm(base_url: str, call_timeout: float = 30.0) -> LLMConfig:
    budget = {"call_timeout": call_timeout}
    raw = {"model": "m", "base_url": base_url, "no_prompt_cache": True, "budget": budget}
    return parse_config({"system_prompt": "test", "llm": raw}, env={}).llm


async def test_the_shared_client_is_on_aiohttp(wire: Wire) -> None:
    model = AnthropicModel(llm(wire.base_url), api_key="k1")
    try:
        http = model.client._client
        assert isinstance(http, anthropic.DefaultAioHttpClient)  # the SDK's aiohttp client
        assert (await model.create(REQUEST))["content"] == MESSAGE["content"]
        assert [key for _, _, key in wire.requests] == ["k1"]
        session = http._transport.inner.client  # type: ignore[attr-defined]
        assert isinstance(session, aiohttp.ClientSession)  # the request went through it
    finally:
        await model.aclose()
    assert model.client.is_closed()


async def test_a_call_timeout_fires_and_closes_its_request(hanging: Wire) -> None:
    model = AnthropicModel(llm(hanging.base_url, call_timeout=0.5), api_key="k1")
    try:
        with pytest.raises(ModelError, match=r"^llm call: timed out after 0\.5s$"):
            await model.create(REQUEST)
        assert len(hanging.requests) == 1  # one deadline for the call, its retries included
        await hanging.until_closed(hanging.requests[0][0])
    finally:
        await model.aclose()


async def test_cancelling_a_call_closes_its_request(hanging: Wire) -> None:
    model = AnthropicModel(llm(hanging.base_url), api_key="k1")
    try:
        call = asyncio.ensure_future(model.create(REQUEST))
        await hanging.until_requests(1)
        ((port, _, _),) = hanging.requests
        assert not hanging.closed[port].is_set()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await hanging.until_closed(port)  # the fake saw the client hang up
    finally:
        await model.aclose()


async def test_one_client_per_base_url_and_key(wire: Wire) -> None:
    first = AnthropicModel(llm(wire.base_url), api_key="k1")
    second = AnthropicModel(llm(wire.base_url, call_timeout=7.0), api_key="k1")
    other = AnthropicModel(llm(wire.base_url), api_key="k2")
    try:
        assert first.client._client is second.client._client  # one pool, two views
        assert other.client._client is not first.client._client
        for model in (first, second, other, first):
            await model.create(REQUEST)
        ports = [port for port, _, _ in wire.requests]
        keys = [key for _, _, key in wire.requests]
        assert keys == ["k1", "k1", "k2", "k1"]
        # k1's calls went one after another down one kept-alive connection; k2 has its own
        assert ports[0] == ports[1] == ports[3] != ports[2]
    finally:
        for model in (first, second, other):
            await model.aclose()
    assert first.client.is_closed() and other.client.is_closed()


def test_a_client_is_never_reused_on_another_loop(wire: Wire) -> None:
    # Built with no loop running: a client of its own, which two loops then use in turn.
    model = AnthropicModel(llm(wire.base_url), api_key="k1")
    for _ in range(2):
        assert asyncio.run(model.create(REQUEST))["content"] == MESSAGE["content"]
    first, second = (port for port, _, _ in wire.requests)
    assert first != second  # the second loop did not reuse the first loop's connection
    asyncio.run(model.aclose())
    assert model.client.is_closed()


def test_clients_a_closed_loop_left_are_closed_on_the_next() -> None:
    api_key = "k-left"
    with FakeMessagesAPI([Reply.text("one")]) as api:
        key = clients.client_key(api.base_url, api_key)

        async def leave() -> anthropic.AsyncAnthropic:  # its share is never released
            share = clients.acquire(key, (30.0, 0))
            await share.client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
            return share.client

        left = asyncio.run(leave())
        assert not left.is_closed()

        async def next_loop() -> None:
            share = clients.acquire(key, (30.0, 0))
            for _ in range(int(WAIT / 0.01)):
                if left.is_closed():
                    break
                await asyncio.sleep(0.01)
            assert share.client is not left
            await share.release()

        asyncio.run(next_loop())
    assert left.is_closed()
    assert all(not loop.is_closed() for loop in clients._BY_LOOP)


async def test_a_streamed_call_arrives_through_aiohttp() -> None:
    pieces: list[str] = []
    with FakeMessagesAPI([Reply.text("streamed over aiohttp")]) as api:
        model = AnthropicModel(llm(api.base_url), api_key="k1", on_text=pieces.append)
        assert isinstance(model.client._client, anthropic.DefaultAioHttpClient)
        try:
            reply = await model.create(REQUEST)
        finally:
            await model.aclose()
    assert "".join(pieces) == "streamed over aiohttp" and len(pieces) > 1
    assert reply["content"] == [{"type": "text", "text": "streamed over aiohttp"}]
    assert api.requests[0]["stream"] is True


def test_the_client_modules_load_neither_the_sdk_nor_aiohttp() -> None:
    code = (
        "import sys, fisk_sm.model.anthropic, fisk_sm.model.clients, fisk_sm.model.transport;"
        "print(sorted(m for m in ('aiohttp', 'anthropic', 'httpx2') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

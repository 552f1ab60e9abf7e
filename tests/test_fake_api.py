"""The loopback fake Messages API, driven through the real anthropic SDK over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, MessageParam, TextBlock

from fisk_sm.testing import FakeMessagesAPI, Reply, ScriptError, load_script, serve
from fisk_sm.testing.server import _Handler

MODEL = "claude-test-model"
USER: list[MessageParam] = [{"role": "user", "content": "hi"}]
ROOT = Path(__file__).resolve().parents[1]
#: How long to wait for something that happens in a moment: a guard against a hang, never a
#: measure of speed.
GUARD = 120.0


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


def client(api: FakeMessagesAPI, **kw: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="test", base_url=api.base_url, **kw)


def text_of(resp: Message) -> str:
    block = resp.content[0]
    assert isinstance(block, TextBlock), block
    return block.text


async def test_text_reply_round_trips(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.text(
            "hello there",
            input_tokens=123,
            output_tokens=45,
            cache_read_input_tokens=67,
            cache_creation_input_tokens=89,
        )
    )
    async with client(api) as c:
        resp = await c.messages.create(model=MODEL, max_tokens=321, messages=USER)
    assert text_of(resp) == "hello there"
    assert resp.stop_reason == "end_turn"
    assert resp.model == MODEL
    assert resp.id.startswith("msg_")
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (123, 45)
    assert resp.usage.cache_read_input_tokens == 67
    assert resp.usage.cache_creation_input_tokens == 89
    assert api.requests == [{"model": MODEL, "max_tokens": 321, "messages": USER}]
    headers = api.request_headers[0]
    assert headers.get("authorization") == "Bearer test" or headers.get("x-api-key") == "test"
    assert "anthropic-version" in headers
    assert api.remaining == 0


async def test_tool_use_reply(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("add", {"a": 1, "b": 2}, id="toolu_abc", text="let me add"))
    async with client(api) as c:
        resp = await c.messages.create(model=MODEL, max_tokens=50, messages=USER)
    assert resp.stop_reason == "tool_use"
    assert [b.type for b in resp.content] == ["text", "tool_use"]
    block = resp.content[1]
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("toolu_abc", "add", {"a": 1, "b": 2})


def test_generated_tool_ids_are_unique() -> None:
    ids = {Reply.tool_use("t", {}).content[0]["id"] for _ in range(3)}
    assert len(ids) == 3
    assert all(i.startswith("toolu_") for i in ids)


async def test_overloaded_then_success_is_retried(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(529), Reply.text("second time lucky"))
    async with client(api, max_retries=2) as c:
        resp = await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert text_of(resp) == "second time lucky"
    assert len(api.requests) == 2
    assert api.request_headers[1]["x-stainless-retry-count"] == "1"


async def test_error_status_maps_to_sdk_exception(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(429))
    async with client(api, max_retries=0) as c:
        with pytest.raises(anthropic.RateLimitError) as info:
            await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert info.value.status_code == 429
    assert info.value.type == "rate_limit_error"
    assert info.value.response.headers["retry-after-ms"] == "10"  # so retries are immediate


async def test_delay_beyond_client_timeout_times_out(
    api: FakeMessagesAPI, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reply cannot come before 1 s, so the 0.2 s client timeout fires first.
    answered = threading.Event()
    send = _Handler._send_bytes

    def sending(self: _Handler, *args: Any, **kwargs: Any) -> None:
        send(self, *args, **kwargs)
        answered.set()

    monkeypatch.setattr(_Handler, "_send_bytes", sending)
    api.add(Reply.text("too late", delay=1.0), Reply.text("on time"))
    async with client(api, timeout=0.2, max_retries=0) as c:
        with pytest.raises(anthropic.APITimeoutError):
            await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
        assert len(api.requests) == 1
        # the delay runs out and the server answers a client that has hung up ...
        assert await asyncio.to_thread(answered.wait, GUARD), "the late reply was never sent"
        # ... which it survives quietly, and goes on answering
        resp = await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert capsys.readouterr().err == ""
    assert text_of(resp) == "on time"
    assert len(api.requests) == 2


async def test_delayed_reply_does_not_block_others(api: FakeMessagesAPI) -> None:
    # The slow reply waits GUARD seconds (closing the server cuts that short): the fast one
    # must come back while it waits.
    api.add(Reply.text("slow", delay=GUARD), Reply.text("fast"))
    async with client(api, max_retries=0) as c:
        slow = asyncio.create_task(c.messages.create(model=MODEL, max_tokens=1, messages=USER))
        try:
            while not api.requests:  # until the slow request has reached the server
                assert not slow.done(), slow
                await asyncio.sleep(0.005)
            fast = await c.messages.create(model=MODEL, max_tokens=1, messages=USER)
            assert text_of(fast) == "fast"
            assert not slow.done()
            assert len(api.requests) == 2
        finally:
            slow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await slow


async def test_exhausted_script_is_not_retried(api: FakeMessagesAPI) -> None:
    async with client(api, max_retries=2) as c:
        with pytest.raises(anthropic.InternalServerError) as info:
            await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert "fake API script exhausted" in str(info.value)
    assert len(api.requests) == 1


async def test_error_message_is_sent_as_scripted(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(500, message="\x1b[31mboom\u202e\nline two"))
    async with client(api, max_retries=0) as c:
        with pytest.raises(anthropic.InternalServerError) as info:
            await c.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert info.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "\x1b[31mboom\u202e\nline two"},
    }


HOSTILE = {"content": "text", "usage": {"input_tokens": -5}}


@pytest.mark.parametrize(
    ("reply", "content_type", "body"),
    [
        (Reply.raw("<p>\nhi</p>", content_type="text/html"), "text/html", b"<p>\nhi</p>"),
        (Reply.raw(b"\xff{not json"), "application/json", b"\xff{not json"),
        (Reply.raw(""), "application/json", b""),
        (Reply.body([1, "two"]), "application/json", b'[1, "two"]'),
        (Reply.body(HOSTILE), "application/json", json.dumps(HOSTILE).encode()),
    ],
)
async def test_any_body_can_be_scripted(
    api: FakeMessagesAPI, reply: Reply, content_type: str, body: bytes
) -> None:
    api.add(reply)
    async with client(api, max_retries=0) as c:
        raw = await c.messages.with_raw_response.create(model=MODEL, max_tokens=1, messages=USER)
        assert raw.status_code == 200
        assert raw.headers["content-type"] == content_type
        assert await raw.read() == body


async def test_a_raw_error_page_is_an_sdk_error_and_retried(api: FakeMessagesAPI) -> None:
    page = Reply.raw("<html>bad gateway</html>", status=502, content_type="text/html")
    api.add(page, page)
    async with client(api, max_retries=1) as c:
        with pytest.raises(anthropic.APIStatusError) as info:
            await c.messages.create(model=MODEL, max_tokens=1, messages=USER)
    assert info.value.status_code == 502
    assert info.value.body == "<html>bad gateway</html>"
    assert len(api.requests) == 2


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: Reply(content=[{"type": "text", "text": "x"}], payload=b"{}"), "whole body"),
        (lambda: Reply(message="not an error"), "'message' is for error replies"),
        (lambda: Reply.raw("x", status=302), "status must be"),
    ],
)
def test_meaningless_replies_are_refused(make: Callable[[], Reply], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        make()


def test_bad_requests_get_json_errors(api: FakeMessagesAPI) -> None:
    def post(path: str, data: bytes) -> tuple[int, Any]:
        req = urllib.request.Request(api.base_url + path, data=data, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, body = post("/v1/messages", b"{not json")
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    status, body = post("/v1/nope", b"{}")
    assert status == 404
    assert body["type"] == "error"
    assert api.requests == []


def test_non_loopback_host_is_refused() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeMessagesAPI(host="0.0.0.0")


def test_load_script_yaml(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(
        """
- text: hello
  usage: {input_tokens: 7, cache_read_input_tokens: 3}
- text: calling a tool
  tool_use: {name: search, input: {q: cats}, id: toolu_x}
- tool_use: {name: search, input: {}}
  stop_reason: max_tokens
- status: 529
  delay: 0.5
- content: [{type: text, text: raw}]
- body: {content: not a list, usage: {input_tokens: -5}}
- raw: "<html>oops</html>"
  content_type: text/html
  status: 502
- status: 500
  message: "\\e[31mboom"
"""
    )
    first, second, third, fourth, fifth, sixth, seventh, eighth = load_script(path)
    assert first == Reply.text("hello", input_tokens=7, cache_read_input_tokens=3)
    assert second.stop_reason == "tool_use"
    assert second.content == (
        {"type": "text", "text": "calling a tool"},
        {"type": "tool_use", "id": "toolu_x", "name": "search", "input": {"q": "cats"}},
    )
    assert third.stop_reason == "max_tokens"
    assert third.content[0]["id"].startswith("toolu_")
    assert (fourth.status, fourth.delay) == (529, 0.5)
    assert fifth.content == ({"type": "text", "text": "raw"},)
    assert sixth == Reply.body({"content": "not a list", "usage": {"input_tokens": -5}})
    assert seventh == Reply.raw("<html>oops</html>", status=502, content_type="text/html")
    assert eighth == Reply.error(500, message="\x1b[31mboom")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- text: ok\n- text: ok\n- txt: oops\n", "item 2: unknown key 'txt'"),
        ("- text: 5\n", "item 0: field 'text'"),
        ("- usage: {input_tokens: -1}\n", "item 0: field 'usage'"),
        ("- tool_use: {name: x, inputs: {}}\n", "item 0: field 'tool_use': unknown key 'inputs'"),
        ("- status: 302\n", "item 0: field 'status'"),
        ("- body: {}\n  text: hi\n", "item 0: 'body' is the whole body: it cannot be combined"),
        ("- raw: x\n  usage: {input_tokens: 1}\n", "item 0: 'raw' is the whole body"),
        ("- raw: x\n  body: {}\n", "item 0: 'body' and 'raw' cannot be combined"),
        ("- raw: 5\n", "item 0: field 'raw': expected a string, got int"),
        ("- text: hi\n  content_type: text/html\n", "item 0: 'content_type' needs 'body' or"),
        ("- text: hi\n  message: boom\n", "item 0: 'message' is for error replies"),
        ("- body: .nan\n", "item 0: field 'body': not JSON"),
        ("- body: 2024-01-01\n", "item 0: field 'body': not JSON"),
        ("text: not a list\n", "expected a list"),
    ],
)
def test_load_script_rejects_bad_items(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(text)
    with pytest.raises(ScriptError) as info:
        load_script(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_load_script_json(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"text": "hi", "delay": 0}]))
    assert load_script(path) == (Reply.text("hi"),)


def test_serve_reports_bad_script(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- nope: 1\n")
    out = io.StringIO()
    assert serve(str(path), out=out) == 2
    assert f"{path}: item 0: unknown key 'nope'" in out.getvalue()


async def test_serve_subprocess_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- text: from the subprocess\n")
    code = "import sys; from fisk_sm.testing import serve; sys.exit(serve(sys.argv[1], port=0))"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", code, str(script)),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), GUARD)).decode()
        assert line.startswith("fake Messages API listening on http://127.0.0.1:"), line
        assert line.rstrip().endswith("(1 scripted replies)")
        base_url = line.split(" on ", 1)[1].split()[0]
        async with anthropic.AsyncAnthropic(api_key="test", base_url=base_url) as c:
            resp = await c.messages.create(model=MODEL, max_tokens=5, messages=USER)
        assert text_of(resp) == "from the subprocess"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
        assert await proc.stderr.read() == b""  # no traceback, no request log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("keep_alive", [False, True])
def test_a_connection_serves_one_request_unless_kept_alive(keep_alive: bool) -> None:
    import http.client

    replies = [Reply.text("one"), Reply.text("two")]
    with FakeMessagesAPI(replies, keep_alive=keep_alive) as api:
        port = int(api.base_url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps({"model": "m", "max_tokens": 5, "messages": []})
        answers, sockets = [], []
        for _ in range(2):
            conn.request("POST", "/v1/messages", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            answers.append((reply.getheader("Connection"), json.loads(reply.read())))
            sockets.append(conn.sock)  # None once the server closed it
        conn.close()
    texts = [answer["content"][0]["text"] for _, answer in answers]
    assert texts == ["one", "two"]
    if keep_alive:  # both on the socket of the first
        assert [header for header, _ in answers] == ["keep-alive", "keep-alive"]
        assert sockets[0] is not None and sockets[0] is sockets[1]
    else:  # each closed after its reply; http.client connected again for the second
        assert [header for header, _ in answers] == ["close", "close"]
        assert sockets == [None, None]

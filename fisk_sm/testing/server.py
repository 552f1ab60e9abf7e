"""A loopback fake of the Anthropic Messages API, for fisk_sm's tests and for yours.

:class:`FakeMessagesAPI` is a small HTTP server on 127.0.0.1 that answers
``POST /v1/messages`` from a script of :class:`Reply` objects, one per request, in
order, or per conversation (keyed by the first user message, so many runs share one server:
:mod:`fisk_sm.testing.conversations`), or from a function of the request. Point the real
SDK at it and the whole client stack (serialisation, retries, timeouts, error mapping) runs
for real::

    with FakeMessagesAPI([Reply.tool_use("add", {"a": 1}), Reply.text("done")]) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.base_url)
        ...  # run your agent loop
        assert api.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"

A reply with a non-200 ``status`` answers with an Anthropic-shaped error body and
``retry-after-ms: 10``, so the SDK retries it at once. A reply can also be any body at
all (:meth:`Reply.body`, :meth:`Reply.raw`), to test what a client does with a hostile
one. When the script runs out the server answers 500 with ``x-should-retry: false``, so
a missing reply fails fast. Replies and script files are in :mod:`fisk_sm.testing.script`;
scripts are served from the command line by :func:`serve` (behind ``fisk-sm fake-api``).
"""

from __future__ import annotations

import collections
import ipaddress
import json
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO, cast

from fisk_sm.testing.conversations import Conversations, Turn, first_user_text, turn_of
from fisk_sm.testing.script import Reply, load_script_file

__all__ = ["FakeMessagesAPI", "Responder", "serve"]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # The listen backlog. socketserver's default of 5 drops the connections of a burst (200
    # runs calling at once) and the client retries each one after a 1 s SYN timeout.
    request_queue_size = 1024
    api: FakeMessagesAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client went away (e.g. it timed out mid-delay): nothing to report
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


#: Seconds a kept-alive connection may sit idle before the server closes it.
KEEP_ALIVE_IDLE = 30.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeMessagesAPI/1.0"

    def setup(self) -> None:
        super().setup()
        if cast(_Server, self.server).api.keep_alive:  # a read of the next request waits no
            self.connection.settimeout(KEEP_ALIVE_IDLE)  # longer than this

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Mapping[str, Any], **headers: str) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), "application/json", **headers)

    def _send_bytes(self, status: int, data: bytes, content_type: str, **headers: str) -> None:
        # one request per connection (nothing outlives close()), unless the API keeps them
        keep = cast(_Server, self.server).api.keep_alive
        self.close_connection = not keep
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "keep-alive" if keep else "close")
            for key, value in headers.items():
                self.send_header(key.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length", "")
        return self.rfile.read(int(length)) if length.isdigit() else b""

    def do_GET(self) -> None:
        self._read_body()  # drain it: closing a socket with unread input resets the connection
        self._send(404, _error("not_found_error", f"no such endpoint: {self.path}"))

    do_PUT = do_DELETE = do_PATCH = do_GET

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/v1/messages":
            return self.do_GET()
        raw = self._read_body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            msg = "request body is not a JSON object"
            return self._send(400, _error("invalid_request_error", msg))
        api = cast(_Server, self.server).api
        n, reply = api._answer(body, {k.lower(): v for k, v in self.headers.items()}, raw)
        rid = f"req_fake_{n:02d}"
        if isinstance(reply, str):  # why there is no reply: fail fast, never retried
            out = _error("api_error", reply)
            return self._send(500, out, request_id=rid, x_should_retry="false")
        if reply.delay > 0 and api._stopping.wait(reply.delay):
            return  # the server is closing: drop the connection unanswered
        # an error status, whatever its body, is retried at once
        retry = {"retry_after_ms": "10"} if reply.status != 200 else {}
        if reply.payload is not None:
            data, kind = reply.payload, reply.content_type
            return self._send_bytes(reply.status, data, kind, request_id=rid, **retry)
        if reply.status != 200:
            kind = {529: "overloaded_error", 429: "rate_limit_error"}.get(reply.status, "api_error")
            text = reply.message
            out = _error(kind, f"fake API scripted error {reply.status}" if text is None else text)
            return self._send(reply.status, out, request_id=rid, **retry)
        message = {
            "id": f"msg_{n:02d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-fake"),
            "content": list(reply.content),
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": reply.usage,
        }
        if body.get("stream") is True:  # the Messages API's Server-Sent Events
            data = b"".join(_sse(kind, event) for kind, event in stream_events(message))
            return self._send_bytes(200, data, "text/event-stream", request_id=rid)
        self._send(200, message, request_id=rid)


def _sse(kind: str, event: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()


def _pieces(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`message` as the Messages API streams it: message_start, each block's start, deltas
    (text in pieces, a tool's input as JSON, thinking and its signature) and stop, then
    message_delta (stop reason, output tokens) and message_stop."""
    usage = dict(message.get("usage") or {})
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message.get("content") or []):
        kind, deltas = block.get("type"), []
        first = dict(block)
        if kind == "text":
            first["text"] = ""
            deltas = [{"type": "text_delta", "text": t} for t in _pieces(block.get("text", ""))]
        elif kind == "tool_use":
            first["input"] = {}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        elif kind == "thinking":
            first["thinking"], first["signature"] = "", ""
            deltas = [
                {"type": "thinking_delta", "thinking": block.get("thinking", "")},
                {"type": "signature_delta", "signature": block.get("signature", "")},
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    output = {"output_tokens": usage.get("output_tokens", 0)}
    events.append(("message_delta", {"type": "message_delta", "delta": stop, "usage": output}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _check_loopback(host: str) -> None:
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"FakeMessagesAPI only listens on loopback addresses, not {host!r}")


#: A function of the request body that answers it (see :class:`FakeMessagesAPI`).
Responder = Callable[[dict[str, Any]], Reply]


class FakeMessagesAPI:
    """A scripted Messages API on a loopback port, served from a daemon thread.

    A request is answered, in this order of precedence, by:

    - ``conversations``: a script per conversation, keyed by the run's first user message
      text; turn k of a conversation (k assistant messages in the request) gets its k-th
      reply, so concurrent runs share one server and a resumed run gets the same reply again
      (:mod:`fisk_sm.testing.conversations`);
    - ``responder``: a function of the parsed request body returning a :class:`Reply` (it runs
      in the request's handler thread, so it may block; an exception it raises, or anything
      but a Reply, is answered with a 500 naming it);
    - ``script``: the ordered replies, one per request, in arrival order.

    A request none of them answers gets a 500 saying why (``x-should-retry: false``). Each
    connection serves one request and is closed, so nothing outlives :meth:`close`; with
    ``keep_alive=True`` a connection serves requests until its client closes it (as the real
    API's do: a client then pays for one TCP connection per pooled connection, not per call;
    idle ones are closed after ``KEEP_ALIVE_IDLE`` seconds).
    ``requests`` and ``request_headers`` (lower-cased names) record every
    ``POST /v1/messages`` with a JSON body, in arrival order; :meth:`requests_for` gives one
    conversation's. Both are appended under a lock; read them through :meth:`requests_for`
    or once the runs are done.
    """

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        conversations: Mapping[str, Sequence[Turn]] | None = None,
        responder: Responder | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_alive: bool = False,
    ) -> None:
        _check_loopback(host)
        self.keep_alive = keep_alive
        self._host, self._wanted_port = host, port
        self._lock = threading.Lock()
        self._queue: collections.deque[Reply] = collections.deque(script)
        self._conversations = Conversations(conversations)
        self.responder = responder
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        #: The exact bytes of each request body recorded in `requests` (to check what a
        #: client sent back byte for byte: thinking blocks, unknown keys).
        self.raw_requests: list[bytes] = []

    def _answer(
        self, body: dict[str, Any], headers: dict[str, str], raw: bytes = b""
    ) -> tuple[int, Reply | str]:
        """Record a request; its number, and its reply or why there is none."""
        key, turn = first_user_text(body), turn_of(body)
        conversations = self._conversations
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            self.raw_requests.append(raw)
            n = len(self.requests)
            conversations.record(key, body)
            if key is not None and key in conversations:
                return n, conversations.answer(key, turn)
            responder = self.responder
            if responder is None:
                if self._queue:
                    return n, self._queue.popleft()
                if conversations:
                    return n, conversations.answer(key, turn)
                return n, f"fake API script exhausted: request {n} has no scripted reply"
        try:  # outside the lock: a responder may block, others go on being answered
            reply = responder(body)
        # A boundary: the responder is the test's code; whatever it raises is answered as an
        # error the test can read, never a dropped connection that hangs the client.
        except Exception as exc:
            return n, f"fake API responder raised {type(exc).__name__}: {exc}"
        if not isinstance(reply, Reply):
            return n, f"fake API responder returned {type(reply).__name__}, not a Reply"
        return n, reply

    def add(self, *replies: Reply) -> None:
        """Append replies to the end of the ordered script."""
        with self._lock:
            self._queue.extend(replies)

    def add_conversation(self, first_user_text: str, *turns: Turn) -> None:
        """Append turns to the script of the conversation opened by ``first_user_text``.

        A turn is a :class:`Reply` (the answer to every attempt at that turn) or a sequence
        of them (one per attempt, the last repeating), e.g. ``(Reply.error(529), reply)``.
        """
        self._conversations.add(first_user_text, *turns)

    def requests_for(self, first_user_text: str | None) -> list[dict[str, Any]]:
        """The request bodies of one conversation (scripted or not), in arrival order."""
        return self._conversations.requests_for(first_user_text)

    @property
    def remaining(self) -> int:
        """How many replies of the ordered script have not been served yet."""
        with self._lock:
            return len(self._queue)

    def _running(self) -> _Server:
        if self._server is None:
            raise RuntimeError("FakeMessagesAPI is not running")
        return self._server

    @property
    def port(self) -> int:
        return int(self._running().server_address[1])

    @property
    def base_url(self) -> str:
        host = str(self._running().server_address[0])
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self) -> FakeMessagesAPI:
        if self._server is not None:
            raise RuntimeError("FakeMessagesAPI is already running")
        server_cls = _Server6 if ":" in self._host else _Server
        server = server_cls((self._host, self._wanted_port), _Handler)
        server.api = self
        self._stopping.clear()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()  # wakes handlers sleeping on a delay
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve(
    script_path: str, *, host: str = "127.0.0.1", port: int = 0, out: TextIO | None = None
) -> int:
    """Serve a script file until SIGINT/SIGTERM, for ``fisk-sm fake-api``; returns the exit code.

    Prints the listening line to ``out`` (default: the current ``sys.stderr``); a bad
    script, host or port prints the error there instead and returns 2.
    """
    stream = sys.stderr if out is None else out
    try:
        script = load_script_file(script_path)
        api = FakeMessagesAPI(
            script.replies, conversations=script.conversations, host=host, port=port
        ).start()
    except (ValueError, OSError) as exc:
        print(f"fake-api: {exc}", file=stream, flush=True)
        return 2
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # else: only KeyboardInterrupt
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    try:
        what = f"{len(script.replies)} scripted replies"
        if script.conversations:
            what += f", {len(script.conversations)} conversations"
        line = f"fake Messages API listening on {api.base_url} ({what})"
        print(line, file=stream, flush=True)
        while not stop.wait(0.2):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        api.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0

"""A loopback fake of the Anthropic Messages API, for fisk_sm's tests and for yours.

:class:`FakeMessagesAPI` is a small HTTP server on 127.0.0.1 that answers
``POST /v1/messages`` from a script of :class:`Reply` objects, one per request, in
order. Point the real SDK at it and the whole client stack (serialisation, retries,
timeouts, error mapping) runs for real::

    with FakeMessagesAPI([Reply.tool_use("add", {"a": 1}), Reply.text("done")]) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.base_url)
        ...  # run your agent loop
        assert api.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"

A reply with a non-200 ``status`` answers with an Anthropic-shaped error body and
``retry-after-ms: 10``, so the SDK retries it at once. When the script runs out the
server answers 500 with ``x-should-retry: false``, so a missing reply fails fast.
Scripts can also live in YAML/JSON files (:func:`load_script`) and be served from
the command line (:func:`serve`, behind ``fisk-sm fake-api``).
"""

from __future__ import annotations

import collections
import ipaddress
import itertools
import json
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO, cast

import attrs
import yaml

__all__ = ["FakeMessagesAPI", "Reply", "ScriptError", "load_script", "serve"]

_CACHE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens")
_USAGE_KEYS = ("input_tokens", "output_tokens", *_CACHE_KEYS)
_tool_ids = itertools.count(1)
_tool_lock = threading.Lock()


def _next_tool_id() -> str:
    with _tool_lock:
        return f"toolu_{next(_tool_ids):02d}"


def _blocks(value: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(dict(block) for block in value)


@attrs.frozen
class Reply:
    """One scripted answer: content blocks (sent verbatim), stop reason, usage, delay, status."""

    content: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=_blocks)
    stop_reason: str = "end_turn"
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    delay: float = 0.0  # seconds to wait before answering
    status: int = attrs.field(default=200)  # anything else: an Anthropic-shaped error body

    @status.validator
    def _check_status(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value != 200 and not 400 <= value <= 599:
            raise ValueError(f"status must be 200 or 400-599, not {value}")

    @classmethod
    def text(cls, text: str, **kw: Any) -> Reply:
        """A reply with a single text block."""
        return cls(content=({"type": "text", "text": text},), **kw)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: Mapping[str, Any],
        id: str | None = None,
        text: str | None = None,
        **kw: Any,
    ) -> Reply:
        """A tool call (after a text block if ``text``); stop_reason defaults to "tool_use"."""
        block = {"type": "tool_use", "id": id or _next_tool_id(), "name": name}
        lead = [{"type": "text", "text": text}] if text is not None else []
        kw.setdefault("stop_reason", "tool_use")
        return cls(content=(*lead, {**block, "input": dict(input)}), **kw)

    @classmethod
    def error(cls, status: int, **kw: Any) -> Reply:
        """An HTTP error answer (529 overloaded, 429 rate limited, anything else api_error)."""
        return cls(status=status, **kw)

    @property
    def usage(self) -> dict[str, int]:
        """The ``usage`` object sent with the reply."""
        return {key: int(getattr(self, key)) for key in _USAGE_KEYS}


class ScriptError(ValueError):
    """A script file is unreadable or malformed; the message names file, item and field."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda v: isinstance(v, str), "a string"),
    "stop_reason": (lambda v: isinstance(v, str), "a string"),
    "tool_use": (lambda v: isinstance(v, dict), "a mapping"),
    "usage": (lambda v: isinstance(v, dict), "a mapping"),
    "content": (lambda v: isinstance(v, list), "a list of blocks"),
    "delay": (lambda v: (_is_int(v) or isinstance(v, float)) and v >= 0, "seconds (>= 0)"),
    "status": (lambda v: _is_int(v) and (v == 200 or 400 <= v <= 599), "200 or 400-599"),
}


def _parse_item(item: object, where: str) -> Reply:
    def fail(msg: str) -> ScriptError:
        return ScriptError(f"{where}: {msg}")

    if not isinstance(item, dict):
        raise fail(f"expected a mapping, got {type(item).__name__}")
    for key, value in item.items():
        if key not in _CHECKS:
            raise fail(f"unknown key {key!r}")
        check, expected = _CHECKS[key]
        if not check(value):
            raise fail(f"field {key!r}: expected {expected}, got {type(value).__name__}")
    if "content" in item and ("text" in item or "tool_use" in item):
        raise fail("'content' cannot be combined with 'text' or 'tool_use'")
    kw: dict[str, Any] = {k: item[k] for k in ("stop_reason", "status") if k in item}
    blocks: list[dict[str, Any]] = []
    for i, block in enumerate(item.get("content", [])):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise fail(f"field 'content': block {i} must be a mapping with a string 'type'")
        blocks.append(block)
    if "text" in item:
        blocks.append({"type": "text", "text": item["text"]})
    if "tool_use" in item:
        tool = item["tool_use"]
        bad = sorted(set(tool) - {"name", "input", "id"})
        if bad:
            raise fail(f"field 'tool_use': unknown key {bad[0]!r}")
        name, args, tool_id = tool.get("name"), tool.get("input", {}), tool.get("id")
        if not isinstance(name, str) or not isinstance(args, dict):
            raise fail("field 'tool_use': needs a string 'name' and a mapping 'input'")
        if not isinstance(tool_id, str | None):
            raise fail("field 'tool_use': 'id' must be a string")
        blocks.extend(Reply.tool_use(name, args, tool_id).content)
        kw.setdefault("stop_reason", "tool_use")
    for key, value in item.get("usage", {}).items():
        if key not in _USAGE_KEYS:
            raise fail(f"field 'usage': unknown key {key!r}")
        if not _is_int(value) or value < 0:
            raise fail(f"field 'usage': {key!r} must be a non-negative integer")
        kw[key] = value
    if "delay" in item:
        kw["delay"] = float(item["delay"])
    return Reply(content=blocks, **kw)


def load_script(path: str | Path) -> tuple[Reply, ...]:
    """Read a YAML (or JSON) list of replies; error messages number items from 0.

    Item keys: ``text``, ``tool_use: {name, input, id?}``, ``content`` (raw blocks),
    ``stop_reason``, ``usage: {input_tokens, output_tokens, cache_read_input_tokens,
    cache_creation_input_tokens}``, ``delay`` (seconds), ``status`` (HTTP code).
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
        data: object = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ScriptError(f"{name}: {exc}") from exc
    if not isinstance(data, list):
        raise ScriptError(f"{name}: expected a list of replies, got {type(data).__name__}")
    return tuple(_parse_item(item, f"{name}: item {i}") for i, item in enumerate(data))


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: FakeMessagesAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client went away (e.g. it timed out mid-delay): nothing to report
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeMessagesAPI/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Mapping[str, Any], **headers: str) -> None:
        data = json.dumps(payload).encode()
        self.close_connection = True  # one request per connection: nothing outlives close()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
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
        n, reply = api._record(body, {k.lower(): v for k, v in self.headers.items()})
        rid = f"req_fake_{n:02d}"
        if reply is None:
            msg = f"fake API script exhausted: request {n} has no scripted reply"
            return self._send(500, _error("api_error", msg), request_id=rid, x_should_retry="false")
        if reply.delay > 0 and api._stopping.wait(reply.delay):
            return  # the server is closing: drop the connection unanswered
        if reply.status != 200:
            kind = {529: "overloaded_error", 429: "rate_limit_error"}.get(reply.status, "api_error")
            out = _error(kind, f"fake API scripted error {reply.status}")
            return self._send(reply.status, out, request_id=rid, retry_after_ms="10")
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
        self._send(200, message, request_id=rid)


def _check_loopback(host: str) -> None:
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"FakeMessagesAPI only listens on loopback addresses, not {host!r}")


class FakeMessagesAPI:
    """A scripted Messages API on a loopback port, served from a daemon thread.

    ``requests`` and ``request_headers`` (lower-cased names) record every
    ``POST /v1/messages`` with a JSON body, in arrival order.
    """

    def __init__(
        self, script: Iterable[Reply] = (), *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        _check_loopback(host)
        self._host, self._wanted_port = host, port
        self._lock = threading.Lock()
        self._queue: collections.deque[Reply] = collections.deque(script)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Reply | None]:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            return len(self.requests), (self._queue.popleft() if self._queue else None)

    def add(self, *replies: Reply) -> None:
        """Append replies to the end of the script."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been served yet."""
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
        script = load_script(script_path)
        api = FakeMessagesAPI(script, host=host, port=port).start()
    except (ValueError, OSError) as exc:
        print(f"fake-api: {exc}", file=stream, flush=True)
        return 2
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # else: only KeyboardInterrupt
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    try:
        line = f"fake Messages API listening on {api.base_url} ({len(script)} scripted replies)"
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

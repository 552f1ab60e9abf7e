"""The holes a review found in the control API, each closed as a class.

Most tests serve the real app (`build_app` over an in-process `Supervisor`) with a real uvicorn
on a loopback socket, in a thread, and talk to it with raw sockets or `http.client` (so every
header, duplicates included, is the test's to choose): `HEAD /api/events` and dropped streams
leave no subscriber behind; a chunked body crossing the cap in its last piece is answered 413
(not left hanging); `Origin` must be exactly `http://HOST`; a guarded header sent twice is
refused; without the token every request is 401 (nothing about routes, methods or types
leaks); a WebSocket never reaches the routes; an oversized integer is named as such; a config
nested too deeply is a 400, not a 500; only files directly in an allowed directory are
configs. One test restarts a real `fisk-sm supervise` whose run's config became a symlink to
outside: the run is not resumed, and no answer quotes the outside file.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from apikit import send
from browserkit import Watched, browser_or_skip
from ctlkit import DEADLINE, Supervisor, wait_until
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from fisk_sm.config.agent import parse_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor import Supervisor as InProcess
from fisk_sm.supervisor.api import build_app
from fisk_sm.supervisor.api.security import BodyLimit
from fisk_sm.supervisor.confine import ConfigDirs, NotAllowed
from fisk_sm.testing import FakeMessagesAPI, Reply

TOKEN = "review-token-1"
NO_LOAD = "config: does not load (see the supervisor's log)"
#: How long a condition that should hold at once is waited for (a leak never comes right).
SHORT = 30.0


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on a real uvicorn in a thread, on a free loopback port: its `host:port`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn to start")
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(DEADLINE)
        sock.close()


def in_process(tmp_path: Path, token: str | None = None) -> tuple[InProcess, Any]:
    """A supervisor of a config in `tmp_path` and its API (configs confined to `tmp_path`)."""
    config = parse_config({"llm": {"model": "m", "base_url": "http://127.0.0.1:9"}}, env={})
    supervisor = InProcess(config, FileStore(tmp_path / "state"))
    dirs = ConfigDirs.of(tmp_path / "agent.yaml")
    return supervisor, build_app(supervisor, token, config_dirs=dirs)


def request(
    where: str,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes | None = None,
) -> tuple[int, bytes]:
    """One request with exactly `headers`, repeats kept (`http.client.putheader`)."""
    host, port = where.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=DEADLINE)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in [("Host", where), *headers]:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


JSON = ("Content-Type", "application/json")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[InProcess, str]]:
    supervisor, app = in_process(tmp_path)
    with serving(app) as where:
        yield supervisor, where


def test_head_and_dropped_event_streams_leave_no_subscriber(
    served: tuple[InProcess, str],
) -> None:
    supervisor, where = served
    for _ in range(50):
        assert request(where, "HEAD", "/api/events", [])[0] == 200
    host, port = where.rsplit(":", 1)
    for _ in range(50):  # a GET whose client goes away once it has the headers
        with socket.create_connection((host, int(port)), timeout=DEADLINE) as client:
            client.sendall(f"GET /api/events HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
            seen = b""
            while b"\r\n\r\n" not in seen:
                seen += client.recv(4096)
            assert seen.startswith(b"HTTP/1.1 200"), seen
    hub = supervisor.hub
    wait_until(lambda: not hub.subscribers, "every event subscriber to go", SHORT)


async def test_the_body_limit_reads_nothing_past_the_last_piece() -> None:
    pieces: list[Message] = [
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"y" * 60, "more_body": False},  # crosses 100
    ]

    async def receive() -> Message:
        assert pieces, "receive() past the end of the body: a client would wait forever"
        return pieces.pop(0)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await Response(await Request(scope, receive).body())(scope, receive, send)

    sent: list[Message] = []

    async def record(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    await BodyLimit(app, limit=100)(scope, receive, record)
    assert sent[0]["status"] == 413


def test_a_chunked_body_crossing_the_cap_in_its_last_piece_gets_413() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await Response(await Request(scope, receive).body())(scope, receive, send)

    with serving(BodyLimit(app, limit=100)) as where:
        host, port = where.rsplit(":", 1)
        chunks = b"3c\r\n" + b"x" * 60 + b"\r\n3c\r\n" + b"y" * 60 + b"\r\n0\r\n\r\n"
        head = f"POST / HTTP/1.1\r\nHost: {where}\r\nTransfer-Encoding: chunked\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=SHORT) as client:
            client.sendall(head.encode() + chunks)  # one write: one piece, more_body False
            answer = client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer


def test_origin_must_be_exactly_this_apis_http_origin(served: tuple[InProcess, str]) -> None:
    _, where = served
    path = "/api/runs/nosuchrun/suspend"
    own = request(where, "POST", path, [JSON, ("Origin", f"http://{where}")], b"{}")
    assert own[0] == 404  # past every guard: the run is unknown
    for origin in (f"https://{where}", f"HTTP://{where}/", f"http://{where}.evil"):
        got = request(where, "POST", path, [JSON, ("Origin", origin)], b"{}")
        assert got[0] == 403, (origin, got)


def test_a_guarded_header_sent_twice_is_refused(tmp_path: Path) -> None:
    _, app = in_process(tmp_path, TOKEN)
    bearer = ("Authorization", f"Bearer {TOKEN}")
    path = "/api/runs/nosuchrun/suspend"
    with serving(app) as where:
        own = ("Origin", f"http://{where}")
        assert request(where, "POST", path, [bearer, JSON, own], b"{}")[0] == 404
        cases = [
            (403, [bearer, JSON, own, ("Origin", "http://evil.example")]),
            (403, [bearer, JSON, own, own]),  # even the same value twice
            (403, [bearer, JSON, ("Sec-Fetch-Site", "none"), ("Sec-Fetch-Site", "cross-site")]),
            (415, [bearer, JSON, ("Content-Type", "text/plain")]),
            (415, [bearer, JSON, JSON]),
            (401, [bearer, ("Authorization", "Bearer wrong"), JSON]),
            (401, [bearer, bearer, JSON]),
        ]
        for status, headers in cases:
            got = request(where, "POST", path, headers, b"{}")
            assert got[0] == status, (headers, got)
            assert list(json.loads(got[1])) == ["error"]
        twice = request(where, "GET", "/api/runs", [bearer, ("Host", where)])
        assert twice[0] in (400, 421), twice  # h11 or HostGuard: never served


def test_without_the_token_nothing_about_routes_is_told(tmp_path: Path) -> None:
    _, app = in_process(tmp_path, TOKEN)
    with serving(app) as where:
        cases = [
            ("PUT", "/api/runs", [JSON]),  # was 405
            ("POST", "/api/runs", [("Content-Type", "text/plain")]),  # was 415
            ("POST", "/api/runs", [JSON, ("Origin", "http://evil.example")]),  # was 403
            ("GET", "/no/such/route", []),
            ("DELETE", "/api/runs/x", []),
        ]
        for method, path, headers in cases:
            got = request(where, method, path, headers, b"{}" if method != "GET" else None)
            assert got[0] == 401, (method, path, got)
        rebound = request(where, "GET", "/api/runs", [("Host", "evil.example")])
        assert rebound[0] in (400, 421)  # Host is still checked first


async def websocket(app: Any, host: bytes) -> list[Message]:
    """What `app` sends to a WebSocket connection to /api/events with `Host: host`."""
    scope = {
        "type": "websocket",
        "path": "/api/events",
        "raw_path": b"/api/events",
        "query_string": b"",
        "headers": [(b"host", host)],
        "scheme": "ws",
        "server": ("127.0.0.1", 8000),
        "subprotocols": [],
    }
    inbox: list[Message] = [{"type": "websocket.connect"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return inbox.pop(0) if inbox else {"type": "websocket.disconnect", "code": 1000}

    async def record(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, record)
    return sent


async def test_a_websocket_never_reaches_the_routes(tmp_path: Path) -> None:
    _, app = in_process(tmp_path)
    for host in (b"127.0.0.1:8000", b"evil.example"):
        sent = await websocket(app, host)
        assert [(m["type"], m.get("code")) for m in sent] == [("websocket.close", 1008)]


def test_an_oversized_integer_is_named_not_called_bad_utf8(served: tuple[InProcess, str]) -> None:
    _, where = served
    body = b'{"prompt": "x", "n": ' + b"1" * 5000 + b"}"
    status, raw = request(where, "POST", "/api/runs", [JSON], body)
    assert (status, json.loads(raw)) == (400, {"error": "body: not valid JSON (integer too long)"})
    status, raw = request(where, "POST", "/api/runs", [JSON], b'{"prompt": "\xff"}')
    assert (status, json.loads(raw)) == (400, {"error": "body: not valid JSON (not UTF-8)"})


def test_a_config_nested_too_deeply_is_a_400(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("[" * 100_000)
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    _, app = in_process(tmp_path)
    with serving(app) as where:
        for name in ("deep.yaml", "bomb.yaml"):
            body = json.dumps({"prompt": "go", "config": name}).encode()
            status, raw = request(where, "POST", "/api/runs", [JSON], body)
            assert (status, json.loads(raw)) == (400, {"error": NO_LOAD}), name
        assert request(where, "GET", "/api/runs", [])[0] == 200


def alias_bomb() -> str:
    """478 bytes of YAML whose tree, expanded, has 9**10 leaves."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, 10):
        lines.append(f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_only_files_directly_in_an_allowed_directory_are_configs(tmp_path: Path) -> None:
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "x.yaml").write_text("llm: {model: m}\n")
    (tmp_path / "top.yaml").write_text("llm: {model: m}\n")
    dirs = ConfigDirs.of(tmp_path / "agent.yaml")
    assert dirs.confine("top.yaml") == (tmp_path / "top.yaml").resolve()
    assert dirs.confine("deep/../top.yaml") == (tmp_path / "top.yaml").resolve()
    for below in ("deep/x.yaml", str(tmp_path / "deep" / "x.yaml")):
        with pytest.raises(NotAllowed):
            dirs.confine(below)


def test_a_restart_confines_each_run_config_again_and_quotes_none(
    tmp_path: Path,
) -> None:
    home, outside = tmp_path / "home", tmp_path / "outside"
    home.mkdir()
    outside.mkdir()
    with FakeMessagesAPI() as api:
        plain = f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        tools = "tools:\n  - {python: 'console_tools:deploy', tags: ['ai:confirm']}\n"
        for name in ("sub1.yaml", "sub2.yaml"):
            (home / name).write_text(f"system_prompt: {name}\n" + plain + tools)
        (outside / "secret.yaml").write_text("TOPSECRET-RESTART\n")
        (outside / "valid.yaml").write_text("system_prompt: TOPSECRET-PROMPT\n" + plain)
        sup = Supervisor(home, api)
        runs = []
        with sup:
            for n, name in enumerate(("sub1.yaml", "sub2.yaml")):
                prompt = f"deploy {n}"
                api.add_conversation(prompt, Reply.tool_use("deploy", {"target": "t"}))
                body = {"prompt": prompt, "config": name}
                status, run = sup.api("POST", "/api/runs", body)
                assert status == 201, run
                runs.append(run["run_id"])
                sup.wait_status(run["run_id"], "parked")
        (home / "sub1.yaml").unlink()
        (home / "sub1.yaml").symlink_to(outside / "secret.yaml")
        (home / "sub2.yaml").unlink()
        (home / "sub2.yaml").symlink_to(outside / "valid.yaml")
        with sup:
            answers = [sup.api("GET", "/api/runs"), sup.api("GET", "/api/approvals")]
            answers += [sup.api("GET", f"/api/runs/{r}") for r in runs]
            answers.append((0, send(sup, "GET", "/api/events", read=False).status))
            for run_id in runs:
                assert sup.run(run_id)["outcome"] == (
                    "cannot load its config (see the supervisor's log)"
                )
                resumed = sup.api("POST", f"/api/runs/{run_id}/resume")
                answers.append(resumed)
            sup.stderr.wait_for(runs[1])  # the log says why
        text = json.dumps(answers)
        assert "TOPSECRET" not in text, text
        assert not api.requests_for("deploy 0")[1:]  # nothing ran past the park


def test_the_dashboard_drops_the_token_from_its_address(tmp_path: Path) -> None:
    sync_api, chromium = browser_or_skip()
    ms = DEADLINE * 1000
    with (
        FakeMessagesAPI() as api,
        Supervisor(tmp_path, api, token=TOKEN) as sup,
        sync_api.sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=ms)
        watched = Watched(browser.new_context(), sup.url)
        page = watched.page
        page.set_default_timeout(ms)
        response = page.goto(f"{sup.url}/?token={TOKEN}", wait_until="load")
        assert response is not None and response.ok
        page.locator("#live.on").wait_for()  # the stream, with the token kept in memory
        assert TOKEN not in page.url and page.url == sup.url + "/"
        api.add_conversation("after the address changed", Reply.text("still authorized"))
        run_id = sup.submit("after the address changed")
        page.locator(f'#runs tbody tr[data-run="{run_id}"]').wait_for()  # fetch + stream
        assert watched.console_errors() == []

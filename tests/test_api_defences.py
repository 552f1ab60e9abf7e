"""The control API's defences against a hostile browser and hostile input, on a live supervisor.

A real `fisk-sm supervise` (tests/ctlkit.py: a subprocess on 127.0.0.1 port 0, with the gated
`deploy` tool) is attacked with raw `http.client` requests, so each test sets the `Host`,
`Origin`, `Sec-Fetch-Site` and `Content-Type` a browser page would send: a DNS-rebound page
(421 on every route and method, walked from the app's own route table so a route added later
is covered), a cross-site form or `fetch` (403/415 on every POST, and the journal, the fake
Messages API and the tool's side-effect file show that nothing happened), the headers on every
kind of answer, hostile bodies (size, depth, lone surrogates), and run configs outside the
allowed directories (never echoed). Each runs without and with a token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from apikit import JSON, send
from ctlkit import CLI, DEADLINE, Supervisor
from hypothesis import given, settings
from hypothesis import strategies as st

from fisk_sm.config.agent import parse_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor import Supervisor as InProcess
from fisk_sm.supervisor.api import build_app
from fisk_sm.testing import FakeMessagesAPI, Reply

TOKEN = "defence-token-1"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options")


def routes(tmp_path: Path) -> list[tuple[str, frozenset[str]]]:
    """Every route of the app as built (path template, methods): a new route is walked too."""
    config = parse_config({"llm": {"model": "m"}}, env={})
    app = build_app(InProcess(config, FileStore(tmp_path)))
    return [(r.path, frozenset(r.methods or ())) for r in app.routes]  # type: ignore[attr-defined]


def fill(template: str, run_id: str, tool_use_id: str = "toolu_x") -> str:
    return template.replace("{run_id}", run_id).replace("{tool_use_id}", tool_use_id)


def body_for(path: str, marker: str) -> dict[str, str]:
    """A body each POST route would accept: the attack would work but for the defences."""
    if path == "/api/runs":
        return {"prompt": marker}
    if path.endswith("/say"):
        return {"text": marker}
    if "/approvals/" in path:
        return {"answer": "once"}
    return {}


def deploy_then(answer: str, target: str) -> list[Reply]:
    return [Reply.tool_use("deploy", {"target": target}), Reply.text(answer)]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["no-token", "token"])
def sup(
    request: pytest.FixtureRequest, api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisor]:
    with Supervisor(tmp_path_factory.mktemp("defences"), api, token=request.param) as supervisor:
        yield supervisor
    assert supervisor.process is not None and supervisor.process.returncode == 0


def parked_run(sup: Supervisor, api: FakeMessagesAPI, prompt: str, target: str) -> dict[str, Any]:
    api.add_conversation(prompt, *deploy_then("done", target))
    run = sup.wait_status(sup.submit(prompt), "parked")
    assert run["approval"] is not None
    return run


def test_a_rebound_host_is_refused_on_every_route_and_method(
    sup: Supervisor, tmp_path: Path
) -> None:
    port = urlsplit(sup.url).port
    hostile = f"attacker.example:{port}"
    walked = routes(tmp_path)
    assert any(path == "/api/events" for path, _ in walked)
    for template, methods in walked:
        path = fill(template, "r1")
        for method in sorted(methods | set(METHODS)):
            headers = {"Origin": f"http://{hostile}", **JSON}
            got = send(sup, method, path, {} if method != "GET" else None, headers, host=hostile)
            assert got.status == 421, (method, path, got)
            if method != "HEAD":
                assert "Host" in got.error(), (method, path, got)
            assert all(name in got.headers for name in HEADERS), (method, path)
    assert send(sup, "GET", "/api/runs").status == 200  # the same request, its own Host


def test_only_the_listening_names_and_port_are_served(sup: Supervisor) -> None:
    port = urlsplit(sup.url).port
    assert port is not None
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LocalHost:{port}"):
        assert send(sup, "GET", "/api/runs", host=host).status == 200, host
    hostile = (f"127.0.0.1:{port + 1}", "localhost", "127.0.0.1", "", f"127.0.0.1.nip.io:{port}")
    for host in hostile:
        assert send(sup, "GET", "/api/runs", host=host).status == 421, host
    stream = send(sup, "GET", "/api/events", host=f"rebind.example:{port}", read=False)
    assert stream.status == 421  # the event stream too


def test_a_cross_site_post_is_refused_and_does_nothing(
    sup: Supervisor, api: FakeMessagesAPI, tmp_path: Path
) -> None:
    marker = f"csrf submit {sup.token}"
    run = parked_run(sup, api, f"deploy to csrf-target {sup.token}", "csrf-target")
    run_id, tool_use_id = run["run_id"], run["approval"]["tool_use_id"]
    port = urlsplit(sup.url).port
    assert port is not None
    listed = len(sup.api("GET", "/api/runs")[1]["runs"])
    attacks: list[tuple[dict[str, str], bool, int]] = [  # (headers, JSON body?, status)
        ({"Content-Type": "text/plain"}, True, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, False, 415),
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, True, 403),
        ({"Origin": f"http://127.0.0.1:{port + 1}", **JSON}, True, 403),
        ({"Origin": f"http://localhost:{port}", **JSON}, True, 403),  # not this request's Host
        ({"Origin": "null", **JSON}, True, 403),
        ({"Sec-Fetch-Site": "same-site", **JSON}, True, 403),
        ({"Sec-Fetch-Site": "cross-site", **JSON}, True, 403),
        ({}, True, 415),  # no Content-Type at all
    ]
    posts = [t for t, methods in routes(tmp_path) if "POST" in methods]
    assert len(posts) >= 6
    for template in posts:
        path = fill(template, run_id, tool_use_id)
        body = body_for(template, marker)
        for headers, as_json, status in attacks:
            data = json.dumps(body).encode() if as_json else b"answer=once&prompt=x"
            got = send(sup, "POST", path, data, headers)
            assert got.status == status, (path, headers, got)
            assert got.error().split(":")[0] in ("Origin", "Content-Type"), got
        # DELETE from another origin is refused as well (405 when the route has no DELETE)
        evil = {"Origin": "http://evil.example", **JSON}
        assert send(sup, "DELETE", path, b"{}", evil).status in (403, 405)
    # Nothing happened: no new run, the parked run still parked, no request, no deploy.
    assert len(sup.api("GET", "/api/runs")[1]["runs"]) == listed
    assert sup.run(run_id)["status"] == "parked"
    assert api.requests_for(marker) == []
    assert "csrf-target" not in sup.effects_lines()
    # The positive control: the page's own origin, as JSON, is obeyed.
    approve = fill("/api/runs/{run_id}/approvals/{tool_use_id}", run_id, tool_use_id)
    own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin", **JSON}
    got = send(sup, "POST", approve, {"answer": "once"}, own)
    assert got.status == 200, got
    assert sup.wait_status(run_id, "completed")["answer"] == "done"
    assert sup.effects_lines().count("csrf-target") == 1
    charset = {"Content-Type": "application/json; charset=utf-8"}
    assert send(sup, "POST", f"/api/runs/{run_id}/suspend", b"{}", charset).status == 409


def test_every_kind_of_answer_carries_the_security_headers(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    api.add_conversation(f"seen {sup.token}", Reply.text("seen"))
    run_id = sup.submit(f"seen {sup.token}")
    sup.wait_status(run_id, "completed")
    query = f"?token={sup.token}" if sup.token else ""
    answers = {
        "dashboard": send(sup, "GET", "/" + query, token=False),
        "json": send(sup, "GET", "/api/runs"),
        "openapi": send(sup, "GET", "/openapi.json"),
        "svg or 501": send(sup, "GET", f"/api/runs/{run_id}/diagram.svg"),
        "400": send(sup, "GET", "/api/runs/bad%21id"),
        "404": send(sup, "GET", "/api/nothing"),
        "405": send(sup, "PUT", "/api/runs", b"{}", JSON),
        "403": send(sup, "POST", "/api/runs", b"{}", {"Origin": "null", **JSON}),
        "413": send(sup, "POST", "/api/runs", b"x" * (2 << 20), JSON),
        "415": send(sup, "POST", "/api/runs", b"{}"),
        "421": send(sup, "GET", "/api/runs", host="evil.example"),
        "stream": send(sup, "GET", "/api/events" + query, token=False, read=False),
    }
    if sup.token:
        answers["401"] = send(sup, "GET", "/api/runs", token=False)
    for kind, got in answers.items():
        csp = got.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp, (kind, csp)
        assert got.headers.get("x-frame-options") == "DENY", kind
        assert got.headers.get("x-content-type-options") == "nosniff", kind
        assert got.headers.get("referrer-policy") == "no-referrer", kind
    assert answers["dashboard"].status == 200 and b"<script>" in answers["dashboard"].body
    assert "script-src 'sha256-" in answers["dashboard"].headers["content-security-policy"]
    assert answers["stream"].headers["content-type"].startswith("text/event-stream")
    slash = send(sup, "GET", "/api/runs/")
    assert slash.status == 404 and "location" not in slash.headers, slash


def test_hostile_bodies_are_refused_naming_the_field(sup: Supervisor, api: FakeMessagesAPI) -> None:
    run = parked_run(sup, api, f"deploy to body-target {sup.token}", "body-target")
    run_id, tool_use_id = run["run_id"], run["approval"]["tool_use_id"]
    listed = len(sup.api("GET", "/api/runs")[1]["runs"])
    big = b'{"prompt": "' + b"x" * (2 << 20) + b'"}'
    got = send(sup, "POST", "/api/runs", big, JSON)
    assert got.status == 413 and "larger than" in got.error(), got
    chunks = iter([b'{"text": "', *[b"y" * 65536] * 32, b'"}'])  # no Content-Length
    got = send(sup, "POST", f"/api/runs/{run_id}/say", chunks, JSON)
    assert got.status == 413 and "larger than" in got.error(), got
    deep = b'{"prompt": "x", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    got = send(sup, "POST", "/api/runs", deep, JSON)
    assert got.status == 400 and got.error() == "body: nested deeper than 32 levels", got
    got = send(sup, "POST", "/api/runs", b"{" * 100_000, JSON)
    assert got.status == 400 and "nested deeper than 32 levels" in got.error(), got
    cases = [
        ("/api/runs", b'{"prompt": "a\\ud800b"}', "prompt: contains a lone surrogate"),
        ("/api/runs", b'{"prompt": "x", "name": "\\udfff"}', "name: contains a lone surrogate"),
        (f"/api/runs/{run_id}/say", b'{"text": "\\udc00"}', "text: contains a lone surrogate"),
        (
            f"/api/runs/{run_id}/approvals/{tool_use_id}",
            b'{"answer": "\\ud800"}',
            "answer: contains a lone surrogate",
        ),
    ]
    for path, data, message in cases:
        got = send(sup, "POST", path, data, JSON)
        assert got.status == 400 and got.error() == message, (path, got)
    assert len(sup.api("GET", "/api/runs")[1]["runs"]) == listed  # no run started
    assert sup.run(run_id)["status"] == "parked"
    # Brackets and escaped quotes inside strings are text, not nesting: accepted.
    prompt = 'brackets [[[[{{{{ \\" ' + "[" * 40
    api.add_conversation(json.loads(f'"{prompt}"'), Reply.text("fine"))
    data = b'{"prompt": "' + prompt.encode() + b'"}'
    got = send(sup, "POST", "/api/runs", data, JSON)
    assert got.status == 201, got
    sup.wait_status(json.loads(got.body)["run_id"], "completed")
    assert sup.api("POST", f"/api/runs/{run_id}/abort")[0] == 202


def test_the_cli_refuses_bad_allow_host_and_config_dir(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text("llm: {model: m}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    listen = ("--listen", "127.0.0.1:0")
    cases = [
        (["--allow-host", "a b"], "--allow-host: expected HOST or HOST:PORT, got 'a b'"),
        (["--allow-host", "::1"], "--allow-host: expected HOST or HOST:PORT"),
        (["--config-dir", str(tmp_path / "nope")], "--config-dir: "),
    ]
    for argv, message in cases:
        done = subprocess.run(
            [*CLI, "supervise", "-c", str(tmp_path / "agent.yaml"), *listen, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=DEADLINE,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_served_hosts_come_from_the_bound_socket() -> None:
    from fisk_sm.supervisor.api.server import served_hosts  # here: the other tests run without it

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        hosts = served_hosts(sock, "localhost", {"api.example:443", "api.example"})
        assert hosts == {
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"[::1]:{port}",
            "api.example:443",
            "api.example",
        }
    try:
        six = socket.socket(socket.AF_INET6)
        six.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with six:
        port = six.getsockname()[1]
        assert f"[::1]:{port}" in served_hosts(six, "::1")
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        port = sock.getsockname()[1]
        assert served_hosts(sock, "0.0.0.0") == {f"0.0.0.0:{port}"}  # names: --allow-host


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TEXT = st.text(alphabet='[]{}"\\ab\n', max_size=6)
_JSON = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.integers(min_value=0, max_value=8))
def test_the_depth_scan_agrees_with_the_parsed_depth(value: object, limit: int) -> None:
    from fisk_sm.supervisor.api.bodies import BadRequest, check_depth  # new: imported here

    raw = json.dumps(value).encode()
    try:
        check_depth(raw, limit)
        refused = False
    except BadRequest as exc:
        assert str(exc) == f"body: nested deeper than {limit} levels"
        refused = True
    assert refused == (_depth(value) > limit), raw

"""The supervisor in process: slots, one SDK client, the registry's dispositions, the stream,
and the control API's refusals (real SDK against the fake API, real journals, real HTTP)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from ctlkit import Supervisor as Process
from ctlkit import http
from openapi_spec_validator import validate

from fisk_sm import parse_config
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.model import clients
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.api import build_app
from fisk_sm.supervisor.api.openapi import openapi_document
from fisk_sm.supervisor.view.hub import DROPPED, Subscriber
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.testing.conversations import first_user_text, turn_of

CLI = [sys.executable, "-m", "fisk_sm.cli"]
DEADLINE = 60.0
TOOLS = """
import time

def look(what: str) -> str:
    '''Look at something.'''
    return "looked at " + what

def deploy(target: str) -> str:
    '''Deploy (gated).'''
    return "deployed " + target
"""


def agent(tmp_path: Path, api: FakeMessagesAPI) -> AgentConfig:
    (tmp_path / "sup_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "tools:\n  - {python: 'sup_tools:look'}\n"
        "  - {python: 'sup_tools:deploy', tags: ['ai:confirm']}\n"
    )
    return load_config(path)


async def until(condition: Callable[[], Any], what: str) -> Any:
    """Poll `condition` on the loop until it holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not (value := condition()):
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return value


async def supervised(
    tmp_path: Path, api: FakeMessagesAPI, body: Callable[[Supervisor], Awaitable[None]], **kw: Any
) -> Supervisor:
    os.environ.setdefault("ANTHROPIC_API_KEY", "test")
    sup = Supervisor(agent(tmp_path, api), FileStore(tmp_path / "state"), **kw)
    await sup.start()
    try:
        await body(sup)
    finally:
        await sup.shutdown()
    return sup


async def test_a_parked_run_holds_no_slot(tmp_path: Path) -> None:
    conversations = {
        "deploy": [Reply.tool_use("deploy", {"target": "prod"}, id="toolu_d"), Reply.text("ok")],
        "look": [Reply.tool_use("look", {"what": "x"}), Reply.text("seen")],
    }
    with FakeMessagesAPI(conversations=conversations) as api:

        async def body(sup: Supervisor) -> None:
            parked = await sup.submit("deploy")
            await until(lambda: parked.status == "parked", "the gated run to park")
            other = await sup.submit("look")  # one slot, and the parked run must not hold it
            await until(lambda: other.status == "completed", "the other run to complete")
            assert parked.status == "parked"
            assert [a["tool_use_id"] for a in sup.approvals()] == ["toolu_d"]

        await supervised(tmp_path, api, body, concurrency=1)


async def test_concurrency_bounds_calls_in_flight_and_one_client_serves_every_run(
    tmp_path: Path,
) -> None:
    lock, active, peak = threading.Lock(), [0], [0]
    ready = threading.Event()

    def respond(request: dict[str, Any]) -> Reply:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            ready.wait(DEADLINE)  # hold every call until the test has looked
            if turn_of(request) == 0:
                return Reply.tool_use("look", {"what": first_user_text(request) or ""})
            return Reply.text("done")
        finally:
            with lock:
                active[0] -= 1

    with FakeMessagesAPI(responder=respond) as api:

        async def body(sup: Supervisor) -> None:
            runs = [await sup.submit(f"p{i}") for i in range(40)]
            await until(lambda: active[0] == 4, "four calls in flight")
            entries = clients._BY_LOOP[asyncio.get_running_loop()].entries
            assert len(entries) == 1  # one SDK client ...
            assert next(iter(entries.values())).users == 40  # ... held by every run
            statuses = {r.status for r in runs}
            assert statuses == {"running", "queued"}, statuses
            ready.set()
            await until(lambda: all(r.status == "completed" for r in runs), "every run to end")

        await supervised(tmp_path, api, body, concurrency=4)
    assert peak[0] == 4
    assert len(api.requests) == 80


async def test_restart_resumes_only_what_the_shutdown_suspended(tmp_path: Path) -> None:
    slow = [Reply.text("late", delay=DEADLINE)]
    conversations = {p: [(*slow, Reply.text(f"{p} done"))] for p in ("a", "b", "c", "d")}
    with FakeMessagesAPI(conversations=conversations) as api:
        ids: dict[str, str] = {}

        async def first(sup: Supervisor) -> None:
            for p in "abcd":
                ids[p] = (await sup.submit(p)).entry.run_id
            await until(lambda: len(api.requests) == 4, "four calls in flight")
            await sup.suspend(ids["a"])
            await sup.abort(ids["b"])
            await until(lambda: not sup.get(ids["a"]).live, "a to stop")
            assert sup.get(ids["a"]).status == "suspended"
            assert sup.get(ids["b"]).status == "aborted"

        await supervised(tmp_path, api, first)  # c and d: suspended by the shutdown

        async def second(sup: Supervisor) -> None:
            done = {"c", "d"}
            await until(lambda: all(sup.get(ids[p]).status == "completed" for p in done), "c, d")
            assert sup.get(ids["a"]).status == "suspended"
            assert sup.get(ids["b"]).status == "aborted"
            await sup.resume(ids["a"])
            await until(lambda: sup.get(ids["a"]).status == "completed", "a to complete")
            assert sup.get(ids["b"]).status == "aborted"

        await supervised(tmp_path, api, second)
    asked = [first_user_text(r) for r in api.requests]
    assert sorted(asked) == ["a", "a", "b", "c", "c", "d", "d"]  # b never again


def test_the_openapi_document_is_valid_and_covers_every_route(tmp_path: Path) -> None:
    document = openapi_document()
    validate(document)
    config = parse_config({"llm": {"model": "m"}}, env={})
    app = build_app(Supervisor(config, FileStore(tmp_path)))
    routes = {(r.path, m.lower()) for r in app.routes for m in r.methods if m != "HEAD"}
    described = {(p, m) for p, ops in document["paths"].items() for m in ops}
    assert routes == described


def test_a_slow_subscriber_misses_events_with_a_note() -> None:
    async def main() -> list[tuple[int, str, str]]:
        subscriber = Subscriber(None, size=3)
        for n in range(5):
            subscriber.offer("r", (n + 1, "StateEntered", json.dumps({"n": n})))
        subscriber.queue.get_nowait()  # the reader takes one ...
        subscriber.close()  # ... and the stream ends after the rest
        return [item async for item in subscriber.items()]

    items = asyncio.run(main())
    assert items[0] == (1, DROPPED, json.dumps({"type": DROPPED, "run_id": None, "dropped": 2}))
    assert [json.loads(d)["n"] for _, _, d in items[1:]] == [1, 2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "0.0.0.0:0"], "--listen: 0.0.0.0 is not a loopback address; a token is"),
        (["--listen", "nonsense"], "--listen: expected HOST:PORT, got 'nonsense'"),
        (["--listen", "127.0.0.1:99999"], "--listen: the port must be 0-65535"),
        (["--concurrency", "0"], "--concurrency: must be at least 1, not 0"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "agent.yaml").write_text("llm: {model: m}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    done = subprocess.run(
        [*CLI, "supervise", "-c", str(tmp_path / "agent.yaml"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_token_is_required_on_every_route(tmp_path: Path) -> None:
    conversations = {"look": [Reply.text("seen")]}
    with (
        FakeMessagesAPI(conversations=conversations) as api,
        Process(tmp_path, api, token="s3cret-token") as sup,
    ):
        for path in ("/", "/api/runs", "/api/events", "/openapi.json", "/api/approvals"):
            status, body = http("GET", sup.url + path)
            assert status == 401 and "token" in body["error"], (path, status)
            assert http("GET", sup.url + path, token="wrong")[0] == 401
        assert http("POST", sup.url + "/api/runs", {"prompt": "look"})[0] == 401
        assert http("GET", sup.url + "/api/runs?token=s3cret-token")[0] == 401  # header only
        assert http("GET", sup.url + "/openapi.json", token="s3cret-token")[0] == 200
        run_id = sup.submit("look")
        assert sup.wait_status(run_id, "completed")["answer"] == "seen"
        assert http("GET", sup.url + "/?token=s3cret-token")[0] == 200


def test_bad_requests_get_one_line_naming_the_field(tmp_path: Path) -> None:
    with (
        FakeMessagesAPI(conversations={"look": [Reply.text("seen")]}) as api,
        Process(tmp_path, api) as sup,
    ):
        url = sup.url
        cases = [
            ("POST", "/api/runs", b"{not json", 400, "body: not valid JSON"),
            ("POST", "/api/runs", [1], 400, "body: must be a JSON object"),
            ("POST", "/api/runs", {}, 400, "prompt: required"),
            ("POST", "/api/runs", {"prompt": 3}, 400, "prompt: must be a string"),
            ("POST", "/api/runs", {"prompt": "x", "name": []}, 400, "name: must be a string"),
            ("POST", "/api/runs", {"prompt": "x", "config": "/nope.yaml"}, 400, "config:"),
            ("GET", "/api/runs/bad%21id", None, 400, "run_id: invalid session id"),
            ("GET", "/api/runs/nosuchrun", None, 404, "no run 'nosuchrun'"),
            ("POST", "/api/runs/nosuchrun/resume", None, 404, "no run"),
            ("GET", "/api/events?run=no%20such", None, 400, "run: invalid session id"),
            ("GET", "/api/nothing", None, 404, "no route /api/nothing"),
        ]
        for method, path, body, status, message in cases:
            data = body if isinstance(body, bytes) else None
            got_status, got = _request(method, url + path, data if data else body)
            assert got_status == status and message in got["error"], (path, got)
            assert "\n" not in got["error"]
        run_id = sup.submit("look")
        sup.wait_status(run_id, "completed")
        status, got = sup.api("POST", f"/api/runs/{run_id}/approvals/toolu_x", {"answer": "y"})
        assert status == 400 and "answer: must be one of once, always, deny" in got["error"]
        status, got = sup.api("POST", f"/api/runs/{run_id}/approvals/toolu_x", {"answer": "once"})
        assert status == 404 and "no pending approval" in got["error"]
        status, got = sup.api("POST", f"/api/runs/{run_id}/suspend")
        assert status == 409 and "not running" in got["error"]
        status, got = sup.api("POST", f"/api/runs/{run_id}/abort")
        assert status == 409 and "has ended" in got["error"]


def _request(method: str, url: str, body: Any) -> tuple[int, Any]:
    if not isinstance(body, bytes):
        return http(method, url, body)
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_run_is_not_ended_before_its_end_is_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal record is written after the run enters its terminal state: until it is,
    the run is still running (what reads its journal then finds the end there)."""
    from fisk_sm.journal.filejournal import FileJournal
    from fisk_sm.journal.records import Terminal

    held, release = asyncio.Event(), asyncio.Event()
    append = FileJournal.append

    async def slow_end(self: FileJournal, record: Any) -> None:
        if isinstance(record, Terminal):
            held.set()
            await release.wait()
        await append(self, record)

    monkeypatch.setattr(FileJournal, "append", slow_end)
    with FakeMessagesAPI(conversations={"look": [Reply.text("seen")]}) as api:

        async def body(sup: Supervisor) -> None:
            run = await sup.submit("look")
            try:
                await asyncio.wait_for(held.wait(), DEADLINE)
                assert run.state == "completed" and run.status == "running"
            finally:
                release.set()
            await until(lambda: run.status == "completed", "the run to end")
            records = await sup.records_of(run.entry.run_id)
            assert isinstance(records[-1], Terminal) and records[-1].reason == "completed"

        await supervised(tmp_path, api, body)


async def test_the_stream_tells_a_run_ended_with_its_last_run_event(tmp_path: Path) -> None:
    conversations = {"look": [Reply.tool_use("look", {"what": "x"}), Reply.text("seen")]}
    with FakeMessagesAPI(conversations=conversations) as api:

        async def body(sup: Supervisor) -> None:
            subscriber = sup.hub.subscribe()
            run = await sup.submit("look")
            await until(lambda: run.status == "completed" and not run.live, "the run to end")
            updates = []
            while not subscriber.queue.empty():
                item = subscriber.queue.get_nowait()
                if item is not None and item[1] in ("RunSubmitted", "RunUpdated"):
                    updates.append(json.loads(item[2]))
            assert updates[-1]["status"] == "completed", updates[-1]
            assert updates[-1]["state"] == "completed" and updates[-1]["answer"] == "seen"

        await supervised(tmp_path, api, body)


def test_a_second_supervisor_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    with FakeMessagesAPI() as api, Process(tmp_path, api) as first:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        argv = ["supervise", "-c", str(first.agent), "--listen", "127.0.0.1:0"]
        second = subprocess.run(
            [*CLI, *argv, "--state-dir", str(first.state)],
            capture_output=True,
            text=True,
            env={**env, "ANTHROPIC_API_KEY": "test"},
            timeout=DEADLINE,
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert "another fisk-sm supervise drives the runs of this state directory" in second.stderr
        assert first.api("GET", "/api/runs")[0] == 200  # the first one is untouched

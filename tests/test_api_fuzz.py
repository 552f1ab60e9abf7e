"""Hypothesis throws random requests at a live control API; every answer is one it documents.

A real `fisk-sm supervise` (tests/livekit.py: each run parks at the approval desk) gets 500
requests (a test checks first that the document's paths are the app's routes) on every path,
with a run id that is real, unknown or malformed, and bodies of every shape: a valid one with
one field made anything, JSON of random structure, invalid UTF-8, UTF-16, lone surrogate
escapes, huge and non-finite numbers, 100,000 brackets, a body over the size cap. Half the
requests are what a client sends (the path's method, JSON, its own Origin and Host); the
rest take any method, any content type, a foreign `Origin`, `Sec-Fetch-Site` or `Host`. For
each answer:

- never a 500, and only a status the served OpenAPI document lists for that route and method
  (a method the path does not take: 405, its `Allow` naming the path's methods);
- an error is the one-line JSON `{"error": ...}`;
- a refused request changed nothing: no new run, the parked run still parked on the same
  approval, the gated tool never ran.

A request the API accepts may start a run or answer the approval: the test then waits for it
to settle and parks a fresh run to aim at. `/api/events` (an endless stream for a real run)
is tested apart, below: refused methods, bad and unknown run ids, a foreign Host.

On the code before issue 11 both fail: a 405 without `Allow`, a foreign Host answered 200.
$FISK_SM_FUZZ_EXAMPLES sets the number of requests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import hypothesis.strategies as st
from ctlkit import Supervisor
from hypothesis import HealthCheck, given, settings
from livekit import Answer, error_of, live, raw, runs_of
from starlette.routing import Route

from fisk_sm import parse_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor import Supervisor as InProcess
from fisk_sm.supervisor.api import MAX_BODY, build_app

#: Requests per run of the test ($FISK_SM_FUZZ_EXAMPLES for a longer hunt).
EXAMPLES = int(os.environ.get("FISK_SM_FUZZ_EXAMPLES", "500"))
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
SETTLED = ("parked", "completed", "aborted", "suspended", "failed")

#: Bodies no JSON generator makes: broken encodings, tricks of the JSON grammar, sizes.
HOSTILE_BODIES = [
    b"",
    b"   ",
    b"\x00",
    b"\xff\xfe\xfd",
    b'{"prompt": "\xff\xfe"}',
    '{"prompt": "deploy"}'.encode("utf-16"),
    b'{"prompt": "\\ud800"}',
    b'{"prompt": "ok", "name": "\\udfff"}',
    b'{"text": "a\\ud83d"}',
    b'{"answer": "once", "\\ud800": 1}',
    b'{"prompt": 1e999999}',
    b'{"prompt": "ok", "chat": ' + b"9" * 5000 + b"}",
    b'{"prompt": NaN}',
    b'{"answer": Infinity}',
    b"NaN",
    b"[" * 100_000,
    b'{"a":' * 50 + b"1" + b"}" * 50,
    b'{"prompt": "x", "prompt": "   "}',
    b'{"prompt": " \\t\\n"}',
    b'{"prompt": ""}',
    b'{"text": ""}',
    b'{"prompt": "ok", "config": "/etc/passwd"}',
    b'{"prompt": "ok", "config": "../../agent.yaml"}',
    b'{"prompt": "ok", "config": "\\u0000"}',
    b'{"prompt": "ok", "chat": "yes"}',
    b'{"answer": "sure"}',
    b"{}",
    b"[]",
    b'"a string"',
    b"prompt=deploy",
    b"x" * (MAX_BODY + 1),
]
#: Bodies some route accepts (with the right content type, method and origin).
VALID_BODIES: dict[str, list[dict[str, Any]]] = {
    "/api/runs": [{"prompt": "deploy it"}, {"prompt": "x", "name": "<b>", "chat": False}],
    "/api/runs/{run_id}/say": [{"text": "and again"}],
    "/api/runs/{run_id}/approvals/{tool_use_id}": [{"answer": "once"}, {"answer": "deny"}],
}
JSON_TYPES = ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON"]
FOREIGN = ["http://127.0.0.1:1", "null", "http://evil.example"]
SITES = ["cross-site", "same-site", "none"]
CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "text/plain",
    "text/plain; charset=utf-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json-patch+json",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
#: Objects with the API's own field names, so some requests are accepted.
fields = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=30) | json_values,
        "text": st.text(max_size=30) | json_values,
        "answer": st.sampled_from(["once", "always", "deny", "never", ""]) | json_values,
        "name": st.text(max_size=30) | st.none(),
        "chat": st.booleans() | json_values,
        "config": st.sampled_from(["agent.yaml", "nope.yaml", "/etc/passwd", ""]),
    },
)


@st.composite
def bodies(draw: st.DrawFn, template: str) -> bytes | None:
    """A body the route accepts, one of its fields made anything (a mutant), a hostile body,
    JSON text in some encoding, or none."""
    kinds = ["valid", "mutant", "mutant", "mutant", "hostile", "hostile", "fields", "json", "none"]
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    if kind == "hostile":
        return draw(st.sampled_from(HOSTILE_BODIES))
    valid = draw(st.sampled_from(VALID_BODIES.get(template, [{}])))
    if kind == "valid":
        return json.dumps(valid).encode()
    if kind == "mutant":
        key = draw(st.sampled_from([*valid, "chat", "name", "config", "extra"]))
        value = {**valid, key: draw(json_values)}
    else:
        value = draw(fields if kind == "fields" else json_values)
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), allow_nan=True)
    return text.encode(draw(st.sampled_from(["utf-8", "utf-8", "utf-16-le", "latin-1"])), "replace")


def _templates(document: dict[str, Any]) -> list[str]:
    """Every path but the event stream's; those that take a body twice (more to find there)."""
    paths = sorted(p for p in document["paths"] if p != "/api/events")
    return paths + [p for p in paths if "post" in document["paths"][p]]


def _app_paths(where: Path) -> set[str]:
    """The path templates of the app's own routes (an app built in-process)."""
    where.mkdir()
    config = parse_config({"llm": {"model": "m"}}, env={})
    app = build_app(InProcess(config, FileStore(where)))
    return {route.path for route in app.routes if isinstance(route, Route)}


class Target:
    """The run the requests aim at: parked on its approval until a request is accepted."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.made: set[str] = set()
        self.run_id = ""
        self.tool_use_id = ""
        self.park()

    def park(self) -> None:
        """Submit a new run and wait until it is parked."""
        self.run_id = self.sup.submit(f"target {len(self.made)}")
        self.made.add(self.run_id)
        run = self.sup.wait_status(self.run_id, "parked")
        self.tool_use_id = run["approval"]["tool_use_id"]

    def state(self) -> tuple[Any, ...]:
        """What a refused request must not change: the runs, this one's approval, the tool."""
        runs = runs_of(self.sup)
        mine = next(r for r in runs if r["run_id"] == self.run_id)
        ids = frozenset(r["run_id"] for r in runs)
        return ids, mine["status"], json.dumps(mine["approval"]), len(self.sup.effects_lines())

    def settle(self) -> None:
        """After an accepted request: wait until every run has settled; re-park if needed."""
        for run in runs_of(self.sup):
            self.sup.wait_status(run["run_id"], *SETTLED)
        if self.sup.run(self.run_id)["status"] != "parked":
            self.park()


def _check_answer(
    answer: Answer, method: str, template: str, document: dict[str, Any], foreign_host: bool
) -> None:
    status, headers, data = answer
    assert status != 500, data
    operations = document["paths"][template]
    allowed = {m.upper() for m in operations} | ({"HEAD"} if "get" in operations else set())
    if foreign_host:
        assert status == 421, (status, data)
    elif method not in allowed:
        assert status == 405, (status, data)
        given = {m.strip() for m in headers.get("allow", "").split(",")}
        assert given == allowed, (headers, allowed)
    else:
        documented = operations["get" if method == "HEAD" else method.lower()]["responses"]
        assert str(status) in documented, (status, sorted(documented), data[:300])
    if status >= 400 and method != "HEAD":
        assert headers.get("content-type", "").startswith("application/json"), headers
        error_of(data)


def test_random_requests_get_documented_answers_and_refusals_change_nothing(
    tmp_path: Path,
) -> None:
    with live(tmp_path / "sup") as (sup, _):
        status, document = sup.api("GET", "/openapi.json")
        assert status == 200
        assert _app_paths(tmp_path / "app") == set(document["paths"])
        target = Target(sup)
        host = sup.url.removeprefix("http://")
        tally: dict[int, int] = {}
        created: set[str] = set()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(
            template=st.sampled_from(_templates(document)),
            run_id=st.sampled_from(["real", "unknown", "bad"]),
            tool_use_id=st.sampled_from(["real", "unknown"]),
            proper=st.booleans(),
            data=st.data(),
        )
        def check(
            template: str, run_id: str, tool_use_id: str, proper: bool, data: st.DataObject
        ) -> None:
            # Half the requests are what a client of the API sends (its method, JSON, no
            # foreign Origin or Host), so the body reaches the route; the rest, anything.
            own = sorted(m.upper() for m in document["paths"][template])
            method = data.draw(st.sampled_from(own if proper else METHODS))
            content_type = data.draw(st.sampled_from(JSON_TYPES if proper else CONTENT_TYPES))
            origin = data.draw(st.sampled_from([None, "own", *([] if proper else FOREIGN)]))
            fetch_site = data.draw(
                st.sampled_from([None, "same-origin", *([] if proper else SITES)])
            )
            foreign_host = not proper and data.draw(st.sampled_from([False, False, True]))
            body = data.draw(bodies(template))
            ids = {
                "real": target.run_id,
                "unknown": "20990101T000000-00000000",
                "bad": data.draw(st.sampled_from(["-x", "a" * 200, "..", "a b", "ä", "%00"])),
            }
            path = template.replace("{run_id}", quote(ids[run_id], safe="%"))
            tool = target.tool_use_id if tool_use_id == "real" else "toolu_unknown"
            path = path.replace("{tool_use_id}", quote(tool))
            headers = {"Host": data.draw(st.sampled_from(["evil.example", "127.0.0.1:1"]))}
            if not foreign_host:
                headers["Host"] = data.draw(st.sampled_from([host, host.upper()]))
            if content_type:
                headers["Content-Type"] = content_type
            if origin:
                headers["Origin"] = sup.url if origin == "own" else origin
            if fetch_site:
                headers["Sec-Fetch-Site"] = fetch_site
            before = target.state()
            answer = raw(sup.url, method, path, body, headers)
            tally[answer[0]] = tally.get(answer[0], 0) + 1
            _check_answer(answer, method, template, document, foreign_host)
            if answer[0] < 400:
                if method == "POST" and template == "/api/runs":
                    created.add(json.loads(answer[2])["run_id"])
                if method == "POST":
                    target.settle()
                return
            assert target.state() == before, (answer, before, target.state())

        check()
        print("statuses:", dict(sorted(tally.items())), "runs created:", len(created))
        listed = {r["run_id"] for r in runs_of(sup)}
        assert listed == created | target.made, (listed, created, target.made)
        # The requests reached the routes (2xx, 400) and the guards before them (405, 421).
        assert {400, 405, 421} <= set(tally) and min(tally) < 300, tally


def test_the_event_stream_refuses_what_it_does_not_take(tmp_path: Path) -> None:
    with live(tmp_path) as (sup, _):
        run_id = sup.submit("deploy, and watch the stream")
        sup.wait_status(run_id, "parked")
        before = [(r["run_id"], r["status"]) for r in runs_of(sup)]
        json_type = {"Content-Type": "application/json", "Origin": sup.url}
        for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            status, headers, data = raw(sup.url, method, "/api/events", b"{}", json_type)
            assert status == 405 and headers["allow"] == "GET, HEAD", (status, headers)
            assert "not allowed" in error_of(data)
        for bad in ("-x", "a" * 200, "..", "a%20b", "%00", "%C3%A4", "%ED%A0%80"):
            status, _, data = raw(sup.url, "GET", f"/api/events?run={bad}")
            assert status == 400 and error_of(data).startswith("run: "), (bad, status, data)
        status, _, data = raw(sup.url, "GET", "/api/events?run=20990101T000000-00000000")
        assert status == 404, (status, data)
        error_of(data)
        for host in ("evil.example", "127.0.0.1:1", f"evil.example:{sup.url.rsplit(':', 1)[1]}"):
            status, _, data = raw(sup.url, "GET", f"/api/events?run={run_id}", None, {"Host": host})
            assert status == 421, (host, status)
            error_of(data)
        # The control: the stream itself opens (its body, endless, is not read).
        status, headers, _ = raw(sup.url, "GET", f"/api/events?run={run_id}", read=False)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert [(r["run_id"], r["status"]) for r in runs_of(sup)] == before

"""Schemathesis against a live supervisor: the served OpenAPI document is true.

A real `fisk-sm supervise` on a loopback port (tests/livekit.py: every run parks at the
approval desk first) is tested by the real `st` command, reading the `/openapi.json` it serves, with
every check (`-c all`: server errors, undocumented status codes, response schemas and headers,
schema-valid requests refused, schema-violating ones accepted, 405 with `Allow` for an
undeclared method, ...) in the coverage, fuzzing and stateful phases (the stateful phase
follows the document's links from a new run to every route on it). `/api/events` is an
endless stream: tests/test_api_fuzz.py tests it apart. Bounded: 30 examples per operation,
a fixed seed (about 600 requests). The HAR report then says what was sent and answered: every
run the supervisor knows (listed, journaled) was created by a 201, the fake Messages API was
only asked about those runs' prompts, `deploy` ran no more often than an approval was granted
with a 200, and the stateful phase reached every route on a run it created (the approval's
answer only through the document's links).

On the code before issue 11 this failed with 11 failures (14 with st's default flags): a blank
prompt refused though documented as any string, 405 without `Allow` on every path (and a 500
on a lone surrogate, with the default codec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from livekit import live, runs_of

#: positive_data_acceptance: a schema-valid submit may still name a `config` that is not an
#: allowed file (the generator cannot know one): 400 is right for that, on that operation only.
CONFIG = """\
[[operations]]
include-operation-id = "submitRun"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409"]
"""
ST = Path(sys.executable).with_name("st")
#: Test cases per operation ($FISK_SM_ST_EXAMPLES for a longer hunt).
EXAMPLES = os.environ.get("FISK_SM_ST_EXAMPLES", "30")


#: The routes on one run, as (method, path with the run id as `{}`).
RUN_ROUTES = [
    ("GET", "/api/runs/{}"),
    ("GET", "/api/runs/{}/diagram.svg"),
    ("POST", "/api/runs/{}/suspend"),
    ("POST", "/api/runs/{}/resume"),
    ("POST", "/api/runs/{}/abort"),
    ("POST", "/api/runs/{}/end"),
    ("POST", "/api/runs/{}/say"),
    ("POST", "/api/runs/{}/approvals/*"),
]


def _run_id(url: str) -> str | None:
    parts = urlsplit(url).path.split("/")
    return parts[3] if len(parts) > 3 and parts[:3] == ["", "api", "runs"] else None


def _route(url: str) -> str:
    parts = urlsplit(url).path.split("/")
    parts[3] = "{}"
    if len(parts) > 5 and parts[4] == "approvals":
        parts[5] = "*"
    return "/".join(parts)


def _exchanges(har: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(har.read_text())["log"]["entries"]
    return entries


def _posted(entry: dict[str, Any]) -> Any:
    text = (entry["request"].get("postData") or {}).get("text") or ""
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_schemathesis_finds_no_failure_against_a_live_supervisor(tmp_path: Path) -> None:
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    har = tmp_path / "exchanges.har"
    with live(tmp_path / "sup") as (sup, api):
        argv = [str(ST), "--config-file", str(tmp_path / "schemathesis.toml"), "run"]
        argv += ["--checks", "all", "--phases", "coverage,fuzzing,stateful"]
        argv += ["--exclude-path", "/api/events", "--max-examples", EXAMPLES, "--seed", "1"]
        # utf-8: a lone surrogate is no text; the API refuses one (400, naming the field),
        # which tests/test_api_fuzz.py checks.
        argv += ["--generation-codec", "utf-8", "--generation-database", "none"]
        argv += ["--workers", "1", "--no-color", "--request-timeout", "60"]
        argv += ["--report", "har", "--report-har-path", str(har)]
        done = subprocess.run(
            [*argv, f"{sup.url}/openapi.json"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=540,
        )
        summary = done.stdout[done.stdout.rfind("SUMMARY") :]
        print(summary)
        assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
        assert "Failures:" not in summary and "passed" in summary, summary
        runs = runs_of(sup)
        effects = sup.effects_lines()
    asked = {json.dumps(r["messages"][0]["content"]) for r in api.requests}

    exchanges = _exchanges(har)
    created = [
        e
        for e in exchanges
        if e["request"]["method"] == "POST"
        and e["request"]["url"].endswith("/api/runs")
        and e["response"]["status"] == 201
    ]
    granted = [
        e
        for e in exchanges
        if e["request"]["method"] == "POST"
        and "/approvals/" in e["request"]["url"]
        and e["response"]["status"] == 200
        and (_posted(e) or {}).get("answer") in ("once", "always")
    ]
    journals = list((tmp_path / "sup" / "state").glob("*.json"))
    print(f"{len(exchanges)} requests, {len(created)} runs created, {len(granted)} approvals")
    print(f"granted, {len(effects)} deploys, {len(asked)} conversations asked of the model")
    assert len(exchanges) > 100, len(exchanges)
    # Every run, journaled or listed, came from a 201; no refused request started one.
    assert created and len(runs) == len(created) == len(journals), (runs, created, journals)
    prompts = {json.dumps(_posted(e)["prompt"]) for e in created}
    assert asked and asked <= prompts, asked - prompts  # the model saw only created runs
    assert len(effects) <= len(granted), (effects, granted)  # no refused request approved
    # The stateful phase followed the links: each route was reached on a run a 201 made.
    ids = {json.loads(e["response"]["content"]["text"])["run_id"] for e in created}
    reached = {
        (e["request"]["method"], _route(e["request"]["url"]))
        for e in exchanges
        if e["response"]["status"] in (200, 202, 409) and _run_id(e["request"]["url"]) in ids
    }
    for route in RUN_ROUTES:
        assert route in reached, (route, sorted(reached))

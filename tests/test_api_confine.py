"""`POST /api/runs` config paths: only files in the allowed directories, and never echoed.

A real `fisk-sm supervise` (tests/ctlkit.py) started with `--config-dir EXTRA` and
`--allow-host fisk.test`. A client names configs inside its agent.yaml's directory (relative and
absolute), in EXTRA, outside both (a secret file, /etc/passwd, a missing file), through a
symlink or `..`, and files that are not YAML or not a config. The refusals are one generic line
that says neither what the file holds nor whether it exists; the supervisor's log says why a
config does not load. Also: `--allow-host` adds a name the API answers under, Host and Origin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from apikit import JSON, send
from ctlkit import Supervisor

from fisk_sm.testing import FakeMessagesAPI, Reply

NOT_ALLOWED = "config: not an allowed config file"
NO_LOAD = "config: does not load (see the supervisor's log)"
SECRETS = ("TOPSECRET-1", "TOPSECRET-2", "TOPSECRET-3")


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def sup(api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    root = tmp_path_factory.mktemp("confine")
    home, extra, outside = root / "home", root / "extra", root / "outside"
    for directory in (home, extra, outside):
        directory.mkdir()
    plain = f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
    (home / "other.yaml").write_text("system_prompt: other\n" + plain)
    (extra / "team.yaml").write_text("system_prompt: team\n" + plain)
    (outside / "secret.yaml").write_text("system_prompt: TOPSECRET-3\n" + plain)
    (home / "notes.txt").write_text("TOPSECRET-1: [unclosed\n")
    (home / "scalar.yaml").write_text("TOPSECRET-2\n")
    (home / "link.yaml").symlink_to(outside / "secret.yaml")
    (home / "dir.yaml").mkdir()
    args = ("--config-dir", str(extra), "--allow-host", "fisk.test")
    with Supervisor(home, api, args=args) as supervisor:
        yield supervisor


def submit(sup: Supervisor, config: str, prompt: str = "look") -> tuple[int, dict[str, str]]:
    got = send(sup, "POST", "/api/runs", {"prompt": prompt, "config": config}, JSON)
    return got.status, json.loads(got.body)


def test_a_config_outside_the_allowed_directories_is_refused_unquoted(sup: Supervisor) -> None:
    home = sup.root
    outside = home.parent / "outside"
    refused = [
        "/etc/passwd",
        str(outside / "secret.yaml"),
        str(outside / "missing.yaml"),  # the same answer: existence is not told
        "../outside/secret.yaml",
        "link.yaml",  # inside, but a symlink to outside
        str(home / "missing.yaml"),
        "dir.yaml",  # a directory
        str(home.parent / "extra"),
    ]
    for config in refused:
        status, body = submit(sup, config)
        assert (status, body) == (400, {"error": NOT_ALLOWED}), config
    passwd = Path("/etc/passwd").read_text().splitlines()[0].split(":")[0]
    assert passwd not in NOT_ALLOWED
    runs = sup.api("GET", "/api/runs")[1]["runs"]
    assert runs == []


def test_a_config_that_does_not_load_is_not_echoed(sup: Supervisor) -> None:
    for config in ("notes.txt", str(sup.root / "scalar.yaml")):
        status, body = submit(sup, config)
        assert (status, body) == (400, {"error": NO_LOAD}), config
    sup.stderr.wait_for("notes.txt")  # the supervisor's log tells the operator why
    sup.stderr.wait_for("scalar.yaml")


def test_configs_in_the_allowed_directories_run(sup: Supervisor, api: FakeMessagesAPI) -> None:
    extra = sup.root.parent / "extra"
    for config, prompt in [
        ("other.yaml", "relative to agent.yaml"),
        (str(sup.root / "other.yaml"), "absolute"),
        (str(extra / "team.yaml"), "from --config-dir"),
        (str(extra / ".." / "extra" / "team.yaml"), "through .. but inside"),
    ]:
        api.add_conversation(prompt, Reply.text("ran " + prompt))
        status, body = submit(sup, config, prompt)
        assert status == 201, (config, body)
        assert sup.wait_status(body["run_id"], "completed")["answer"] == "ran " + prompt
    system = [r["system"] for r in api.requests_for("from --config-dir")]
    assert "team" in json.dumps(system)


def test_allow_host_adds_a_name_for_host_and_origin(sup: Supervisor) -> None:
    port = urlsplit(sup.url).port
    named = f"fisk.test:{port}"
    assert send(sup, "GET", "/api/runs", host=named).status == 200
    own = {"Origin": f"http://{named}", **JSON}
    got = send(sup, "POST", "/api/runs/nosuchrun/suspend", b"{}", own, host=named)
    assert got.status == 404, got  # past every guard: the run is unknown
    assert send(sup, "GET", "/api/runs", host=f"fisk.test:{port + 1}").status == 421
    assert send(sup, "GET", "/api/runs", host=f"other.test:{port}").status == 421

"""A session journaled before the pydantic tool schemas resumes without `--force`.

What this protects: the sessions written by the build whose `@tool` mapped type hints by hand
(commit 5a27dad). Its fingerprint holds a digest of the tool definitions, and pydantic maps
`X | None` and an `Enum` otherwise, so without the legacy recognition
(`fisk_sm.tools.schema_legacy`) every such session would be refused as drift. The session was
recorded with that very build (`fisk-sm run` against the fake API) by
tests/fixtures/schema_compat/make_fixture.py and committed, so that no test needs the
repository's history; each test resumes a copy with the current code. A real change of the tool
(a parameter's type, its description) must still be refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "schema_compat"
OLD = "5a27dad"  # the last build with the hand-written schema mapping
LEGACY = "fisk_sm.tools.schema_legacy"
HANG = 60  # a guard against a hang, far above what any machine needs
AGENT_YAML = """\
llm: {model: claude-compat, no_prompt_cache: true}
tools:
  - {python: 'schema_tools:probe'}
"""
TOOLS = '''\
import enum


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


def probe(mode: Mode, flag: bool | None = None) -> str:
    """Probe something.

    Args:
        mode: how to probe.
        flag: whether to flag it.
    """
    return f"probed {Mode(mode).value} {flag}"
'''


def fisk(
    where: Path, api: FakeMessagesAPI, *args: str, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`fisk-sm ARGS` in `where` (`-X importtime`: stderr names every module imported)."""
    env = {**os.environ, "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.base_url}
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fisk_sm.cli", *args], cwd=where, env=env,
        input="", capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip


def recorded(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A copy of session `s1`, written by the old build (its tool ran, then the API failed: a
    session stopped mid-run, resumable), and the tools the old build offered."""
    where = tmp_path / "agent"
    (where / "sessions").mkdir(parents=True)
    (where / "agent.yaml").write_text(AGENT_YAML)
    (where / "schema_tools.py").write_text(TOOLS)
    (where / "sessions" / "s1.json").write_bytes((FIXTURE / "s1.json").read_bytes())
    offered: list[dict[str, Any]] = json.loads((FIXTURE / "offered.json").read_text())
    lines = (where / "sessions" / "s1.json").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == [
        "meta", "assistant", "tool_started", "tool_result", "terminal"
    ]  # fmt: skip
    return where, offered


def test_an_old_session_resumes_and_sends_the_new_schema(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    where, offered = recorded(tmp_path)
    sys.path.insert(0, str(where))
    try:
        import schema_tools  # type: ignore[import-not-found]

        from fisk_sm.tools.schema import schema_for

        _, new_schema = schema_for(schema_tools.probe)
    finally:
        sys.path.remove(str(where))
        sys.modules.pop("schema_tools", None)
    # the schemas really differ (else this test proves nothing): flag was {"type": "boolean"}
    assert offered[0]["input_schema"] != new_schema
    assert offered[0]["input_schema"]["properties"]["flag"]["type"] == "boolean"
    api.add(Reply.text("probed fast"))
    done = fisk(where, api, "run", "-c", "agent.yaml", "--state-dir", "sessions", "--resume", "s1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "probed fast\n"
    assert "tool_schemas_upgraded probe" in done.stderr
    assert LEGACY in done.stderr  # the old mapping was asked (only now: see below)
    [request] = api.requests
    assert request["tools"] == [{**offered[0], "input_schema": new_schema}]
    result = {"type": "tool_result", "tool_use_id": "toolu_p", "content": "probed fast True"}
    assert request["messages"][-1] == {"role": "user", "content": [result]}
    last = json.loads((where / "sessions" / "s1.json").read_text().splitlines()[-1])
    assert last["type"] == "terminal" and last["reason"] == "completed"


@pytest.mark.parametrize(
    ("old", "new", "what"),
    [
        ("flag: bool | None = None", "flag: int | None = None", "a parameter's type"),
        ("flag: whether to flag it.", "flag: whether to flag it twice.", "its description"),
        ("flag: bool | None = None", "flag: bool | None = None, n: int = 1", "a new parameter"),
    ],
)
def test_a_real_change_of_the_tool_is_still_drift(
    tmp_path: Path, api: FakeMessagesAPI, old: str, new: str, what: str
) -> None:
    where, _ = recorded(tmp_path)
    module = where / "schema_tools.py"
    module.write_text(module.read_text().replace(old, new))
    before = (where / "sessions" / "s1.json").read_bytes()
    done = fisk(where, api, "run", "-c", "agent.yaml", "--state-dir", "sessions", "--resume", "s1")
    assert done.returncode != 0, what
    assert "tool set: changed" in done.stderr and "--force" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert api.requests == []
    assert (where / "sessions" / "s1.json").read_bytes() == before


def test_a_session_of_today_resumes_without_the_old_mapping(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    (tmp_path / "agent.yaml").write_text(AGENT_YAML)
    (tmp_path / "schema_tools.py").write_text(TOOLS)
    api.add(
        Reply.tool_use("probe", {"mode": "slow"}, id="toolu_q"),
        Reply.error(400, "stop here"),
        Reply.text("probed slow"),
    )
    args = ["run", "-c", "agent.yaml", "--state-dir", "sessions"]
    first = fisk(tmp_path, api, *args, "--checkpoint", "--name", "s2", "probe it")
    assert first.returncode != 0 and "stop here" in first.stderr, first.stderr
    done = fisk(tmp_path, api, *args, "--resume", "s2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "probed slow\n"
    # the digests agree: the old mapping is never imported, and nothing is said of schemas
    assert LEGACY not in done.stderr and "tool_schemas_upgraded" not in done.stderr
    assert api.requests[2]["tools"] == api.requests[0]["tools"]

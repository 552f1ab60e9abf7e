"""The README's examples are tests: its agent.yaml and its "Stepping a run" snippet run as
written (against the fake API), so a user who copies them does not trip over them."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def block(after: str, language: str) -> str:
    """The first fenced block of `language` after the heading `after`."""
    section = README[README.index(after) :]
    found = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found, f"no {language} block after {after!r}"
    return found.group(1)


async def test_the_stepping_snippet_runs_with_the_readme_agent_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: FakeMessagesAPI
) -> None:
    (tmp_path / "agent.yaml").write_text(block("## Running an agent", "yaml"))
    shutil.copy(ROOT / "examples" / "calculator" / "calc_tools.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
    api.add(Reply.tool_use("multiply", {"a": 5, "b": 4}, id="tu_1"))
    code = block("## Stepping a run", "python")
    body = textwrap.indent(code, "    ")
    namespace: dict[str, object] = {}
    exec(f"async def snippet():\n{body}\n    return agent_run, step\n", namespace)
    run, step = await namespace["snippet"]()  # type: ignore[operator]
    assert (step.source, step.destination) == ("suspend_check", "call")
    assert run.state == "suspended"
    [request] = api.requests
    assert {t["name"] for t in request["tools"]} == {"add", "multiply"}
    assert run.data.messages[-1].to_json()["content"][0]["content"] == "20"

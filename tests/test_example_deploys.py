"""examples/deploys, as the README walks through it: two prompts park at the gated `deploy`,
one is approved (the tool runs once), the other denied (it never runs), through the Supervisor
against the fake API serving the example's own script."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from fisk_sm import Supervisor
from fisk_sm.config.agent import load_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.operator.prompter import Approval
from fisk_sm.testing import FakeMessagesAPI, load_script_file

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deploys"


async def until(condition: object, what: str) -> None:
    for _ in range(6000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_deploys_example_parks_then_runs_or_denies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EXAMPLE / "deploys.log"
    log.unlink(missing_ok=True)
    script = load_script_file(EXAMPLE / "script.yaml")
    with FakeMessagesAPI(script.replies, conversations=script.conversations) as api:
        env = {**os.environ, "ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "test"}
        config = load_config(EXAMPLE / "agent.yaml", env=env)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
        sup = Supervisor(config, FileStore(tmp_path / "state"))
        await sup.start()
        try:
            docs = await sup.submit("deploy the docs", name="docs")
            blog = await sup.submit("deploy the blog", name="blog")
            await until(lambda: docs.status == blog.status == "parked", "both runs to park")
            assert not log.exists()
            pending = {a["run_id"]: a for a in sup.approvals()}
            assert pending[docs.entry.run_id]["input"] == {"site": "docs"}
            await sup.answer(
                docs.entry.run_id, pending[docs.entry.run_id]["tool_use_id"], Approval.ONCE
            )
            await sup.answer(
                blog.entry.run_id, pending[blog.entry.run_id]["tool_use_id"], Approval.NO
            )
            await until(lambda: docs.status == blog.status == "completed", "both runs to end")
            assert docs.to_json()["answer"] == "The docs are deployed."
        finally:
            await sup.shutdown()
        assert log.read_text() == "docs\n"  # approved once, denied never ran
        denied = api.requests_for("deploy the blog")[-1]["messages"][-1]["content"][0]
        assert json.loads(denied["content"])["allowed"] is False
    log.unlink(missing_ok=True)

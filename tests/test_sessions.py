"""Checkpointed sessions: start, suspend, resume and the resume gate (REFERENCE §9, 12–14, 36)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import make_config

from fisk_sm import Recorder, tool
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import FORMAT_VERSION, Assistant, Meta, ToolResult, ToolStarted, encode
from fisk_sm.journal.snapshot import Usage
from fisk_sm.loop.fingerprint import ResumeRefused, check_resume
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import RESUME_REMINDER, resume_session, start_session
from fisk_sm.testing import FakeMessagesAPI, Reply


@tool
def note(text: str) -> str:
    """Note something down."""
    calls.append(text)
    return f"noted {text}"


calls: list[str] = []


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


async def test_suspend_then_resume_completes_in_the_same_session(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    store = FileStore(tmp_path)
    config = make_config(api)
    api.add(Reply.tool_use("note", {"text": "x"}, id="toolu_1"), Reply.text("final"))
    polls = iter([False, True])
    run = await start_session(
        config,
        "go",
        store,
        RunOptions(tools=[note], should_suspend=lambda: next(polls)),
        run_id="s12",
    )
    assert await run.run() == "suspended"
    await run.harness.journal.close()
    saved = fold(store.load("s12"))
    assert (saved.status, saved.completed, saved.iteration, saved.llm_calls) == (
        "suspended", False, 1, 1,
    )  # fmt: skip
    events = Recorder()
    resumed = await resume_session(config, "s12", store, RunOptions(tools=[note], events=events))
    assert resumed.state == "suspend_check"
    assert await resumed.run() == "completed"
    await resumed.harness.journal.close()
    final = fold(store.load("s12"))
    assert final.completed and final.run_id == "s12" and final.llm_calls == 2
    assert calls == ["x"]
    second = api.requests[1]
    assert second["system"][-1] == {"type": "text", "text": RESUME_REMINDER}
    assert second["messages"][-1]["content"][0]["tool_use_id"] == "toolu_1"
    assert events.events[0].kind == "run_resumed"


def _partial_journal(store: FileStore, config_print: dict[str, Any]) -> None:
    blocks = [
        {"type": "tool_use", "id": "tu_a", "name": "note", "input": {"text": "a"}},
        {"type": "tool_use", "id": "tu_b", "name": "note", "input": {"text": "b"}},
    ]
    answer = {"type": "tool_result", "tool_use_id": "tu_a", "content": "noted a"}
    records = [
        Meta(1, FORMAT_VERSION, "s13", "2026-12-02T00:00:00Z", config_print, "go"),
        Assistant(
            seq=2,
            iteration=1,
            message={"role": "assistant", "content": blocks},
            stop_reason="tool_use",
            usage=Usage(input_tokens=10, output_tokens=5),
        ),
        ToolStarted(3, "tu_a", "note"),
        ToolResult(4, "tu_a", answer),
    ]
    store.ensure_directory()
    store.path("s13").write_text("".join(encode(r) + "\n" for r in records))


async def test_resume_runs_only_the_unanswered_tool(api: FakeMessagesAPI, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    config = make_config(api)
    probe = await start_session(config, "probe", store, RunOptions(tools=[note]), run_id="probe")
    await probe.harness.journal.close()
    _partial_journal(store, fold(store.load("probe")).fingerprint)
    api.add(Reply.text("both done"))
    run = await resume_session(config, "s13", store, RunOptions(tools=[note]))
    assert run.state == "gate"  # the first unanswered call is screened afresh
    before = len(run.data.messages)
    assert await run.run() == "completed"
    await run.harness.journal.close()
    assert calls == ["b"]
    final = fold(store.load("s13"))
    assert len(final.messages) == before + 2
    assert not final.pending and final.tool_calls == 2
    fed = api.requests[0]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in fed] == ["tu_a", "tu_b"]


@tool(name="note")
def other_note(text: str, loud: bool = False) -> str:
    """A different note tool."""
    return text


async def test_resume_gate_refusals(api: FakeMessagesAPI, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    config = make_config(api)
    api.add(Reply.text("done"))
    run = await start_session(config, "go", store, RunOptions(tools=[note]), run_id="gate")
    await run.harness.journal.close()
    with pytest.raises(ResumeRefused, match="tool set: changed"):
        await resume_session(config, "gate", store, RunOptions(tools=[other_note]))
    # Only one provider can be configured, so the journal is the one that names another.
    journal_bytes = store.path("gate").read_bytes()
    store.path("gate").write_bytes(journal_bytes.replace(b'"anthropic"', b'"other"', 1))
    with pytest.raises(ResumeRefused, match=r'provider "other".*"anthropic".*--force does not'):
        await resume_session(config, "gate", store, RunOptions(tools=[note]), force=True)
    store.path("gate").write_bytes(journal_bytes)
    run = await resume_session(config, "gate", store, RunOptions(tools=[note]))
    assert await run.run() == "completed"
    await run.harness.journal.close()
    with pytest.raises(ResumeRefused, match='session "gate" has already completed'):
        await resume_session(config, "gate", store, RunOptions(tools=[note]))
    assert store.path("gate").read_bytes().startswith(journal_bytes)


def test_fingerprint_diff_lines_are_exact_and_force_overrides_drift() -> None:
    saved = {
        "provider": "anthropic", "model": "a", "system_hash": "1", "tools_hash": "1",
        "thinking": "off", "max_tokens": 100, "max_iterations": 5,
    }  # fmt: skip
    current = saved | {
        "model": "b", "system_hash": "2", "tools_hash": "2", "thinking": "adaptive",
        "max_tokens": 200, "max_iterations": 6,
    }  # fmt: skip
    with pytest.raises(ResumeRefused) as refused:
        check_resume("r", saved, current, completed=False)
    assert str(refused.value).splitlines() == [
        'cannot resume "r", the configuration changed since it was saved:',
        "  model: a -> b",
        "  system prompt: changed",
        "  tool set: changed",
        "  thinking: off -> adaptive",
        "  max_tokens: 100 -> 200",
        "  max_iterations: 5 -> 6",
        "re-run against the original configuration, or pass --force to continue with the"
        " current one",
    ]
    check_resume("r", saved, current, completed=False, force=True)
    check_resume("r", saved, dict(saved), completed=False)
    with pytest.raises(ResumeRefused, match="provider"):
        check_resume("r", saved, current | {"provider": "x"}, completed=False, force=True)


async def test_crash_policy_fail_answers_an_interrupted_tool_without_running_it(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    failing = attrs.evolve(note, crash_policy="fail")
    store = FileStore(tmp_path)
    config = make_config(api)
    probe = await start_session(config, "probe", store, RunOptions(tools=[failing]), run_id="probe")
    await probe.harness.journal.close()
    _partial_journal(store, fold(store.load("probe")).fingerprint)
    with store.path("s13").open("a") as f:
        f.write(encode(ToolStarted(5, "tu_b", "note")) + "\n")
    api.add(Reply.text("ok"))
    run = await resume_session(config, "s13", store, RunOptions(tools=[failing]))
    assert run.snapshot().interrupted == ("tu_b",)
    assert await run.run() == "completed"
    await run.harness.journal.close()
    assert calls == []
    fed = api.requests[0]["messages"][-1]["content"]
    assert fed[1] == {
        "type": "tool_result",
        "tool_use_id": "tu_b",
        "content": "outcome unknown: the run stopped while this tool was running",
        "is_error": True,
    }


async def test_a_snapshot_taken_mid_run_restores_through_json_and_finishes(
    api: FakeMessagesAPI,
) -> None:
    from fisk_sm import MemoryJournal, Run, Snapshot
    from fisk_sm.loop.harness import Harness

    config = make_config(api)
    api.add(Reply.tool_use("note", {"text": "one"}, id="toolu_j"), Reply.text("restored"))
    first = Run.create(config, "go", RunOptions(tools=[note]), run_id="json-run")
    await first.run_until("execute")
    text = first.snapshot().to_json()
    snapshot = Snapshot.from_json(text)
    assert snapshot.state == "execute" and snapshot.pending[0].id == "toolu_j"
    harness = Harness.build(config, RunOptions(tools=[note], journal=MemoryJournal()))
    again = Run.restore(snapshot, harness)
    assert await again.run() == "completed"
    assert again.answer() == "restored" and calls == ["one"]
    assert api.requests[1]["messages"][-1]["content"][0]["tool_use_id"] == "toolu_j"

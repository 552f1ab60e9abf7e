"""Tools and safety end to end: the confirm gate, human in the loop, memory, tool selection
and per-kind counts, through the real SDK and the loopback fake Messages API
(REFERENCE §9 scenarios 6-8, 29, 31, 32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fisk_sm import Recorder, Run, parse_config, tool
from fisk_sm.events import ToolCalled, ToolFinished, WarningRaised
from fisk_sm.loop.harness import RunOptions
from fisk_sm.operator.prompter import Approval, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply

ran: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


@tool(tags=["ai:confirm"])
def launch(target: str) -> str:
    """Launch something (gated)."""
    ran.append(target)
    return f"launched {target}"


@tool(tags=["deploy"])
def deploy(env: str) -> str:
    """Deploy (gated by confirm_tags)."""
    ran.append(env)
    return f"deployed {env}"


@tool(tags=["ai:deny"])
def forbidden() -> str:
    """Never offered."""
    raise AssertionError("must never run")


def config(api: FakeMessagesAPI, **harness: Any) -> Any:
    data = {"system_prompt": "sys", "llm": {"model": "m", "base_url": api.base_url}}
    return parse_config({**data, "harness": harness}, env={})


def last_result(api: FakeMessagesAPI, request: int = 1, block: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = api.requests[request]["messages"][-1]["content"][block]
    return result


async def test_a_gated_tool_with_nobody_to_ask_is_denied_as_a_normal_result(
    api: FakeMessagesAPI,
) -> None:
    api.add(Reply.tool_use("launch", {"target": "moon"}), Reply.text("ok, not launched"))
    events = Recorder()
    run = Run.create(config(api), "go", RunOptions(tools=[launch], events=events))
    assert await run.run() == "completed"
    result = last_result(api)
    assert "is_error" not in result
    assert json.loads(result["content"]) == {
        "allowed": False,
        "reason": "no interactive terminal is attached, so no operator could be asked",
    }
    assert ran == []
    assert not events.of(ToolCalled) and not events.of(ToolFinished)
    warnings = [(w.warning, w.name) for w in events.of(WarningRaised)]
    assert ("confirm_no_terminal", "launch") in warnings


async def test_operator_once_runs_the_tool_and_asks_again(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("launch", {"target": "a"}),
        Reply.tool_use("launch", {"target": "b"}),
        Reply.text("done"),
    )
    prompter = ScriptedPrompter(approvals=[Approval.ONCE, Approval.NO])
    events = Recorder()
    run = Run.create(
        config(api), "go", RunOptions(tools=[launch], events=events, prompter=prompter)
    )
    assert await run.run() == "completed"
    assert ran == ["a"]
    assert last_result(api, 1)["content"] == "launched a"
    denied = json.loads(last_result(api, 2)["content"])
    assert denied["allowed"] is False
    assert "declined" in denied["reason"] and "do not retry" in denied["reason"]
    assert [kind for kind, _ in prompter.asked] == ["approve", "approve"]
    assert not [w for w in events.of(WarningRaised) if w.warning.startswith("confirm")]


async def test_always_is_remembered_by_tool_name_for_any_arguments(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("deploy", {"env": "staging"}),
        Reply.tool_use("deploy", {"env": "prod"}),
        Reply.text("done"),
    )
    prompter = ScriptedPrompter(approvals=[Approval.ALWAYS])
    run = Run.create(
        config(api, confirm_tags=[" deploy ", "deploy"]),
        "go",
        RunOptions(tools=[deploy], prompter=prompter),
    )
    assert await run.run() == "completed"
    assert ran == ["staging", "prod"]
    assert len(prompter.asked) == 1


async def test_ai_deny_tools_are_never_offered_and_tags_end_descriptions(
    api: FakeMessagesAPI,
) -> None:
    api.add(Reply.text("hi"))
    run = Run.create(config(api), "go", RunOptions(tools=[launch, forbidden, deploy]))
    await run.run()
    offered = {t["name"]: t for t in api.requests[0]["tools"]}
    assert set(offered) == {"launch", "deploy"}
    assert offered["launch"]["description"].endswith("\n\nTags: ai:confirm")


async def test_tool_selection_by_name_regex_and_tag(api: FakeMessagesAPI) -> None:
    api.add(Reply.text("hi"))
    selection = {"include": {"names": ["^la"], "tags": ["deploy"]}, "exclude": {"tags": ["x"]}}
    run = Run.create(
        config(api, tools=selection), "go", RunOptions(tools=[launch, deploy, forbidden])
    )
    await run.run()
    assert [t["name"] for t in api.requests[0]["tools"]] == ["launch", "deploy"]


async def test_per_kind_counts_sum_to_tool_calls_rejections_included(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    blocks = (
        {"type": "tool_use", "id": "t1", "name": "launch", "input": {"target": "x"}},
        {"type": "tool_use", "id": "t2", "name": "nope", "input": {}},
        {"type": "tool_use", "id": "t3", "name": "memory_list", "input": {}},
        {"type": "tool_use", "id": "t4", "name": "deploy", "input": {}},
    )
    api.add(Reply(content=blocks, stop_reason="tool_use"), Reply.text("done"))
    memory = {"enabled": True, "options": {"directory": str(tmp_path / "mem")}}
    events = Recorder()
    run = Run.create(
        config(api, memory=memory), "go", RunOptions(tools=[launch, deploy], events=events)
    )
    await run.run()
    counts = dict(events.events[-1].tool_kinds)  # type: ignore[attr-defined]
    assert counts == {"python": 2, "unknown": 1, "memory": 1}
    assert sum(counts.values()) == run.data.tool_calls == 4


async def test_ask_human_confirm_through_the_loop(api: FakeMessagesAPI) -> None:
    ask = Reply.tool_use("ask_human_confirm", {"question": "Proceed?\x1b[2J"})
    api.add(ask, Reply.text("fine"), ask, Reply.text("fine"))
    hitl = {"human_in_the_loop": {"enabled": True}}
    prompter = ScriptedPrompter(confirms=[True])
    await Run.create(config(api, **hitl), "go", RunOptions(prompter=prompter)).run()
    assert json.loads(last_result(api)["content"]) == {"confirmed": True}
    assert prompter.asked == [("confirm", "Proceed?")]
    system = [b["text"] for b in api.requests[0]["system"]]
    assert system[0] == "sys" and "ask_human" in system[1]
    await Run.create(config(api, **hitl), "go").run()
    answer = json.loads(last_result(api, 3)["content"])
    assert answer["confirmed"] is False and "no interactive terminal" in answer["reason"]


async def test_memory_write_creates_the_file_and_a_duplicate_names_the_stored_description(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    write = {"key": "user.name", "description": "the user's name", "content": "Ada"}
    api.add(
        Reply.tool_use("memory_write", write),
        Reply.tool_use("memory_write", {**write, "description": "again", "content": "Bob"}),
        Reply.text("remembered"),
    )
    directory = tmp_path / "memory" / "fisk-sm"
    memory = {"enabled": True, "options": {"directory": str(directory)}}
    await Run.create(config(api, memory=memory), "go").run()
    assert (
        directory / "user.name.md"
    ).read_text() == "---\ndescription: the user's name\n---\n\nAda"
    assert json.loads(last_result(api, 1)["content"]) == {"written": True}
    refused = json.loads(last_result(api, 2)["content"])
    assert refused["written"] is False and "the user's name" in refused["reason"]
    api.add(Reply.text("indexed"))
    await Run.create(config(api, memory=memory), "again").run()
    index = api.requests[3]["system"][-1]["text"]
    assert "- user.name: the user's name" in index

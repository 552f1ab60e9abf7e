"""Prompt caching (REFERENCE §1.1): breakpoints on the last system block and the conversation
tail, 1h for an interactive run and 5m otherwise, off with `llm.no_prompt_cache`, and never part
of the fingerprint. Asserted on the requests the fake API received through the real SDK."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fisk_sm import Run, parse_config, tool
from fisk_sm.journal.base import MemoryJournal
from fisk_sm.loop.fingerprint import fingerprint
from fisk_sm.loop.harness import RunOptions
from fisk_sm.operator.prompter import ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def config(api: FakeMessagesAPI, **llm: Any) -> Any:
    return parse_config(
        {
            "system_prompt": "You add numbers.",
            "llm": {"model": "claude-test", "base_url": api.base_url, **llm},
        },
        env={},
    )


def three_turns(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("add", {"a": 1, "b": 2}, id="tu_1"),
        Reply.tool_use("add", {"a": 3, "b": 4}, id="tu_2"),
        Reply.text("3 and 7"),
    )


def breakpoints(request: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every block of a request that carries cache_control, with where it is."""
    found = []
    for i, block in enumerate(request.get("system", [])):
        if "cache_control" in block:
            found.append((f"system[{i}]", block["cache_control"]))
    for m, message in enumerate(request["messages"]):
        content = message["content"]
        for b, block in enumerate(content if isinstance(content, list) else []):
            if "cache_control" in block:
                found.append((f"messages[{m}].content[{b}]", block["cache_control"]))
    return found


@pytest.mark.parametrize(("interactive", "ttl"), [(False, "5m"), (True, "1h")])
async def test_breakpoints_on_the_system_and_the_tail_of_every_request(
    api: FakeMessagesAPI, interactive: bool, ttl: str
) -> None:
    three_turns(api)
    journal = MemoryJournal()
    prompter = ScriptedPrompter(available=interactive)
    run = Run.create(
        config(api), "add", RunOptions(tools=[add], journal=journal, prompter=prompter)
    )
    assert await run.run() == "completed"
    assert len(api.requests) == 3
    control = {"type": "ephemeral", "ttl": ttl}
    for request in api.requests:
        last = len(request["messages"]) - 1
        tail = len(request["messages"][-1]["content"]) - 1
        assert breakpoints(request) == [
            (f"system[{len(request['system']) - 1}]", control),
            (f"messages[{last}].content[{tail}]", control),
        ]
    # the tail moves: the prompt, then the first tool result, then the second
    tails = [r["messages"][-1]["content"][-1] for r in api.requests]
    assert tails[0]["text"] == "add"
    assert [t["tool_use_id"] for t in tails[1:]] == ["tu_1", "tu_2"]
    # what is kept never carries a breakpoint: not the conversation, not the journal
    assert "cache_control" not in json.dumps([m.to_json() for m in run.data.messages])
    assert "cache_control" not in json.dumps([repr(r) for r in journal.records])


async def test_no_prompt_cache_sends_no_cache_control(api: FakeMessagesAPI) -> None:
    three_turns(api)
    run = Run.create(config(api, no_prompt_cache=True), "add", RunOptions(tools=[add]))
    assert await run.run() == "completed"
    assert len(api.requests) == 3
    assert all("cache_control" not in json.dumps(request) for request in api.requests)


async def test_cache_settings_are_not_fingerprinted(api: FakeMessagesAPI) -> None:
    """The resume gate compares exactly these fingerprints: turning the cache off or on
    never refuses a resume."""
    cached = Run.create(config(api), "add", RunOptions(tools=[add]))
    uncached = Run.create(config(api, no_prompt_cache=True), "add", RunOptions(tools=[add]))
    assert fingerprint(cached.harness) == fingerprint(uncached.harness)

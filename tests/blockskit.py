"""A run whose model sends a thinking block, a block of a type fisk-sm does not know and
unknown keys on known blocks; shared by tests/test_blocks_roundtrip.py and the script that made
its journal fixture with the code before typed messages (so it uses only APIs both have).

Regenerate the fixture (only on purpose: its bytes are the contract) with
`PYTHONPATH=<tree>:tests .venv/bin/python -c 'import blockskit; blockskit.main()'`.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

from fisk_sm import tool
from fisk_sm.config.agent import AgentConfig, parse_config
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.anthropic import AnthropicModel
from fisk_sm.testing import FakeMessagesAPI, Reply

RUN_ID = "blocks-1"
FIXTURE = Path(__file__).parent / "fixtures" / "blocks" / "journal.jsonl"
#: The request bodies the fake API received for the run, as JSON (key order kept).
REQUESTS = FIXTURE.with_name("requests.json")

#: A thinking block with its signature, and a key the API may add one day (not last).
THINKING: dict[str, Any] = {
    "type": "thinking",
    "thinking": 'Adding: 2 + 3. Café — ✓ "quoted" \\ slash',
    "zeta_hint": {"b": 2, "a": [1, None, "x"]},
    "signature": "EqQBCkgIARABGAIiQLx/9+=" + "s" * 40,
}
#: A block of a type fisk-sm does not know, keys in no particular order.
UNKNOWN: dict[str, Any] = {
    "type": "mystery_block",
    "z": 1,
    "payload": {"nested": [{"k": "v"}, 3.5, True]},
    "a": "first?",
}
#: A known block type with an unknown key between the known ones.
TOOL_USE: dict[str, Any] = {
    "type": "tool_use",
    "id": "toolu_b1",
    "caller": {"type": "direct"},
    "name": "add",
    "input": {"b": 3, "a": 2},
}
#: A call of a tool the run does not have: an is_error result.
MISSING: dict[str, Any] = {"type": "tool_use", "id": "toolu_b2", "name": "nope", "input": {}}
REDACTED: dict[str, Any] = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def config(api: FakeMessagesAPI) -> AgentConfig:
    """The run's config (prompt cache off, so the requests are the conversation itself)."""
    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    return parse_config({"system_prompt": "You are a test agent.", "llm": llm}, env={})


def script() -> list[Reply]:
    """The tool turn with the odd blocks, then the answer."""
    blocks = (
        REDACTED,
        THINKING,
        UNKNOWN,
        {"type": "text", "text": "Let me add."},
        TOOL_USE,
        MISSING,
    )
    return [
        Reply(content=blocks, stop_reason="tool_use"),
        Reply.text("2 + 3 = 5"),
    ]


async def run_and_resume(api: FakeMessagesAPI, state: Path, *, stream: bool = False) -> str:
    """Start the run, suspend it after its tool turn, resume it in a new `Run` from the file
    journal and finish it; the final status. With `stream`, each reply comes as Server-Sent
    Events (the model is given an `on_text`, as a chat's is)."""
    store = FileStore(state)
    polls = iter([False, True])  # the first boundary goes on; the one after the tool suspends
    options = RunOptions(tools=[add], should_suspend=lambda: next(polls, True))
    models = [AnthropicModel(config(api).llm, on_text=lambda _: None) for _ in range(2 * stream)]
    try:
        if models:
            options = attrs.evolve(options, model=models[0])
        run = await start_session(config(api), "add 2 and 3", store, options, run_id=RUN_ID)
        assert await run.run() == "suspended"
        await run.harness.aclose()
        options = RunOptions(tools=[add], model=models[1] if models else None)
        resumed = await resume_session(config(api), RUN_ID, store, options)
        try:
            return await resumed.run()
        finally:
            await resumed.harness.aclose()
    finally:
        for model in models:
            await model.aclose()


#: A record's measured wall time (the last field before the tag of an assistant or a
#: tool_result record), which the fixture, written before timings were journaled, lacks.
_TIMING = re.compile(
    rb',"(?:latency_ms|duration_ms)":\d+(?=,"type":"(?:assistant|tool_result)"}$)', re.M
)


def normalised(journal: bytes) -> bytes:
    """The journal with the values that differ run to run blanked: its creation time fixed,
    each record's measured timing (`latency_ms`, `duration_ms`) taken out of the record."""
    journal = _TIMING.sub(b"", journal)
    return re.sub(rb'"created":"[^"]*"', b'"created":"2026-01-01T00:00:00Z"', journal)


def requests_json(requests: list[dict[str, Any]]) -> str:
    """The request bodies as one JSON text, key order kept, the fake's port blanked."""
    text = json.dumps(requests, ensure_ascii=False, indent=1)
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text) + "\n"


def main() -> None:
    """Write the fixture from whatever fisk_sm is on the path."""
    with FakeMessagesAPI(script()) as api, tempfile.TemporaryDirectory() as tmp:
        status = asyncio.run(run_and_resume(api, Path(tmp)))
        journal = next(Path(tmp).rglob(f"{RUN_ID}.json")).read_bytes()
        requests = requests_json(api.requests)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_bytes(normalised(journal))
    REQUESTS.write_text(requests)
    print(status, len(journal), file=sys.stderr)

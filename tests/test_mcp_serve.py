"""`fisk-sm mcp-serve`: the agent as an MCP tool, tested with the `mcp` SDK's own client over
stdio (revision 2026-07-28) against the fake Messages API. A two-tool run to its answer with
progress in order, a follow-up turn on the same session, a cancelled call that suspends (the
tool in flight finishes and is journaled once; the next `ask` resumes with no repeated tool),
a gated tool answered `once` through the input request and denied for a client that cannot
answer one, and stdout carrying only MCP messages."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import agentkit
import anyio
import pytest
from agentkit import effects
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult, ErrorData, TextContent

from fisk_sm.testing import FakeMessagesAPI, Reply


def write_agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    """The agent of these tests: add, slow and the gated deploy."""
    return agentkit.write_agent(tmp_path, api, "mcp_serve_tools")


def journal(state: Path, session: str) -> list[dict[str, object]]:
    lines = (state / f"{session}.json").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


async def approve_once(
    context: ClientRequestContext, params: ElicitRequestParams
) -> ElicitResult | ErrorData:
    assert "deploy" in params.message and '"target": "prod"' in params.message
    return ElicitResult(action="accept", content={"answer": "once"})


Answerer = Callable[
    [ClientRequestContext, ElicitRequestParams], Awaitable[ElicitResult | ErrorData]
]


@asynccontextmanager
async def served(
    tmp_path: Path, agent: Path, answers: Answerer | None = approve_once, mode: str = "auto"
) -> AsyncIterator[Client]:
    """A client of `fisk-sm mcp-serve` on stdio (its input requests answered by `answers`;
    none: it cannot answer them); the server's stdout is teed to tmp_path/stdout.jsonl."""
    serve = [sys.executable, "-m", "fisk_sm.cli", "mcp-serve", "-c", str(agent)]
    serve += ["--state-dir", str(tmp_path / "state")]
    tee = shlex.quote(str(tmp_path / "stdout.jsonl"))
    line = f"set -o pipefail; {shlex.join(serve)} | tee {tee}"
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    params = StdioServerParameters(command="bash", args=["-c", line], env=env, cwd=str(tmp_path))
    async with Client(params, elicitation_callback=answers, mode=mode) as client:
        yield client


def tool_results(api: FakeMessagesAPI) -> list[object]:
    """The tool results the model was sent, in order, each parsed from its JSON."""
    return [
        json.loads(block["content"])
        for request in api.requests[1:]
        for block in request["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]


def text(result: object) -> str:
    content = getattr(result, "content", [])
    return " ".join(c.text for c in content if isinstance(c, TextContent))


@pytest.mark.timeout(120)
async def test_ask_runs_two_tools_to_the_answer_then_a_follow_up(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="t1"),
        Reply.tool_use("slow", {"seconds": 0}, id="t2"),
        Reply.text("five, and slept"),
        Reply.text("yes, five"),
    )
    agent = write_agent(tmp_path, api)
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with served(tmp_path, agent) as client:
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == ["ask"]
        assert tools[0].annotations is not None and tools[0].annotations.destructive_hint
        first = await client.call_tool(
            "ask", {"prompt": "add, then rest"}, progress_callback=on_progress
        )
        assert not first.is_error and text(first) == "five, and slept"
        session = first.structured_content["session"]
        assert first.structured_content["state"] == "awaiting_input"
        assert [m for _, m in progress] == [
            f"session {session}: call (iteration 1)",
            "execute: add",
            "call (iteration 2)",
            "execute: slow",
            "call (iteration 3)",
        ]
        assert [v for v, _ in progress] == [1, 2, 3, 4, 5]
        again = await client.call_tool("ask", {"prompt": "sure?", "session": session})
        assert text(again) == "yes, five"
    last = api.requests[-1]["messages"]
    assert last[-2]["content"][0]["text"] == "five, and slept" and last[-1]["content"] == "sure?"
    users = [r for r in journal(tmp_path / "state", session) if r.get("type") == "user"]
    assert len(users) == 1  # the follow-up (the first prompt is in the meta record)
    stdout = (tmp_path / "stdout.jsonl").read_text().splitlines()
    assert stdout and all(json.loads(line)["jsonrpc"] == "2.0" for line in stdout)


async def cancelled_mid_tool(client: Client, state: Path) -> tuple[str, list[dict[str, object]]]:
    """`ask` "rest" (the model calls `slow`) and cancel the call once the tool runs; then wait
    for the run to end (the tool finishes, is journaled, and the run suspends). The session
    (from the first progress) and its journal then."""
    started = anyio.Event()
    told: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        told.append(message or "")
        if message == "execute: slow":
            started.set()

    async with anyio.create_task_group() as group:

        async def call() -> None:
            await client.call_tool("ask", {"prompt": "rest"}, progress_callback=on_progress)

        group.start_soon(call)
        await started.wait()
        group.cancel_scope.cancel()
    session = told[0].split(":")[0].removeprefix("session ")
    for _ in range(100):
        records = journal(state, session)
        if records[-1].get("type") == "terminal":
            break
        await anyio.sleep(0.05)
    return session, records


@pytest.mark.timeout(120)
async def test_a_cancelled_call_suspends_and_ask_resumes_without_repeating_the_tool(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("slow", {"seconds": 1.5}, id="t1"), Reply.text("rested"))
    agent = write_agent(tmp_path, api)
    async with served(tmp_path, agent) as client:
        # the client sends notifications/cancelled
        session, records = await cancelled_mid_tool(client, tmp_path / "state")
        assert effects(tmp_path) == ["started", "done"]
        assert records[-1]["reason"] == "suspended"
        assert [r.get("type") for r in records].count("tool_result") == 1
        resumed = await client.call_tool("ask", {"session": session})
        assert text(resumed) == "rested"
    assert effects(tmp_path) == ["started", "done"]  # the tool did not run again
    types = [r.get("type") for r in journal(tmp_path / "state", session)]
    assert types.count("tool_started") == 1 and types.count("tool_result") == 1


@pytest.mark.timeout(120)
async def test_a_gated_tool_is_an_input_request_answered_once(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("deploy", {"target": "prod"}, id="t1"), Reply.text("prod is live"))
    agent = write_agent(tmp_path, api)
    async with served(tmp_path, agent) as client:
        done = await client.call_tool("ask", {"prompt": "ship it"})
        assert text(done) == "prod is live"
        session = done.structured_content["session"]
    assert effects(tmp_path) == ["deployed prod"]
    records = journal(tmp_path / "state", session)
    (answered,) = [r for r in records if r.get("type") == "approval_answered"]
    assert answered["answer"] == "once" and answered["by"] == "mcp"


@pytest.mark.timeout(120)
async def test_a_client_that_cannot_answer_gets_the_gate_s_denial(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("deploy", {"target": "prod"}, id="t1"), Reply.text("could not deploy"))
    agent = write_agent(tmp_path, api)
    async with served(tmp_path, agent, answers=None) as client:
        done = await client.call_tool("ask", {"prompt": "ship it"})
    assert effects(tmp_path) == []
    assert "could not deploy" in text(done) and "denied: deploy" in text(done)
    result = api.requests[-1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and "operator" in json.dumps(result), result


@pytest.mark.timeout(120)
async def test_ask_human_questions_are_input_requests(tmp_path: Path, api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("ask_human_input", {"question": "which target?"}, id="t1"),
        Reply.tool_use(
            "ask_human_select", {"question": "how?", "options": ["fast", "safe"]}, id="t2"
        ),
        Reply.tool_use("ask_human_confirm", {"question": "sure?"}, id="t3"),
        Reply.text("asked"),
    )
    agent = write_agent(tmp_path, api)
    with agent.open("a") as f:
        f.write("harness: {human_in_the_loop: {enabled: true}}\n")
    asked: list[str] = []

    async def answer(
        context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        asked.append(params.message)
        properties = params.requested_schema["properties"]
        if "text" in properties:
            return ElicitResult(action="accept", content={"text": "prod"})
        if "choice" in properties:
            assert properties["choice"]["enum"] == ["fast", "safe"]
            return ElicitResult(action="accept", content={"choice": "safe"})
        return ElicitResult(action="accept", content={"yes": True})

    async with served(tmp_path, agent, answer) as client:
        done = await client.call_tool("ask", {"prompt": "ask me"})
    assert text(done) == "asked" and asked == ["which target?", "how?", "sure?"]
    assert tool_results(api) == [{"value": "prod"}, {"selected": "safe"}, {"confirmed": True}]


@pytest.mark.timeout(120)
async def test_an_older_revision_client_gets_the_denial_and_is_told_why(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("deploy", {"target": "prod"}, id="t1"), Reply.text("not deployed"))
    agent = write_agent(tmp_path, api)
    async with served(tmp_path, agent, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        done = await client.call_tool("ask", {"prompt": "ship it"})
    assert effects(tmp_path) == []
    assert "cannot answer input requests (2026-07-28)" in text(done)


@pytest.mark.timeout(120)
async def test_a_session_id_is_never_a_path(tmp_path: Path, api: FakeMessagesAPI) -> None:
    agent = write_agent(tmp_path, api)
    async with served(tmp_path, agent) as client:
        for bad in ("../../etc/passwd", "a/b", "", "x" * 500):
            done = await client.call_tool("ask", {"prompt": "hi", "session": bad})
            assert done.is_error and text(done).startswith("ask: session"), (bad, text(done))
        unknown = await client.call_tool("ask", {"prompt": "hi", "session": "no-such-session"})
        assert unknown.is_error and "no-such-session" in text(unknown)
    state = tmp_path / "state"
    assert not state.exists() or [p.name for p in state.iterdir()] == []
    assert not (tmp_path.parent / "etc").exists() and api.requests == []

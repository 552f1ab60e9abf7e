"""Chat runs: `awaiting_input` in the table, follow-ups journaled as `user` records, resumable.

Real parts: the SDK over loopback HTTP to the fake Messages API, file journals with fsync, the
fold and the path derived from the journal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path

from conftest import make_config

from fisk_sm.events.types import Recorder, StateEntered, WarningRaised
from fisk_sm.journal.decode import decode
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import AT_INPUT, fold
from fisk_sm.journal.records import Meta, Terminal, User, encode
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.path import session_path
from fisk_sm.model.anthropic import AnthropicModel, build_request
from fisk_sm.model.blocks import Message
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import tool


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def typed(*lines: str | None) -> list[str | None]:
    """What the user types, in order; the run waits for a line that never comes after them."""
    return list(lines)


def source(run: Run, lines: Iterable[str | None]) -> None:
    """Make `lines` the chat's input; once they are used up, the chat is suspended."""
    queue = list(lines)

    async def next_prompt() -> str | None:
        if not queue:
            run.request_suspend()
            await asyncio.Event().wait()  # cancelled by the suspend
        return queue.pop(0)

    run.input = next_prompt


def chat_run(api: FakeMessagesAPI, lines: Iterable[str | None], **budget: int) -> Run:
    options = RunOptions(tools=[add], events=Recorder())
    run = Run.create(make_config(api, **budget), "hello", options, chat=True)
    source(run, lines)
    return run


def states(run: Run) -> list[str]:
    events = run.harness.events
    assert isinstance(events, Recorder)
    return [e.state for e in events.events if isinstance(e, StateEntered)]


def texts(message: dict[str, object]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    assert isinstance(content, list)
    return [b.get("text", b.get("type")) for b in content]


async def test_each_follow_up_is_the_last_user_message_after_the_whole_conversation(
    api: FakeMessagesAPI,
) -> None:
    api.add(Reply.text("one"), Reply.text("two"), Reply.text("three"))
    run = chat_run(api, typed("and then?", "more", None))
    assert await run.run() == "completed"  # the end of input ends a plain chat
    assert [r["messages"] for r in api.requests] == [
        [{"role": "user", "content": "hello"}],
        [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
            {"role": "user", "content": "and then?"},
        ],
        [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
            {"role": "user", "content": "and then?"},
            {"role": "assistant", "content": [{"type": "text", "text": "two"}]},
            {"role": "user", "content": "more"},
        ],
    ]
    records = run.harness.journal.records
    assert isinstance(records[0], Meta) and records[0].interactive
    follow_ups = [r for r in records if isinstance(r, User)]
    assert [r.message for r in follow_ups] == [
        {"role": "user", "content": "and then?"},
        {"role": "user", "content": "more"},
    ]
    assert states(run).count("awaiting_input") == 3
    assert states(run)[-2:] == ["awaiting_input", "completed"]
    # the path derived from the journal is the path the run took
    assert list(session_path(records).states) == states(run)


async def test_a_one_shot_run_never_waits_for_input(api: FakeMessagesAPI) -> None:
    api.add(Reply.text("done"))
    run = Run.create(make_config(api), "hello", RunOptions(events=Recorder()))
    assert await run.run() == "completed"
    assert "awaiting_input" not in states(run)
    meta = run.harness.journal.records[0]
    assert isinstance(meta, Meta) and not meta.interactive
    assert "interactive" not in encode(meta)  # a one-shot meta is the line it always was
    assert decode(encode(meta)) == meta


async def test_max_iterations_grows_by_its_configured_amount_per_follow_up(
    api: FakeMessagesAPI,
) -> None:
    api.add(
        Reply.tool_use("add", {"a": 1, "b": 2}, id="t1"),
        Reply.tool_use("add", {"a": 3, "b": 4}, id="t2"),
        Reply.text("seven"),
    )
    run = chat_run(api, typed("go on", None), max_iterations=1)
    assert await run.run() == "completed"
    # one call, then the cap stopped the turn at the boundary; the follow-up added one more
    # call to the cap (2): the second tool turn, stopped again; the end of input ended it
    assert len(api.requests) == 2
    events = run.harness.events
    assert isinstance(events, Recorder)
    warnings = [e.warning for e in events.events if isinstance(e, WarningRaised)]
    assert warnings == ["max_iter_interactive", "max_iter_interactive"]
    # the follow-up was merged into the trailing user message of tool results
    last = api.requests[1]["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert last["content"][1]["text"] == "go on"
    assert run.data.follow_ups == 1
    assert list(session_path(run.harness.journal.records).states) == states(run)


async def test_a_failed_call_in_a_chat_waits_for_the_next_prompt(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(400, "bad request"), Reply.text("better"))
    run = chat_run(api, typed("try again", None))
    assert await run.run() == "completed"
    events = run.harness.events
    assert isinstance(events, Recorder)
    warning = next(e for e in events.events if isinstance(e, WarningRaised))
    assert warning.warning == "turn_error_interactive" and "bad request" in warning.detail
    # nothing of the failed call was journaled: the follow-up merged into the prompt
    assert api.requests[1]["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "try again"}],
        }
    ]
    assert ("call", "awaiting_input") in zip(states(run), states(run)[1:], strict=False)
    assert list(session_path(run.harness.journal.records).states) == states(run)


async def test_budget_exhaustion_ends_a_chat(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("add", {"a": 1, "b": 2}, input_tokens=500))
    run = chat_run(api, typed("never read"), max_tokens=100)
    assert await run.run() == "budget_exhausted"
    assert "awaiting_input" not in states(run)


async def test_an_interrupt_stops_the_turn_at_the_next_boundary(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("add", {"a": 1, "b": 2}), Reply.text("not asked for"))
    run = chat_run(api, typed(None))
    await run.run_until("execute")
    run.request_interrupt()  # mid-turn: the tool still runs, the next call does not happen
    assert await run.run() == "completed"
    assert len(api.requests) == 1
    assert states(run)[-5:] == [
        "execute", "feed_back", "suspend_check", "awaiting_input", "completed",
    ]  # fmt: skip
    assert run.data.messages[-1].blocks()[0].type == "tool_result"
    assert list(session_path(run.harness.journal.records).states) == states(run)


async def test_a_chat_suspended_at_its_prompt_resumes_there_without_a_model_call(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.text("one"), Reply.text("two"))
    config = make_config(api)
    store = FileStore(tmp_path)
    run = await start_session(config, "hello", store, RunOptions(), run_id="c", chat=True)
    source(run, [])  # no line: the source suspends the chat at its prompt
    async with run:
        assert await run.run() == "suspended"
    records = store.load("c")
    assert records[-1] == Terminal(seq=records[-1].seq, reason="suspended", message=AT_INPUT)
    assert fold(records).state == "awaiting_input"
    resumed = await resume_session(config, "c", store, RunOptions(events=Recorder()))
    assert resumed.state == "awaiting_input" and resumed.data.chat
    source(resumed, ["next"])
    async with resumed:
        assert await resumed.run() == "suspended"
    assert len(api.requests) == 2  # the resume made no call; the follow-up made one
    assert api.requests[1]["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
        {"role": "user", "content": "next"},
    ]
    path = session_path(store.load("c"))
    assert path.states == (
        "suspend_check", "call", "journal", "decide", "awaiting_input", "suspended",
        "awaiting_input", "suspend_check", "call", "journal", "decide", "awaiting_input",
        "suspended",
    )  # fmt: skip
    assert path.current == "suspended"
    assert ("suspended", "resume", "awaiting_input") in path.edges


async def test_a_chat_killed_at_its_prompt_folds_to_the_prompt(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.text("one"))
    store = FileStore(tmp_path)
    run = await start_session(make_config(api), "hello", store, RunOptions(), run_id="k", chat=True)
    async with run:
        await run.run_until("awaiting_input")  # no terminal record: as if killed here
    records = store.load("k")
    snapshot = fold(records)
    assert (snapshot.state, snapshot.status) == ("awaiting_input", "open")
    assert session_path(records).current == "awaiting_input"


async def test_streaming_hands_text_as_it_arrives_and_returns_the_whole_turn(
    api: FakeMessagesAPI,
) -> None:
    answer = "a long answer, written piece by piece"
    api.add(Reply.text(answer), Reply.tool_use("add", {"a": 1, "b": 2}, id="t9", text="let me"))
    config = make_config(api)
    pieces: list[str] = []
    model = AnthropicModel(config.llm, on_text=pieces.append)
    try:
        request = build_request(config.llm, (), (), [Message("user", "hi")])
        reply = await model.create(request)
        assert len(pieces) > 1 and "".join(pieces) == answer
        assert reply["content"] == [{"type": "text", "text": answer}]
        assert reply["usage"]["input_tokens"] == 10 and reply["usage"]["output_tokens"] == 5
        second = await model.create(request)
        assert second["content"][1] == {
            "type": "tool_use",
            "id": "t9",
            "name": "add",
            "input": {"a": 1, "b": 2},
        }
        assert second["stop_reason"] == "tool_use"
    finally:
        await model.aclose()
    assert all(r["stream"] is True for r in api.requests)
    json.dumps(reply)  # JSON-ready, as the journal needs it

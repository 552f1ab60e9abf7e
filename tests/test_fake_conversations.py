"""The fake Messages API answering per conversation: many runs on one server, and resumes.

Runs go through the real SDK over loopback. Delays here are either zero or far longer than
any test waits (a cancelled call's); waits are hang guards, never timing assertions.
"""

from __future__ import annotations

import asyncio
import io
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
from conftest import make_config

from fisk_sm import MemoryJournal, Recorder, Run, tool
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.testing import (
    FakeMessagesAPI,
    Reply,
    ScriptError,
    Turn,
    first_user_text,
    load_script_file,
    serve,
    tool_turns,
    turn_of,
)

HANG = 60.0  # a guard against a hang, far above what any machine needs
SLOW = 30.0  # a reply delay no test waits out
MODEL = "claude-test-model"


def echo_tool(calls: list[str]) -> Any:
    @tool
    def echo(text: str) -> str:
        """Say it back.

        Args:
            text: what to say
        """
        calls.append(text)
        return f"echo {text}"

    return echo


def new_run(api: FakeMessagesAPI, prompt: str, calls: list[str], run_id: str) -> Run:
    options = RunOptions(tools=[echo_tool(calls)], events=Recorder(), journal=MemoryJournal())
    return Run.create(make_config(api), prompt, options, run_id=run_id)


async def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def tool_results(body: dict[str, Any]) -> list[str]:
    """The tool_result contents of a request's last (user) message."""
    last = body["messages"][-1]["content"]
    return [b["content"] for b in last if isinstance(b, dict) and b["type"] == "tool_result"]


async def test_twenty_concurrent_runs_share_one_fake() -> None:
    prompts = [f"task {i}" for i in range(20)]
    conversations = {
        p: tool_turns(1, input={"text": p}, answer=f"answer to {p}") for p in reversed(prompts)
    }
    calls: list[str] = []
    with FakeMessagesAPI(conversations=conversations) as api:
        runs = [new_run(api, p, calls, f"r{i}") for i, p in enumerate(prompts)]
        states = await asyncio.wait_for(asyncio.gather(*(r.run() for r in runs)), HANG)
        assert states == ["completed"] * 20
        assert [r.answer() for r in runs] == [f"answer to {p}" for p in prompts]
        assert sorted(calls) == sorted(prompts)  # each run's tool ran once, with its input
        assert len(api.requests) == 40
        for p in prompts:
            first, second = api.requests_for(p)
            assert (turn_of(first), turn_of(second)) == (0, 1)
            assert tool_results(second) == [f"echo {p}"]  # its own tool's result, no other's


async def test_suspend_now_and_resume_on_the_same_fake(tmp_path: Path) -> None:
    key, calls = "resume me", list[str]()
    # turn 1's first attempt never arrives (it is cancelled); any later attempt is answered
    script: list[Turn] = [
        Reply.tool_use("echo", {"text": "once"}),
        (Reply.text("lost", delay=SLOW), Reply.text("the answer")),
    ]
    with FakeMessagesAPI(conversations={key: script}) as api:
        store, config = FileStore(tmp_path), make_config(api)
        options = RunOptions(tools=[echo_tool(calls)])
        run = await start_session(config, key, store, options, run_id="s1")
        running = asyncio.ensure_future(run.run())
        await eventually(lambda: len(api.requests_for(key)) == 2)  # turn 1 in flight
        run.request_suspend(now=True)
        assert await asyncio.wait_for(running, HANG) == "suspended"
        await run.aclose()

        again = await resume_session(config, "s1", store, options)  # no re-scripting
        assert await asyncio.wait_for(again.run(), HANG) == "completed"
        assert again.answer() == "the answer"
        await again.aclose()
        first, cut, asked_again = api.requests_for(key)
        assert [turn_of(b) for b in (first, cut, asked_again)] == [0, 1, 1]
        assert asked_again["messages"] == cut["messages"]  # the same turn, asked again
        assert calls == ["once"]  # the tool did not run twice
        assert len(api.requests) == 3


async def test_a_turn_asked_again_gets_the_same_reply() -> None:
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "same"}]}]
    with FakeMessagesAPI(conversations={"same": tool_turns(1)}) as api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url) as c:
            one = await c.messages.create(model=MODEL, max_tokens=5, messages=messages)
            two = await c.messages.create(model=MODEL, max_tokens=5, messages=messages)
    assert one.content == two.content and one.content[0].type == "tool_use"
    assert first_user_text(api.requests[0]) == "same"


async def test_attempts_at_a_turn_are_answered_in_order() -> None:
    with FakeMessagesAPI(conversations={"hi": [(Reply.error(529), Reply.text("ok"))]}) as api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url) as c:
            resp = await c.messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
    assert resp.content[0].type == "text" and resp.content[0].text == "ok"
    assert len(api.requests_for("hi")) == 2


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([{"role": "user", "content": "who?"}], "no conversation scripted for first user"),
        (
            [
                {"role": "user", "content": "known"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "b"},
            ],
            "conversation 'known' has 1 scripted turns, none for turn 1",
        ),
    ],
)
async def test_an_unscripted_conversation_or_turn_fails_fast(
    messages: list[Any], error: str
) -> None:
    with FakeMessagesAPI(conversations={"known": [Reply.text("k")]}) as api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url) as c:
            with pytest.raises(anthropic.InternalServerError) as info:
                await c.messages.create(model=MODEL, max_tokens=5, messages=messages)
    assert error in str(info.value)
    assert len(api.requests) == 1  # not retried
    assert api.requests_for(messages[0]["content"]) == api.requests  # and recorded


async def test_a_run_of_an_unknown_conversation_fails_with_the_reason() -> None:
    with FakeMessagesAPI(conversations={"known": [Reply.text("k")]}) as api:
        run = new_run(api, "stranger", [], "u1")
        assert await asyncio.wait_for(run.run(), HANG) == "failed"
        assert "no conversation scripted for first user message 'stranger'" in str(run.outcome)
        assert len(api.requests_for("stranger")) == 1 and api.requests_for("known") == []


async def test_a_responder_answers_concurrent_runs() -> None:
    seen: list[tuple[str | None, int]] = []

    def respond(body: dict[str, Any]) -> Reply:
        key, turn = first_user_text(body), turn_of(body)
        seen.append((key, turn))
        if turn == 0:
            return Reply.tool_use("echo", {"text": f"{key}"})
        return Reply.text(f"{key} saw {tool_results(body)}")

    calls: list[str] = []
    with FakeMessagesAPI(responder=respond) as api:
        runs = [new_run(api, f"job {i}", calls, f"j{i}") for i in range(5)]
        assert await asyncio.gather(*(r.run() for r in runs)) == ["completed"] * 5
    assert [r.answer() for r in runs] == [f"job {i} saw ['echo job {i}']" for i in range(5)]
    assert sorted(seen) == sorted((f"job {i}", t) for i in range(5) for t in (0, 1))


@pytest.mark.parametrize(
    ("respond", "error"),
    [
        (lambda body: 1 / 0, "fake API responder raised ZeroDivisionError: division by zero"),
        (lambda body: "text", "fake API responder returned str, not a Reply"),
    ],
)
async def test_a_failing_responder_is_a_clear_error(
    respond: Callable[[dict[str, Any]], Any], error: str
) -> None:
    with FakeMessagesAPI(responder=respond) as api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url) as c:
            with pytest.raises(anthropic.InternalServerError) as info:
                await c.messages.create(
                    model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
    assert error in str(info.value)
    assert len(api.requests) == 1


async def test_conversations_before_responder_before_ordered_script() -> None:
    api = FakeMessagesAPI([Reply.text("ordered")], conversations={"keyed": [Reply.text("k")]})
    with api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url) as c:

            async def ask(text: str) -> str:
                user: Any = [{"role": "user", "content": text}]
                resp = await c.messages.create(model=MODEL, max_tokens=5, messages=user)
                block = resp.content[0]
                assert block.type == "text"
                return block.text

            assert await ask("keyed") == "k"
            assert await ask("other") == "ordered"  # no conversation claims it
            api.responder = lambda body: Reply.text("responded")
            assert await ask("other") == "responded"
            assert await ask("keyed") == "k"
    assert api.remaining == 0


async def test_two_hundred_concurrent_requests_each_get_their_own_reply() -> None:
    keys = [f"c{i}" for i in range(200)]
    with FakeMessagesAPI(conversations={k: [Reply.text(f"re {k}")] for k in keys}) as api:
        async with anthropic.AsyncAnthropic(api_key="t", base_url=api.base_url, max_retries=0) as c:
            replies = await asyncio.gather(
                *(
                    c.messages.create(
                        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": k}]
                    )
                    for k in keys
                )
            )
    assert [r.content[0].text for r in replies] == [f"re {k}" for k in keys]  # type: ignore[union-attr]
    assert len(api.requests) == 200 and all(len(api.requests_for(k)) == 1 for k in keys)


def test_tool_turns() -> None:
    replies = tool_turns(2, tool="add", input=lambda i: {"a": i}, answer="sum", delay=0.5)
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "end_turn"]
    assert [r.content[0].get("input") for r in replies[:2]] == [{"a": 0}, {"a": 1}]
    assert replies[0].content[0]["id"] != replies[1].content[0]["id"]
    assert replies[2] == Reply.text("sum", delay=0.5)
    assert tool_turns(0) == [Reply.text("done")]
    with pytest.raises(ValueError, match="turns must be"):
        tool_turns(-1)


def test_bad_conversation_scripts_are_refused() -> None:
    with pytest.raises(TypeError, match="conversation 'k': turn 1: expected a Reply"):
        FakeMessagesAPI(conversations={"k": [Reply.text("a"), ()]})
    with pytest.raises(TypeError, match="first user message"):
        FakeMessagesAPI(conversations={1: [Reply.text("a")]})  # type: ignore[dict-item]


KEYED = """
replies:
  - text: fallback
conversations:
  "plan a trip":
    - tool_use: {name: search, input: {q: trains}, id: toolu_t}
    - [{status: 529}, {text: booked}]
  hello:
    - text: hi there
"""


async def test_load_script_file_keyed(tmp_path: Path) -> None:
    path = tmp_path / "keyed.yaml"
    path.write_text(KEYED)
    script = load_script_file(path)
    assert script.replies == (Reply.text("fallback"),)
    assert script.conversations == {
        "plan a trip": (
            (Reply.tool_use("search", {"q": "trains"}, id="toolu_t"),),
            (Reply.error(529), Reply.text("booked")),
        ),
        "hello": ((Reply.text("hi there"),),),
    }
    plain = tmp_path / "plain.yaml"
    plain.write_text("- text: one\n")
    assert load_script_file(plain).replies == (Reply.text("one"),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("replys: []\n", "unknown key 'replys'"),
        ("conversations: [a]\n", "field 'conversations': expected a mapping"),
        ("conversations: {hi: []}\n", "conversation 'hi': expected a non-empty list of turns"),
        ("conversations: {hi: text}\n", "conversation 'hi': expected a non-empty list"),
        ("conversations: {1: [{text: a}]}\n", "conversation 1: the key must be a string"),
        ("conversations: {hi: [{text: a}, {txt: b}]}\n", "conversation 'hi': turn 1: unknown key"),
        ("conversations: {hi: [[{text: a}, {text: 5}]]}\n", "turn 0: attempt 1: field 'text'"),
        ("conversations: {hi: [[]]}\n", "conversation 'hi': turn 0: a list of attempts must not"),
        ("replies: {text: a}\n", "replies: expected a list of replies"),
        ("replies: [{txt: a}]\n", "replies: item 0: unknown key 'txt'"),
        ("just text\n", "expected a list of replies or a mapping, got str"),
    ],
)
def test_load_script_file_rejects_bad_keyed_scripts(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(text)
    with pytest.raises(ScriptError) as info:
        load_script_file(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_serve_reports_a_bad_keyed_script(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("conversations: {hi: [{nope: 1}]}\n")
    out = io.StringIO()
    assert serve(str(path), out=out) == 2
    assert f"{path}: conversation 'hi': turn 0: unknown key 'nope'" in out.getvalue()


async def test_fake_api_cli_serves_a_keyed_script(tmp_path: Path) -> None:
    path = tmp_path / "keyed.yaml"
    path.write_text(KEYED)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "fisk_sm.cli", "fake-api", "--script", str(path)),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), HANG)).decode()
        assert line.rstrip().endswith("(1 scripted replies, 2 conversations)"), line
        base_url = line.split(" on ", 1)[1].split()[0]
        async with anthropic.AsyncAnthropic(api_key="t", base_url=base_url) as c:
            for text, expected in [("hello", "hi there"), ("someone else", "fallback")]:
                user: Any = [{"role": "user", "content": text}]
                resp = await c.messages.create(model=MODEL, max_tokens=5, messages=user)
                assert resp.content[0].type == "text" and resp.content[0].text == expected
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), HANG) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

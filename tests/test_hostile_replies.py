"""Hostile Messages API replies, through the real SDK over loopback HTTP.

Every malformed reply ends the run as `failed` with one short line naming the field; none of it
reaches the journal, which still folds, shows and resumes. Well-formed replies, unknown block
types included, are kept verbatim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config, make_run

from fisk_sm import Tool, tool
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import Assistant, Record, Terminal, encode
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.reply import PREFIX
from fisk_sm.testing import FakeMessagesAPI, Reply

MARKER = "hostile-7f3a"  # in every bad body; never in an error message, so never journaled
DROP = object()
TEXT = {"type": "text", "text": f"text {MARKER}"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "touch", "input": {"label": "x"}}
USAGE = {"input_tokens": 10, "output_tokens": 5}


def message(**fields: Any) -> dict[str, Any]:
    """A well-formed reply body with `fields` replaced (or removed, given `DROP`)."""
    well_formed = {
        "id": f"msg_{MARKER}",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [TEXT],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": USAGE,
    }
    return block(well_formed, **fields)


def block(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """`base` with `fields` replaced (or removed, given `DROP`)."""
    return {k: v for k, v in {**base, **fields}.items() if v is not DROP}


def usage(**fields: Any) -> dict[str, Any]:
    """A reply body whose usage has `fields` replaced (or removed, given `DROP`)."""
    return message(usage=block(USAGE, **fields))


HTML = f"<html>\n<head><title>200 OK</title></head>\n<body>{MARKER}</body>\n</html>\n"
NAME = "expected a non-empty string, got"
COUNT = "expected a non-negative integer, got"


def blocks(*content: object) -> Reply:
    """A reply whose content is `content`."""
    return Reply.body(message(content=list(content)))


# fmt: off
CASES = [pytest.param(reply, problem, id=name) for name, reply, problem in [
    ("tool_use-without-id", blocks(TEXT, block(CALL, id=DROP)), "content[1].id: missing"),
    ("tool_use-empty-id", blocks(block(CALL, id="")), f"content[0].id: {NAME} ''"),
    ("tool_use-without-name", blocks(block(CALL, name=DROP)), "content[0].name: missing"),
    ("tool_use-name-a-number", blocks(block(CALL, name=5)), f"content[0].name: {NAME} 5"),
    ("tool_use-input-a-list", blocks(block(CALL, input=["x"])),
     "content[0].input: expected an object, got list"),
    ("tool_use-without-input", blocks(block(CALL, input=DROP)), "content[0].input: missing"),
    ("tool_use-repeated-id", blocks(CALL, TEXT, CALL),
     "content[2].id: repeats the id of content[0]"),
    ("server_tool_use-without-id", blocks(block(CALL, type="server_tool_use", id=DROP)),
     "content[0].id: missing"),
    ("content-a-string", Reply.body(message(content="just some text")),
     "content: expected a list, got 'just some text'"),
    ("content-missing", Reply.body(message(content=DROP)), "content: missing"),
    ("content-item-a-string", blocks("hi"), "content[0]: expected an object, got 'hi'"),
    ("block-without-type", blocks(block(TEXT, type=DROP)), "content[0].type: missing"),
    ("block-type-a-number", blocks(block(TEXT, type=7)), f"content[0].type: {NAME} 7"),
    ("text-a-number", blocks(block(TEXT, text=5)), "content[0].text: expected a string, got 5"),
    ("text-missing", blocks(block(TEXT, text=DROP)), "content[0].text: missing"),
    ("html-200", Reply.raw(HTML, content_type="text/html"), "body is not JSON"),
    ("json-array", Reply.body([message()]), "body is not a JSON object (got list)"),
    ("json-null", Reply.body(None), "body is not a JSON object (got null)"),
    ("invalid-json", Reply.raw('{"id": "' + MARKER + '", '), "body is not JSON"),
    ("invalid-utf8", Reply.raw(b"\xff" + MARKER.encode()), "body is not JSON"),
    ("nested-too-deep", Reply.raw("[" * 100_000), "body is not JSON"),
    ("empty-body", Reply.raw(""), "body is empty"),
    ("tool-input-NaN", blocks(block(CALL, input={"x": float("nan")})),
     "body is not JSON (it holds NaN)"),
    ("usage-infinite", Reply.body(usage(output_tokens=float("-inf"))),
     "body is not JSON (it holds -Infinity)"),
    ("usage-a-string", Reply.body(message(usage="lots")), "usage: expected an object, got 'lots'"),
    ("usage-missing", Reply.body(message(usage=DROP)), "usage: missing"),
    ("usage-null", Reply.body(message(usage=None)), "usage: expected an object, got None"),
    ("input_tokens-negative", Reply.body(usage(input_tokens=-5)),
     f"usage.input_tokens: {COUNT} -5"),
    ("input_tokens-missing", Reply.body(usage(input_tokens=DROP)), "usage.input_tokens: missing"),
    ("input_tokens-a-bool", Reply.body(usage(input_tokens=True)),
     f"usage.input_tokens: {COUNT} True"),
    ("input_tokens-a-float", Reply.body(usage(input_tokens=1.5)),
     f"usage.input_tokens: {COUNT} 1.5"),
    ("output_tokens-negative", Reply.body(usage(output_tokens=-1)),
     f"usage.output_tokens: {COUNT} -1"),
    ("output_tokens-a-string", Reply.body(usage(output_tokens="5")),
     f"usage.output_tokens: {COUNT} '5'"),
    ("cache_read-negative", Reply.body(usage(cache_read_input_tokens=-100)),
     f"usage.cache_read_input_tokens: {COUNT} -100"),
    ("cache_creation-a-string", Reply.body(usage(cache_creation_input_tokens="many")),
     f"usage.cache_creation_input_tokens: {COUNT} 'many'"),
    ("stop_reason-a-number", Reply.body(message(stop_reason=3)),
     "stop_reason: expected a string or null, got 3"),
    ("stop_reason-an-object", Reply.body(message(stop_reason={"why": "x"})),
     "stop_reason: expected a string or null, got dict"),
]]
# fmt: on


def cases(*ids: str) -> list[Any]:
    """The cases named `ids`."""
    by_id = {case.id: case for case in CASES}
    return [by_id[i] for i in ids]


@pytest.fixture
def touch(tmp_path: Path) -> Tool:
    @tool
    def touch(label: str) -> str:
        """Append a line to the side-effect file.

        Args:
            label: what to write
        """
        with (tmp_path / "fx").open("a") as f:
            f.write(label + "\n")
        return f"wrote {label}"

    return touch


def check_journal(records: list[Record], text: bytes, error: str) -> None:
    """The journal folds to a failed run with `error`, and holds nothing of the bad reply."""
    assert MARKER.encode() not in text
    assert isinstance(records[-1], Terminal)
    assert (records[-1].reason, records[-1].message) == ("failed", error)
    snapshot = fold(records)
    assert (snapshot.status, snapshot.outcome) == ("failed", error)


@pytest.mark.parametrize(("reply", "problem"), CASES)
async def test_a_malformed_reply_fails_the_run_and_is_not_journaled(
    api: FakeMessagesAPI, reply: Reply, problem: str
) -> None:
    api.add(reply)
    run, _, journal = make_run(api)
    assert await run.run() == "failed"
    assert run.data.error == PREFIX + problem
    assert len(api.requests) == 1  # a 200 is not retried, however bad its body
    assert [type(r).__name__ for r in journal.records] == ["Meta", "Terminal"]
    assert (run.data.llm_calls, run.data.usage.total) == (0, 0)
    text = "\n".join(encode(r) for r in journal.records).encode()
    check_journal(journal.records, text, PREFIX + problem)


SOME = ("tool_use-without-id", "content-a-string", "html-200", "input_tokens-negative")


@pytest.mark.parametrize(("reply", "problem"), cases(*SOME, "json-array", "empty-body"))
async def test_a_malformed_reply_after_a_tool_turn_leaves_a_session_that_resumes(
    api: FakeMessagesAPI, tmp_path: Path, touch: Tool, reply: Reply, problem: str
) -> None:
    store = FileStore(tmp_path / "state")
    config = make_config(api)
    api.add(Reply.tool_use("touch", {"label": "one"}, id="toolu_ok"), reply)
    run = await start_session(config, "do the thing", store, RunOptions(tools=[touch]), run_id="s1")
    assert await run.run() == "failed"
    await run.harness.journal.close()
    records = store.load("s1")
    kinds = [type(r).__name__ for r in records]
    assert kinds == ["Meta", "Assistant", "ToolStarted", "ToolResult", "Terminal"]
    check_journal(records, store.path("s1").read_bytes(), PREFIX + problem)
    assert fold(records).llm_calls == 1

    api.add(Reply.text("done"))
    resumed = await resume_session(config, "s1", store, RunOptions(tools=[touch]))
    assert await resumed.run() == "completed"
    await resumed.harness.journal.close()
    sent = api.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[-1]["content"][0]["tool_use_id"] == "toolu_ok"
    assert (tmp_path / "fx").read_text() == "one\n"  # the tool ran once, before the bad reply
    assert fold(store.load("s1")).completed


async def test_a_quoted_value_is_cut_short_and_kept_on_one_line(api: FakeMessagesAPI) -> None:
    api.add(Reply.body(message(content="line one\nline two " + "x" * 10_000)))
    run, _, _ = make_run(api)
    assert await run.run() == "failed"
    error = run.data.error or ""
    assert error.startswith(PREFIX + "content: expected a list, got 'line one\\nline two xxx")
    assert error.endswith("…") and "\n" not in error and len(error) < 120


@pytest.mark.parametrize(
    ("replies", "error"),
    [
        pytest.param(
            [Reply.error(400, message="\x1b[31mboom\u202e\nsecond\tline")],
            "llm call: HTTP 400: \x1b[31mboom\u202e second line",
            id="control-characters-kept-newlines-folded",
        ),
        pytest.param(
            [Reply.raw(HTML.replace("200 OK", "502"), 502, "text/html")] * 3,
            "llm call: HTTP 502: <html> <head><title>502</title></head> <body>",
            id="proxy-error-page",
        ),
        pytest.param(
            [Reply.error(400, message="y" * 5_000)],
            "llm call: HTTP 400: yyyy",
            id="long-message",
        ),
    ],
)
async def test_http_error_messages_are_one_short_line(
    api: FakeMessagesAPI, replies: list[Reply], error: str
) -> None:
    api.add(*replies)
    run, _, journal = make_run(api)
    assert await run.run() == "failed"
    assert len(api.requests) == len(replies)  # 5xx retried, 400 not
    assert run.data.error is not None and run.data.error.startswith(error)
    assert "\n" not in run.data.error and len(run.data.error) <= 230
    assert [type(r).__name__ for r in journal.records] == ["Meta", "Terminal"]


async def test_a_lone_surrogate_in_an_error_message_is_journaled_as_utf8(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.error(400, message="bad \ud800 thing"))
    store = FileStore(tmp_path)
    run = await start_session(make_config(api), "do the thing", store, run_id="s2")
    assert await run.run() == "failed"
    await run.harness.journal.close()
    assert run.data.error == "llm call: HTTP 400: bad \ufffd thing"
    assert fold(store.load("s2")).outcome == run.data.error


async def test_blocks_come_back_exactly_as_sent(api: FakeMessagesAPI, touch: Tool) -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "hmm… ü \x1b", "signature": "EqQBCkgIARAB+/sig=="},
        {"type": "redacted_thinking", "data": "opaque=="},
        {"type": "text", "text": "calling", "citations": None},
        {"type": "future_block", "z": {"b": [1.5, None, True], "a": 2}},
        {"input": {"label": "a", "extra": {"y": 1, "x": 0}}, "name": "touch", "type": "tool_use",
         "id": "toolu_v", "caller": {"type": "direct"}},
    ]  # fmt: skip
    api.add(Reply(content=blocks, stop_reason="tool_use"), Reply.text("done"))
    run, _, journal = make_run(api, [touch])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert await run.run() == "completed"
    assert [str(w.message) for w in caught] == []  # no pydantic serializer warnings
    echoed = api.requests[1]["messages"][1]
    assert echoed["role"] == "assistant"
    assert json.dumps(echoed["content"]) == json.dumps(blocks)  # same keys, order and values
    turn = next(r for r in journal.records if isinstance(r, Assistant))
    assert json.dumps(turn.message["content"]) == json.dumps(blocks)


async def test_a_lone_surrogate_from_the_model_is_replaced_before_it_is_journaled_or_sent(
    api: FakeMessagesAPI, tmp_path: Path, touch: Tool
) -> None:
    """Text from the model is never refused for a lone surrogate: U+FFFD takes its place, in the
    journal, in the tool's input and in the turn sent back (the SDK would refuse to encode it)."""
    turn = message(
        content=[
            block(TEXT, text="a\ud800b"),
            block(CALL, input={"label": "x\udfffy"}),
        ],
        stop_reason="tool_use",
    )
    api.add(Reply.raw(json.dumps(turn)), Reply.text("done"))
    store = FileStore(tmp_path / "state")
    options = RunOptions(tools=[touch])
    run = await start_session(make_config(api), "do the thing", store, options, run_id="s3")
    assert await run.run() == "completed"
    await run.harness.journal.close()
    assert (tmp_path / "fx").read_text() == "x\ufffdy\n"
    text = store.path("s3").read_bytes()
    assert b"\\ud8" not in text.lower() and b"\\udf" not in text.lower()
    echoed = api.requests[1]["messages"][1]["content"]
    assert echoed[0]["text"] == "a\ufffdb"
    assert echoed[1]["input"] == {"label": "x\ufffdy"}


async def test_a_valid_reply_may_leave_out_the_optional_fields(api: FakeMessagesAPI) -> None:
    api.add(Reply.body(message(stop_reason=DROP, usage={**USAGE, "cache_read_input_tokens": None})))
    run, _, _ = make_run(api)
    assert await run.run() == "completed"
    assert run.data.stop_reason is None and run.data.usage.total == 15


CLI = [sys.executable, "-m", "fisk_sm.cli"]


def fisk(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    env.pop("ANTHROPIC_BASE_URL", None)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("reply", "problem"), cases(*SOME))
def test_the_cli_reports_a_malformed_reply_in_one_line(
    api: FakeMessagesAPI, tmp_path: Path, reply: Reply, problem: str
) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"llm: {{model: m, base_url: '{api.base_url}'}}\n")
    state = str(tmp_path / "state")
    api.add(reply)
    done = fisk("run", "-c", str(agent), "--checkpoint", "--name", "h1", "--state-dir", state, "go")
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "session: h1"
    assert lines[1] == f"failed: {PREFIX}{problem}"
    assert lines[2].startswith("m · 0 llm calls · 0 tool calls · tokens in 0 out 0")
    assert len(lines) == 3
    assert "Traceback" not in done.stderr and "Serializ" not in done.stderr
    shown = fisk("session", "show", "h1", "--state-dir", state)
    assert shown.returncode == 0, shown.stderr
    assert f"failed ({PREFIX}{problem})" in shown.stdout and MARKER not in shown.stdout

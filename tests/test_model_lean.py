"""A plain model call goes through the SDK's `client.post`, not `messages.create`
(`fisk_sm.model.transport`: a fifth of a call's CPU), and nothing it sends or reads differs.

Each test runs the real SDK over loopback against `FakeMessagesAPI`, and compares the lean call
with the same call made through `messages.create` (the model's own fallback, forced here):
the bytes and headers the fake got, what `create` returns for replies with every kind of block
and stop reason, and the errors. The fallback itself is taken when the SDK's span could record
or propagate (a tracer provider set, a current span), and for the models the SDK warns about.
"""

from __future__ import annotations

import json
import warnings

import attrs
import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fisk_sm import parse_config
from fisk_sm.config.agent import LLMConfig
from fisk_sm.model import transport
from fisk_sm.model.anthropic import AnthropicModel, ModelError, ModelRequest
from fisk_sm.model.blocks import Message, ToolResultBlock, message_of
from fisk_sm.model.later import later_all
from fisk_sm.testing import FakeMessagesAPI, Reply

TOOL = {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}
REQUEST = ModelRequest(
    model="m",
    max_tokens=64,
    messages=[Message("user", "héllo ✓ \u2028 <b>")],  # non-ASCII goes out as UTF-8, as the SDK's
    system=({"type": "text", "text": "be brief"},),
    tools=(TOOL,),
    thinking={"type": "enabled", "budget_tokens": 1024},
    cache_ttl="5m",
)
THINKING = {"type": "thinking", "thinking": "hmm", "signature": "c2ln"}
EVERY_BLOCK = (
    THINKING,
    {"type": "redacted_thinking", "data": "ZW5j"},
    {"type": "text", "text": "x", "citations": [{"type": "char_location", "cited_text": "y"}]},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "z"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": [2.5, None]}},
    {"type": "a_block_of_a_later_api", "anything": {"nested": True}},
)
REPLIES = (
    Reply(content=EVERY_BLOCK, stop_reason="tool_use", cache_read_input_tokens=7),
    Reply.text("partial", stop_reason="max_tokens"),
    Reply(content=(), stop_reason="refusal", cache_creation_input_tokens=3),
    Reply.text("bye", stop_reason="pause_turn"),
    Reply.body(
        {"content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
    ),
)
#: Headers that differ between two calls by their nature, whichever way they are made.
PER_CALL = {"host", "x-stainless-raw-response"}


def llm(base_url: str, model: str = "m") -> LLMConfig:
    raw = {"model": model, "base_url": base_url, "no_prompt_cache": True}
    return parse_config({"system_prompt": "test", "llm": raw}, env={}).llm


async def calls(replies: tuple[Reply, ...], request: ModelRequest = REQUEST) -> list[object]:
    """What `create` returns or raises for each reply, and how the fake got each request."""
    with FakeMessagesAPI(list(replies)) as api:
        model = AnthropicModel(llm(api.base_url), api_key="k1", max_retries=0)
        got: list[object] = []
        try:
            for _ in replies:
                try:
                    got.append(await model.create(request))
                except ModelError as exc:
                    got.append(f"ModelError: {exc}")
        finally:
            await model.aclose()
        headers = [{k: v for k, v in h.items() if k not in PER_CALL} for h in api.request_headers]
        return [*got, api.raw_requests, headers]


async def test_a_plain_call_is_a_lean_one_and_sends_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = transport.lean_calls
    lean = await calls(REPLIES)
    assert transport.lean_calls == before + len(REPLIES)  # each through `client.post`
    monkeypatch.setattr("fisk_sm.model.anthropic.lean_call", lambda model, thinking: False)
    assert await calls(REPLIES) == lean  # replies, body bytes, headers: all the same
    assert transport.lean_calls == before + len(REPLIES)


async def test_every_block_kind_and_stop_reason_reads_as_sent() -> None:
    before = transport.lean_calls
    replies = (await calls(REPLIES))[: len(REPLIES)]
    assert transport.lean_calls == before + len(REPLIES)
    assert [r["stop_reason"] for r in replies] == [  # type: ignore[index]
        "tool_use",
        "max_tokens",
        "refusal",
        "pause_turn",
        None,
    ]
    assert replies[0]["content"] == list(EVERY_BLOCK)  # type: ignore[index]
    assert replies[0]["usage"]["cache_read_input_tokens"] == 7  # type: ignore[index]


async def test_errors_read_the_same_on_the_lean_call(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = (
        Reply.error(400, "thinking.budget_tokens: must be less than max_tokens"),
        Reply.error(401, "invalid x-api-key"),
        Reply.error(429, "slow down"),
        Reply.error(529),
        Reply.raw(b"<html>gateway</html>", status=502, content_type="text/html"),
        Reply.raw(b'{"content": [{"type": "tool_use"}]}'),  # malformed: named by the check
        Reply.raw(b"not json"),
    )
    before = transport.lean_calls
    lean = await calls(errors)
    assert transport.lean_calls == before + len(errors)
    assert lean[0] == (
        "ModelError: llm.thinking: model m refused budget_tokens=1024 thinking"
        " (400: thinking.budget_tokens: must be less than max_tokens)"
    )
    assert lean[1] == "ModelError: llm call: HTTP 401: invalid x-api-key"
    assert lean[4] == "ModelError: llm call: HTTP 502: <html>gateway</html>"
    assert lean[5] == "ModelError: malformed model reply: content[0].id: missing"
    monkeypatch.setattr("fisk_sm.model.anthropic.lean_call", lambda model, thinking: False)
    assert await calls(errors) == lean


async def test_a_retried_call_is_retried_the_same_way() -> None:
    before = transport.lean_calls
    with FakeMessagesAPI([Reply.error(529), Reply.text("ok")]) as api:
        model = AnthropicModel(llm(api.base_url), api_key="k1")
        try:
            assert (await model.create(REQUEST))["content"] == [{"type": "text", "text": "ok"}]
        finally:
            await model.aclose()
        first, second = api.request_headers
        assert (first["x-stainless-retry-count"], second["x-stainless-retry-count"]) == ("0", "1")
        assert api.raw_requests[0] == api.raw_requests[1]
    assert transport.lean_calls == before + 1  # one lean call, retried inside the SDK


async def test_a_current_span_takes_the_sdk_path_and_is_propagated() -> None:
    ids = trace.SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=trace.TraceFlags(1))
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(ids)))
    before = transport.lean_calls
    try:
        with FakeMessagesAPI([Reply.text("ok")]) as api:
            model = AnthropicModel(llm(api.base_url), api_key="k1")
            try:
                await model.create(REQUEST)
            finally:
                await model.aclose()
    finally:
        context.detach(token)
    assert transport.lean_calls == before  # through `messages.create`, whose span carries it
    assert api.request_headers[0]["traceparent"].startswith(f"00-{0xABC:032x}-")


async def test_with_a_tracer_provider_set_the_sdk_records_its_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # as set_tracer_provider, undone
    before = transport.lean_calls
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        model = AnthropicModel(llm(api.base_url), api_key="k1")
        try:
            await model.create(REQUEST)
        finally:
            await model.aclose()
    assert transport.lean_calls == before
    assert [span.name for span in exporter.get_finished_spans()] == ["anthropic.messages.create"]


def test_the_sdk_still_names_the_models_it_warns_about() -> None:
    deprecated, with_thinking = transport._warned_models()
    # a later SDK that moved them: every call would take the fallback, silently slower
    assert not isinstance(deprecated, transport._Everything)
    assert not isinstance(with_thinking, transport._Everything)


@pytest.mark.parametrize("which", ["deprecated", "deprecated with thinking enabled"])
async def test_a_model_the_sdk_warns_about_still_gets_its_warning(which: str) -> None:
    deprecated, with_thinking = transport._warned_models()
    thinking = {"type": "enabled", "budget_tokens": 1024} if "thinking" in which else None
    warned = set(deprecated if thinking is None else with_thinking)  # type: ignore[call-overload]
    name = sorted(warned - set(deprecated) if thinking else warned)[0]  # type: ignore[call-overload]
    request = ModelRequest(
        model=name, max_tokens=2048, messages=[Message("user", "hi")], thinking=thinking
    )
    before = transport.lean_calls
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        model = AnthropicModel(llm(api.base_url, name), api_key="k1")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                await model.create(request)
        finally:
            await model.aclose()
    assert transport.lean_calls == before  # through `messages.create`, which warned
    assert any(name in str(w.message) for w in caught)


CONVERSATION = [
    Message("user", "héllo ✓"),
    message_of(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "adding", "extra": [1.5, None]},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
            ],
        }
    ),
    Message("user", (ToolResultBlock("toolu_1", "3"),)),
]


async def test_a_conversation_goes_out_as_messages_create_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Message by message (`ModelRequest.body`), the same bytes as the whole `params()`."""
    request = attrs.evolve(REQUEST, messages=CONVERSATION)
    lean = await calls(REPLIES[:1], request)
    monkeypatch.setattr("fisk_sm.model.anthropic.lean_call", lambda model, thinking: False)
    assert await calls(REPLIES[:1], request) == lean


async def test_a_message_held_as_bytes_goes_out_as_those_very_bytes() -> None:
    """A message of a resumed conversation (`Message.raw`: pieces of the journal's bytes) is
    spliced in as it is; the request means what its decoded form would send."""
    value = memoryview(b'[{"type":"text","text":"a\\u00e9"}, {"type":"text","text":"b"}]')
    pieces = (b'{"role":"assistant","content":', value, b"}")
    held = later_all(
        lambda _: json.loads(b"".join(pieces)), ["assistant"], [0], lambda _, role: pieces
    )
    request = attrs.evolve(REQUEST, messages=[Message("user", "q"), *held, Message("user", "r")])
    *_, raw_requests, _ = await calls(REPLIES[:1], request)
    [body] = raw_requests  # type: ignore[misc]
    assert b"".join(pieces) in body
    assert json.loads(body) == json.loads(json.dumps(request.params()))

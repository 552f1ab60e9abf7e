"""OpenTelemetry traces of runs (issue 13, acceptance 3): the span tree of a 2-tool run through
the fake Messages API and the real SDK, recorded by the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import make_config, make_run
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fisk_sm import MemoryJournal, Recorder, Run, tool
from fisk_sm.events import Fanout
from fisk_sm.events.otel import CAPTURE_CONTENT_ENV, OtelEvents
from fisk_sm.loop.harness import RunOptions
from fisk_sm.testing import FakeMessagesAPI, Reply

SECRETS = ("alpha-secret", "beta-secret", "ECHO:alpha-secret", "SHOUT:BETA-SECRET", "the answer")
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "fisk_sm.detail",
}
#: The fake's usage per reply: (input, output, cache read, cache creation).
USAGE = [(11, 3, 7, 2), (13, 4, 5, 0), (17, 6, 1, 1)]


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return f"ECHO:{text}"


@tool
def shout(text: str) -> str:
    """Shout the text back."""
    return f"SHOUT:{text.upper()}"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def script_two_tools(api: FakeMessagesAPI) -> None:
    tiers = [
        dict(
            input_tokens=i,
            output_tokens=o,
            cache_read_input_tokens=r,
            cache_creation_input_tokens=c,
        )
        for i, o, r, c in USAGE
    ]
    api.add(
        Reply.tool_use("echo", {"text": "alpha-secret"}, id="toolu_01", **tiers[0]),
        Reply.tool_use("shout", {"text": "beta-secret"}, id="toolu_02", **tiers[1]),
        Reply.text("the answer", **tiers[2]),
    )


async def two_tool_run(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter, **kw: Any
) -> tuple[Recorder, dict[str, ReadableSpan], list[ReadableSpan]]:
    """A run that calls echo, then shout, then answers; its events go to an `OtelEvents`
    (made with `kw`) on a provider of its own that exports to `exporter`."""
    script_two_tools(api)
    run, recorder, _ = make_run(api, [echo, shout])
    run.harness.events = Fanout((recorder, OtelEvents(provider_for(exporter), **kw)))
    assert await run.run() == "completed"
    spans = list(exporter.get_finished_spans())
    return recorder, {s.name: s for s in spans}, spans


def dump(spans: list[ReadableSpan]) -> str:
    """Every attribute and span event of `spans`, as text (to look for content in)."""
    parts = []
    for span in spans:
        parts.append(json.dumps(dict(span.attributes or {}), default=str))
        for event in span.events:
            parts.append(event.name + json.dumps(dict(event.attributes or {}), default=str))
    return "\n".join(parts)


def keys(spans: list[ReadableSpan]) -> set[str]:
    found = set()
    for span in spans:
        found |= set(span.attributes or {})
        for event in span.events:
            found |= set(event.attributes or {})
    return found


async def test_a_two_tool_run_is_one_trace_of_run_calls_and_tools(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    recorder, _, spans = await two_tool_run(api, exporter)
    spans.sort(key=lambda s: s.start_time or 0)
    assert [s.name for s in spans] == [
        "invoke_agent fisk-sm",
        "chat claude-test",
        "execute_tool echo",
        "chat claude-test",
        "execute_tool shout",
        "chat claude-test",
    ]
    root, children = spans[0], spans[1:]
    assert root.parent is None
    assert root.kind is SpanKind.INTERNAL
    for child in children:
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    # Each span lies within its parent, and a call ends before the tool it asked for starts.
    for before, after in itertools.pairwise(children):
        assert before.end_time is not None and after.start_time is not None
        assert before.end_time <= after.start_time
    assert root.end_time is not None and children[-1].end_time is not None
    assert root.end_time >= children[-1].end_time
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == "test-run"
    assert root.attributes["gen_ai.provider.name"] == "anthropic"
    assert root.attributes["fisk_sm.state"] == "completed"
    assert root.status.status_code is StatusCode.UNSET
    # A call's span ends when the run leaves `call` (its reply is journaled after that).
    left_call = [
        e.timestamp for e in root.events if (e.attributes or {}).get("fisk_sm.source") == "call"
    ]
    assert [s.end_time for s in children if s.name.startswith("chat")] == left_call
    # The state entries are span events of the run span, in order.
    states = [e.attributes["fisk_sm.state"] for e in root.events if e.attributes]
    assert [e.name for e in root.events] == ["state_entered"] * len(recorder.states())
    assert states == recorder.states()


async def test_the_call_spans_carry_the_fakes_usage_and_stop_reason(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    _, _, spans = await two_tool_run(api, exporter)
    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time or 0)
    assert len(calls) == 3 == len(api.requests)
    for span, (i, o, r, c), stop in zip(
        calls, USAGE, ("tool_use", "tool_use", "end_turn"), strict=True
    ):
        attributes = dict(span.attributes or {})
        assert span.kind is SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.system"] == attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.request.model"] == "claude-test"
        # The convention's input count includes the cached tiers; these are its parts.
        assert attributes["gen_ai.usage.input_tokens"] == i + r + c
        assert attributes["gen_ai.usage.output_tokens"] == o
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == r
        assert attributes["gen_ai.usage.cache_creation.input_tokens"] == c
        assert attributes["gen_ai.response.finish_reasons"] == (stop,)
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    totals = dict(root.attributes or {})
    assert totals["gen_ai.usage.output_tokens"] == sum(u[1] for u in USAGE)
    assert totals["gen_ai.usage.input_tokens"] == sum(u[0] + u[2] + u[3] for u in USAGE)
    assert totals["gen_ai.usage.cache_read.input_tokens"] == sum(u[2] for u in USAGE)


async def test_the_tool_spans_name_the_tool_and_its_call(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    _, by_name, _ = await two_tool_run(api, exporter)
    for name, use_id in (("echo", "toolu_01"), ("shout", "toolu_02")):
        attributes = dict(by_name[f"execute_tool {name}"].attributes or {})
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == name
        assert attributes["gen_ai.tool.call.id"] == use_id
        assert attributes["fisk_sm.tool.kind"] == "python"


async def test_no_content_on_the_spans_by_default(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    _, _, spans = await two_tool_run(api, exporter)
    assert keys(spans) & CONTENT_KEYS == set()
    text = dump(spans)
    for secret in SECRETS:
        assert secret not in text


async def test_content_is_on_the_spans_when_asked_for(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    _, by_name, _ = await two_tool_run(api, exporter, capture_content=True)
    echo_span = dict(by_name["execute_tool echo"].attributes or {})
    assert json.loads(echo_span["gen_ai.tool.call.arguments"]) == {"text": "alpha-secret"}
    assert echo_span["gen_ai.tool.call.result"] == "ECHO:alpha-secret"
    shout_span = dict(by_name["execute_tool shout"].attributes or {})
    assert shout_span["gen_ai.tool.call.result"] == "SHOUT:BETA-SECRET"
    root = dict(by_name["invoke_agent fisk-sm"].attributes or {})
    answer = json.loads(root["gen_ai.output.messages"])
    assert answer == [{"role": "assistant", "parts": [{"type": "text", "content": "the answer"}]}]


async def test_the_conventions_environment_variable_opts_in(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    _, _, spans = await two_tool_run(api, exporter)
    last_call = max(
        (s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time or 0
    )
    messages = json.loads(dict(last_call.attributes or {})["gen_ai.output.messages"])
    assert messages[0]["parts"][0]["content"] == "the answer"
    assert messages[0]["finish_reason"] == "end_turn"
    # An explicit no wins over the environment.
    assert OtelEvents(provider_for(exporter), capture_content=False).capture_content is False


async def test_a_failed_call_ends_its_span_and_the_run_span_as_errors(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    api.add(Reply(status=400, message="bad request from the fake"))
    run, recorder, _ = make_run(api)
    run.harness.events = Fanout((recorder, OtelEvents(provider_for(exporter))))
    assert await run.run() == "failed"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_agent fisk-sm", "chat claude-test"}
    call, root = spans["chat claude-test"], spans["invoke_agent fisk-sm"]
    assert call.status.status_code is StatusCode.ERROR
    assert dict(call.attributes or {})["error.type"] == "failed"
    assert "gen_ai.usage.input_tokens" not in dict(call.attributes or {})
    assert root.status.status_code is StatusCode.ERROR
    assert dict(root.attributes or {})["error.type"] == "failed"


async def test_many_runs_share_one_adapter_each_with_its_own_tree(
    api: FakeMessagesAPI, exporter: InMemorySpanExporter
) -> None:
    otel = OtelEvents(provider_for(exporter))
    # Each run has its own script (by its prompt), so neither can take the other's reply however
    # the two interleave: each calls one tool, then answers.
    for n in range(2):
        api.add_conversation(
            f"go {n}", Reply.tool_use("echo", {"text": f"{n}"}), Reply.text("done")
        )
    config = make_config(api)
    runs = [
        Run.create(
            config,
            f"go {n}",
            RunOptions(tools=[echo], events=otel, journal=MemoryJournal()),
            run_id=f"run-{n}",
        )
        for n in range(2)
    ]
    assert await asyncio.gather(*(r.run() for r in runs)) == ["completed", "completed"]
    spans = exporter.get_finished_spans()
    roots = {dict(s.attributes or {})["gen_ai.conversation.id"]: s for s in spans if not s.parent}
    assert set(roots) == {"run-0", "run-1"}
    for run_id, root in roots.items():
        mine = [s for s in spans if s.parent and s.parent.span_id == root.context.span_id]
        assert sorted(s.name for s in mine) == [
            "chat claude-test",
            "chat claude-test",
            "execute_tool echo",
        ]
        assert {dict(s.attributes or {})["gen_ai.conversation.id"] for s in mine} == {run_id}
    assert otel.open_runs() == []


def test_the_adapter_never_sets_the_global_provider(exporter: InMemorySpanExporter) -> None:
    before = trace.get_tracer_provider()
    OtelEvents(provider_for(exporter))
    OtelEvents()  # the global provider, whatever it is: a no-op one unless the app set one
    assert trace.get_tracer_provider() is before
    assert type(before).__name__ == "ProxyTracerProvider"

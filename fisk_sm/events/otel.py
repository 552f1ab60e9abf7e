"""OpenTelemetry traces of runs, after the GenAI semantic conventions: an events adapter.

Theory of operation. `OtelEvents` turns a run's typed events into spans. It never configures
OpenTelemetry: it uses the `TracerProvider` it is given, else the global one (a no-op until the
application sets one). `otlp_export()` builds what the command line exports through: a provider
of its own, OTLP over HTTP as the standard `OTEL_EXPORTER_OTLP_*` variables say, exported in
batches by the SDK's thread; its `shutdown()` flushes. The `opentelemetry` packages (the
`fisk-sm[otel]` extra) are imported only by this module and `fisk_sm.events.otel_genai` (the
attributes' names and shapes, as the GenAI convention has them, which only this module imports),
and nothing imports this module unless asked to.

One trace per run, or per resume of a session (each resume has its own run span; they share
`gen_ai.conversation.id`, the run id):

    invoke_agent {agent}     RunStarted .. RunEnded: the run's totals, a span event per state
      chat {model}           one per model call, from entering the `call` state to leaving it
      execute_tool {tool}    one per tool that ran: ToolCalled .. ToolFinished

No event marks the start of a model call, so the StateEntered of `call` opens its span, and the
next StateEntered (leaving `call`: to `journal` after a reply, to `failed` or `suspended`
without one) notes when it ended. The reply's usage and stop reason come later, with the
MessageReceived of the `decide` state, after the turn is journaled: the span is ended then, at
the time noted, so its duration is the call's. A call that never replied is ended by the
RunEnded that follows, with an error status.

Content (the model's text, the answer, tool arguments and results, approval arguments, warning
details) stays out of the spans unless asked for: `capture_content=True`, or, when that is not
given, `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.

Many runs may share one adapter (a supervisor): the open spans are kept by run id. Starting and
ending a span only queues it for the exporter's thread, so the adapter never holds up the loop.
"""

from __future__ import annotations

import json
import time

import attrs
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from fisk_sm.events.otel_genai import (
    CAPTURE_CONTENT_ENV,
    capture_from_env,
    fail,
    output_messages,
    usage_attributes,
)
from fisk_sm.events.types import (
    ApprovalAsked,
    ApprovalDenied,
    ApprovalGranted,
    Event,
    GatedCall,
    MessageReceived,
    RunEnded,
    RunResumed,
    RunStarted,
    StateEntered,
    ToolCalled,
    ToolFinished,
    WarningRaised,
)

__all__ = ["CAPTURE_CONTENT_ENV", "OtelEvents", "OtlpExport", "otlp_export", "usage_attributes"]

#: Terminal states that are failures of the run (a suspend is not: it resumes).
FAILED_STATES = frozenset({"failed", "budget_exhausted", "iterations_exhausted"})

Attributes = dict[str, AttributeValue]
#: The events that make spans, span events or attributes (`OtelEvents.wants`).
_KINDS = frozenset(
    {
        RunResumed,
        RunStarted,
        StateEntered,
        MessageReceived,
        ToolCalled,
        ToolFinished,
        ApprovalAsked,
        ApprovalGranted,
        ApprovalDenied,
        WarningRaised,
        RunEnded,
    }
)


@attrs.define
class _Open:
    """The open spans of one run."""

    span: Span
    model: str
    call: Span | None = None
    call_left: int | None = None  # when the `call` state was left (ns), its span still open
    tools: dict[str, Span] = attrs.Factory(dict)


class OtelEvents:
    """An event sink that records runs as OpenTelemetry spans (see the module's docstring).

    `tracer_provider`: where the spans go (default: the global provider; this adapter never
    sets one). `capture_content`: put content on the spans (default: as
    `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` says, off unless "true").
    `agent_name` names the run span (`invoke_agent {agent_name}`); `provider` is
    `gen_ai.provider.name` (and the older `gen_ai.system`).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        capture_content: bool | None = None,
        agent_name: str = "fisk-sm",
        provider: str = "anthropic",
    ) -> None:
        self.tracer = trace.get_tracer("fisk_sm", tracer_provider=tracer_provider)
        self.capture_content = capture_from_env() if capture_content is None else capture_content
        self.agent_name = agent_name
        self.provider = provider
        self._runs: dict[str, _Open] = {}
        self._resumed: dict[str, RunResumed] = {}

    def wants(self, kind: type[Event]) -> bool:
        """The kinds that make spans, span events or attributes."""
        return kind in _KINDS

    def emit(self, event: Event) -> None:
        """Open, annotate or end the spans `event` stands for."""
        if type(event) not in _KINDS:  # exactly these types (a subclass is not one of them)
            return
        # A match, not a table of handlers: each case narrows `event` for its handler.
        match event:
            case StateEntered():
                self._state_entered(event)
            case MessageReceived():
                self._message_received(event)
            case ToolCalled():
                self._tool_called(event)
            case ToolFinished():
                self._tool_finished(event)
            case GatedCall():
                self._gated(event)
            case WarningRaised():
                self._warning(event)
            case RunResumed():
                self._run_resumed(event)
            case RunStarted():
                self._run_started(event)
            case RunEnded():
                self._run_ended(event)

    def open_runs(self) -> list[str]:
        """The runs whose span is open (started, not ended)."""
        return list(self._runs)

    def close(self) -> None:
        """End the spans of every run still open (the process is stopping under them)."""
        for run_id in list(self._runs):
            self._end_run(run_id, "interrupted", "the process stopped during the run")

    # -- spans ---------------------------------------------------------------------------

    def _common(self, operation: str, run_id: str) -> Attributes:
        return {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": self.provider,
            "gen_ai.system": self.provider,
            "gen_ai.conversation.id": run_id,
        }

    def _child(self, opened: _Open, name: str, kind: SpanKind, attributes: Attributes) -> Span:
        context = trace.set_span_in_context(opened.span)
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    def _run_resumed(self, event: RunResumed) -> None:
        self._resumed[event.run_id] = event  # RunStarted follows when the run is driven

    def _run_started(self, event: RunStarted) -> None:
        if event.run_id in self._runs:  # started again without an end: close the old one
            self._end_run(event.run_id, "interrupted", "the run was started again")
        attributes = {
            **self._common("invoke_agent", event.run_id),
            "gen_ai.agent.name": self.agent_name,
            "gen_ai.request.model": event.model,
            "fisk_sm.tools": list(event.tools),
            "fisk_sm.thinking": event.thinking,
            "fisk_sm.resumed": event.resumed,
        }
        resumed = self._resumed.pop(event.run_id, None)
        if resumed is not None:
            attributes["fisk_sm.resumed.state"] = resumed.state
            attributes["fisk_sm.resumed.iteration"] = resumed.iteration
        span = self.tracer.start_span(
            f"invoke_agent {self.agent_name}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._runs[event.run_id] = _Open(span, event.model)

    def _state_entered(self, event: StateEntered) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None:
            return
        now = time.time_ns()
        found: dict[str, str | int | None] = {
            "fisk_sm.state": event.state,
            "fisk_sm.iteration": event.iteration,
            "fisk_sm.source": event.source,
            "fisk_sm.trigger": event.trigger,
            "fisk_sm.guard": event.guard,
        }
        details: Attributes = {k: v for k, v in found.items() if v is not None}
        opened.span.add_event("state_entered", details, timestamp=now)
        if event.source == "call" and opened.call is not None:
            opened.call_left = now
        if event.state == "call":
            if opened.call is not None:  # pragma: no cover - a call is always left first
                opened.call.end(end_time=opened.call_left or now)
            attributes = {
                **self._common("chat", event.run_id),
                "gen_ai.request.model": opened.model,
                "fisk_sm.iteration": event.iteration + 1,
            }
            opened.call = self._child(opened, f"chat {opened.model}", SpanKind.CLIENT, attributes)
            opened.call_left = None

    def _message_received(self, event: MessageReceived) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None or opened.call is None:
            return
        span, end = opened.call, opened.call_left
        span.set_attributes(usage_attributes(event.usage))
        if event.stop_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [event.stop_reason])
        if self.capture_content:
            span.set_attribute(
                "gen_ai.output.messages", output_messages(event.text, event.stop_reason)
            )
        span.end(end_time=end)
        opened.call = opened.call_left = None

    def _tool_called(self, event: ToolCalled) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None:
            return
        attributes = {
            **self._common("execute_tool", event.run_id),
            "gen_ai.tool.name": event.name,
            "gen_ai.tool.call.id": event.tool_use_id,
        }
        if event.tool_kind:
            attributes["fisk_sm.tool.kind"] = event.tool_kind
        if event.agent:
            attributes["fisk_sm.tool.agent"] = event.agent
        if self.capture_content:
            arguments = json.dumps(event.input, ensure_ascii=False, default=str)
            attributes["gen_ai.tool.call.arguments"] = arguments
        name = f"execute_tool {event.name}"
        opened.tools[event.tool_use_id] = self._child(opened, name, SpanKind.INTERNAL, attributes)

    def _tool_finished(self, event: ToolFinished) -> None:
        opened = self._runs.get(event.run_id)
        span = None if opened is None else opened.tools.pop(event.tool_use_id, None)
        if span is None:
            return
        if self.capture_content:
            span.set_attribute("gen_ai.tool.call.result", event.output)
        if event.is_error:
            fail(span, "tool_error", "the tool returned an error")
        span.end()

    def _gated(self, event: GatedCall) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None:
            return
        details: Attributes = {
            "gen_ai.tool.name": event.tool,
            "gen_ai.tool.call.id": event.tool_use_id,
            "fisk_sm.tag": event.tag,
        }
        if isinstance(event, ApprovalGranted):
            details["fisk_sm.answer"] = event.answer
        elif isinstance(event, ApprovalDenied):
            details["fisk_sm.reason"] = event.reason
        if self.capture_content:
            details["gen_ai.tool.call.arguments"] = json.dumps(
                event.arguments, ensure_ascii=False, default=str
            )
        opened.span.add_event(event.kind, details)

    def _warning(self, event: WarningRaised) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None:
            return
        details: Attributes = {"fisk_sm.warning": event.warning}
        if event.name:
            details["fisk_sm.name"] = event.name
        if self.capture_content and event.detail:
            details["fisk_sm.detail"] = event.detail
        opened.span.add_event("warning", details)

    def _run_ended(self, event: RunEnded) -> None:
        opened = self._runs.get(event.run_id)
        if opened is None:
            return
        span = opened.span
        span.set_attributes(usage_attributes(event.usage))
        span.set_attributes(
            {
                "fisk_sm.state": event.state,
                "fisk_sm.iterations": event.iteration,
                "fisk_sm.llm_calls": event.llm_calls,
                "fisk_sm.tool_calls": event.tool_calls,
            }
        )
        if self.capture_content and event.answer:
            span.set_attribute("gen_ai.output.messages", output_messages(event.answer, None))
        if event.state in FAILED_STATES:
            fail(span, event.state, event.message)
        cut = "cancelled" if event.state == "suspended" else event.state
        self._end_run(event.run_id, cut, event.message)

    def _end_run(self, run_id: str, error_type: str, message: str | None) -> None:
        """End the run's span, and first any call or tool span still open under it."""
        opened = self._runs.pop(run_id)
        self._resumed.pop(run_id, None)
        if opened.call is not None:
            fail(opened.call, error_type, message or "the call got no reply")
            opened.call.end(end_time=opened.call_left)
        for span in opened.tools.values():
            fail(span, error_type, message or "the tool did not finish")
            span.end()
        if error_type == "interrupted":
            fail(opened.span, error_type, message)
        opened.span.end()


@attrs.define
class OtlpExport:
    """What the command line exports through: a provider of its own, and the adapter on it."""

    provider: TracerProvider
    events: OtelEvents

    def shutdown(self) -> None:
        """End the spans of runs still open, then export what is queued and stop (blocks)."""
        self.events.close()
        self.provider.shutdown()


def otlp_export(
    *,
    capture_content: bool | None = None,
    agent_name: str = "fisk-sm",
    provider: str = "anthropic",
) -> OtlpExport:
    """A provider exporting over OTLP/HTTP in batches, configured by the standard environment
    (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `..._HEADERS`,
    `..._TIMEOUT`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`; the service is "fisk-sm"
    unless they name one), and an `OtelEvents` on it. The global provider is left alone."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "fisk-sm"}))
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    events = OtelEvents(
        tracer_provider,
        capture_content=capture_content,
        agent_name=agent_name,
        provider=provider,
    )
    return OtlpExport(tracer_provider, events)

"""What the OpenTelemetry GenAI semantic conventions put on a span, for `fisk_sm.events.otel`.

The attributes' names and shapes, kept apart from the adapter that decides which span carries
them: the usage counts, the output messages' JSON, a failure's `error.type` and status, and the
convention's opt-in for content.

`gen_ai.usage.input_tokens` counts every input token, the cached ones included, as the
convention says; `gen_ai.usage.cache_read.input_tokens` and
`gen_ai.usage.cache_creation.input_tokens` are its cached parts (Anthropic's own
`input_tokens` leaves them out).
"""

from __future__ import annotations

import json
import os

from opentelemetry.trace import Span, Status, StatusCode

from fisk_sm.events.usage import Usage

__all__ = ["CAPTURE_CONTENT_ENV", "capture_from_env", "fail", "output_messages", "usage_attributes"]

#: The convention's opt-in for content on spans.
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def usage_attributes(usage: Usage) -> dict[str, int]:
    """The `gen_ai.usage.*` attributes of `usage`: input counts the cached tiers too."""
    cached = usage.cache_read_tokens + usage.cache_create_tokens
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens + cached,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_create_tokens,
    }


def capture_from_env() -> bool:
    """Whether the environment opts in to content on spans (`CAPTURE_CONTENT_ENV` is "true")."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def output_messages(text: str, finish_reason: str | None) -> str:
    """`gen_ai.output.messages` in the convention's JSON shape: one assistant text message."""
    message: dict[str, object] = {
        "role": "assistant",
        "parts": [{"type": "text", "content": text}],
    }
    if finish_reason:
        message["finish_reason"] = finish_reason
    return json.dumps([message], ensure_ascii=False)


def fail(span: Span, error_type: str, description: str | None) -> None:
    """Mark `span` failed: `error.type` and an error status (its description, else the type)."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, description or error_type))

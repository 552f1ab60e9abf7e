"""The schemas of the control API's OpenAPI document (`fisk_sm.supervisor.api.openapi`): the
Run, its approval, the bodies the POSTs take and the events the stream sends."""

from __future__ import annotations

from typing import Any

from fisk_sm.supervisor.interface import STATUSES

__all__ = ["SCHEMAS", "STR", "ref"]

STR = {"type": "string"}
_INT = {"type": "integer"}


def ref(name: str) -> dict[str, str]:
    """A reference to the schema `name`."""
    return {"$ref": f"#/components/schemas/{name}"}


# A prompt or follow-up: not empty, not only blanks (the server refuses those).
_TEXT = {"type": "string", "minLength": 1, "pattern": "\\S"}

_RUN_FIELDS: tuple[str, ...] = ("run_id", "name", "state", "status", "iteration", "tokens")
_RUN_FIELDS += ("created", "age_seconds", "approval", "outcome", "answer")
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": {"type": "string", "pattern": "^[^\\n\\r]*$"}},
        "description": "one line, naming the field, id or header at fault",
    },
    "Empty": {
        "type": "object",
        "description": "no fields yet: send {} (a POST always has a JSON body)",
    },
    "Tokens": {
        "type": "object",
        "required": ["input", "output", "cache_read", "cache_creation", "total"],
        "properties": {
            k: _INT for k in ("input", "output", "cache_read", "cache_creation", "total")
        },
    },
    "Approval": {
        "type": "object",
        "required": ["run_id", "tool_use_id", "tool", "input", "tag"],
        "properties": {
            "run_id": STR,
            "tool_use_id": STR,
            "tool": STR,
            "input": {"type": "object"},
            "tag": STR,
        },
    },
    "Run": {
        "type": "object",
        "required": list(_RUN_FIELDS),
        "properties": {
            "run_id": STR,
            "name": STR,
            "state": {"type": "string", "description": "the loop state (states/agent_loop.yaml)"},
            "status": {"type": "string", "enum": list(STATUSES)},
            "iteration": _INT,
            "tokens": ref("Tokens"),
            "created": {"type": "string", "format": "date-time"},
            "age_seconds": {"type": "number"},
            "approval": {"oneOf": [{"type": "null"}, ref("Approval")]},
            "outcome": {"type": ["string", "null"]},
            "answer": STR,
            "owner": {
                "type": "string",
                "description": "the supervisor that drives the run, or drove it to its end"
                " (with --nats); optional",
            },
        },
    },
    "Entry": {
        "type": "object",
        "required": ["role", "kind", "text"],
        "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "kind": {"type": "string", "enum": ["text", "thinking", "tool_use", "tool_result"]},
            "text": STR,
            "name": STR,
            "is_error": {"type": "boolean"},
        },
    },
    "RunDetail": {
        "allOf": [
            ref("Run"),
            {
                "type": "object",
                "required": ["transcript", "path"],
                "properties": {
                    "transcript": {"type": "array", "items": ref("Entry"), "maxItems": 50},
                    "path": {"type": "array", "items": STR},
                },
            },
        ]
    },
    "Submit": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {**_TEXT, "description": "the first user message (not blank)"},
            "name": {
                "type": ["string", "null"],
                "description": "a label (default, or null: the run id)",
            },
            "config": {
                "type": ["string", "null"],
                "description": "another agent.yaml on the server, in an allowed directory"
                " (supervise --config-dir); another is refused (400). Default, or null: the"
                " supervisor's own",
            },
            "chat": {"type": "boolean", "description": "wait for a follow-up after each answer"},
        },
    },
    "Say": {
        "type": "object",
        "required": ["text"],
        "properties": {"text": {**_TEXT, "description": "the follow-up prompt (not blank)"}},
    },
    "Answer": {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "string", "enum": ["once", "always", "deny"]}},
    },
    "EventsGap": {
        "type": "object",
        "description": "the data of the first event of a resumed stream when events after"
        " the given id are lost (no longer held, or another boot's): reload the runs and"
        " approvals",
        "required": ["type", "last_event_id", "reason"],
        "properties": {
            "type": {"const": "EventsGap"},
            "last_event_id": {"type": "string", "description": "the id the reader gave"},
            "reason": {"type": "string", "description": "one line"},
        },
    },
}

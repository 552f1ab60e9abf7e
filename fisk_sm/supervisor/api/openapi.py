"""The OpenAPI 3.1 document of the control API, written by hand next to the routes it describes
(`fisk_sm.supervisor.api.app`); a test checks that every route is in it and that it validates.

It is meant to be true (tests/test_api_schemathesis.py runs schemathesis against a live
supervisor): every status an operation can answer is listed, the middlewares' too (401, 403,
405 with `Allow`, 413, 415, 421), each with the one-line `{"error": ...}` body; the text fields
state what the server refuses (a blank prompt); the Run a POST or GET answers links to every
operation on that run (and the pending approvals to answering the first), so a client, or a
stateful test, can follow the run it made."""

from __future__ import annotations

from typing import Any

from fisk_sm.supervisor.api.openapi_schemas import SCHEMAS, STR, ref

__all__ = ["openapi_document"]


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"$ref": f"#/components/responses/E{code}"} for code in codes}


# What any request can get, whatever its route: a wrong token (401), a method the path does not
# take (405, with Allow), a body over the size cap (413), a Host header not allowed (421).
_ANY = (401, 405, 413, 421)
# What any POST can also get: a bad body (400), a cross-site Origin (403), a body that is not
# application/json (415).
_POST = (400, 401, 403, 405, 413, 415, 421)


_RUN_ID = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-zA-Z0-9][a-zA-Z0-9_-]*$", "maxLength": 128},
}

_RESPONSES: dict[str, Any] = {
    f"E{code}": _json(ref("Error"), text)
    for code, text in {
        400: "bad input: the body (not a JSON object, too deep, a lone surrogate), a field"
        " (a config outside the allowed directories too) or an id; the message names it",
        401: "no token, or a wrong one (only when the supervisor has a token)",
        403: "a cross-origin request (its Origin is not the API's own)",
        404: "no such run or approval",
        405: "the path does not take this method (Allow lists the ones it takes)",
        409: "the run is in the wrong state for this (or the approval is already answered)",
        413: "the body is larger than the limit",
        415: "the body is not application/json",
        421: "the Host header is not one this supervisor answers to",
        501: "the shipped SVG is not of the table in use, and pygraphviz is not installed",
    }.items()
}
_RESPONSES["E405"]["headers"] = {
    "Allow": {
        "description": "the methods the path takes",
        "required": True,
        "schema": {"type": "string"},
    }
}

#: From the new run (201) to every operation on it, so a client (and a stateful test) can
#: follow the run it made.
_RUN_LINKS = {
    f"{op}": {"operationId": op, "parameters": {"run_id": "$response.body#/run_id"}}
    for op in (
        "showRun",
        "runDiagram",
        "suspendRun",
        "resumeRun",
        "abortRun",
        "sayToRun",
        "endRun",
    )
} | {"events": {"operationId": "events", "parameters": {"run": "$response.body#/run_id"}}}
#: A run shown again may be parked: on to answering its approval.
_DETAIL_LINKS = _RUN_LINKS | {
    "answerApproval": {
        "operationId": "answerApproval",
        "parameters": {
            "run_id": "$response.body#/run_id",
            "tool_use_id": "$response.body#/approval/tool_use_id",
        },
    },
}


#: From the pending approvals to answering the first of them.
_FIRST_APPROVAL = {
    "answerFirst": {
        "operationId": "answerApproval",
        "parameters": {
            "run_id": "$response.body#/approvals/0/run_id",
            "tool_use_id": "$response.body#/approvals/0/tool_use_id",
        },
    }
}


def _run(description: str) -> dict[str, Any]:
    """A Run response, with links to the operations on that run."""
    return {**_json(ref("Run"), description), "links": _RUN_LINKS}


def _action(verb: str, summary: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"{verb}Run",
            "summary": summary,
            "parameters": [_RUN_ID],
            "requestBody": {"required": True, **_json(ref("Empty"), "{}")},
            "responses": {"202": _run("the run"), **_errors(*_POST, 404, 409)},
        }
    }


#: An event's id, `<boot>-<seq>` (empty: none).
_EVENT_ID: dict[str, Any] = {"type": "string", "pattern": "^([0-9a-fA-F]{1,64}-[0-9]{1,19})?$"}

_PATHS: dict[str, Any] = {
    "/": {
        "get": {
            "operationId": "dashboard",
            "summary": "the live dashboard (one self-contained HTML page)",
            "parameters": [{"name": "token", "in": "query", "schema": STR}],
            "responses": {
                "200": {"description": "the page", "content": {"text/html": {"schema": STR}}},
                **_errors(*_ANY),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "this document",
            "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1"), **_errors(*_ANY)},
        }
    },
    "/api/runs": {
        "post": {
            "operationId": "submitRun",
            "summary": "start a checkpointed run on a prompt",
            "requestBody": {"required": True, **_json(ref("Submit"), "the run to start")},
            "responses": {"201": _run("the new run"), **_errors(*_POST, 409)},
        },
        "get": {
            "operationId": "listRuns",
            "summary": "every run, newest first",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["runs"],
                        "properties": {"runs": {"type": "array", "items": ref("Run")}},
                    },
                    "the runs",
                ),
                **_errors(*_ANY),
            },
        },
    },
    "/api/runs/{run_id}": {
        "get": {
            "operationId": "showRun",
            "summary": "a run, its transcript's last 50 entries and the states it entered",
            "parameters": [_RUN_ID],
            "responses": {
                "200": {**_json(ref("RunDetail"), "the run"), "links": _DETAIL_LINKS},
                **_errors(400, *_ANY, 404),
            },
        }
    },
    "/api/runs/{run_id}/diagram.svg": {
        "get": {
            "operationId": "runDiagram",
            "summary": "the loop diagram with the run's path and current state",
            "parameters": [_RUN_ID],
            "responses": {
                "200": {
                    "description": "SVG",
                    "content": {"image/svg+xml": {"schema": STR}},
                },
                **_errors(400, *_ANY, 404, 501),
            },
        }
    },
    "/api/runs/{run_id}/suspend": _action("suspend", "suspend now (a restart leaves it)"),
    "/api/runs/{run_id}/resume": _action("resume", "resume a suspended or parked run"),
    "/api/runs/{run_id}/abort": _action("abort", "stop a run for good"),
    "/api/runs/{run_id}/end": _action(
        "end", "end a chat as completed, at its prompt (mid-turn: at its next one)"
    ),
    "/api/runs/{run_id}/say": {
        "post": {
            "operationId": "sayToRun",
            "summary": "post a follow-up to a chat run waiting for input (awaiting_input)",
            "parameters": [_RUN_ID],
            "requestBody": {"required": True, **_json(ref("Say"), "the follow-up")},
            "responses": {"202": _run("the run"), **_errors(*_POST, 404, 409)},
        }
    },
    "/api/approvals": {
        "get": {
            "operationId": "listApprovals",
            "summary": "the pending approvals",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["approvals"],
                        "properties": {"approvals": {"type": "array", "items": ref("Approval")}},
                    },
                    "the approvals",
                )
                | {"links": _FIRST_APPROVAL},
                **_errors(*_ANY),
            },
        }
    },
    "/api/runs/{run_id}/approvals/{tool_use_id}": {
        "post": {
            "operationId": "answerApproval",
            "summary": "answer a pending approval (a parked session is resumed)",
            "parameters": [
                _RUN_ID,
                {"name": "tool_use_id", "in": "path", "required": True, "schema": STR},
            ],
            "requestBody": {"required": True, **_json(ref("Answer"), "the answer")},
            "responses": {"200": _json(ref("Run"), "the run"), **_errors(*_POST, 404, 409)},
        }
    },
    "/api/events": {
        "get": {
            "operationId": "events",
            "summary": "every typed event as Server-Sent Events (`event:` the class name,"
            " `data:` JSON with `type` and `run_id`), plus RunSubmitted, RunParked and"
            " RunUpdated (data: the Run) and EventsDropped (a slow reader missed some);"
            " each with `id: <boot>-<seq>`. A reader that reconnects with the last id it got"
            " (Last-Event-ID, or last_event_id) first gets the events it missed, from the"
            " last 4096 held (`supervise --event-buffer`); if some are no longer held, or the"
            " id is of another boot, it gets EventsGap instead (data: type, last_event_id,"
            " reason): reload the runs and approvals. EventsDropped means the same.",
            "parameters": [
                {"name": "run", "in": "query", "schema": STR, "description": "one run only"},
                {"name": "token", "in": "query", "schema": STR},
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "schema": _EVENT_ID,
                    "description": "resume after this event (what an EventSource sends)",
                },
                {
                    "name": "last_event_id",
                    "in": "query",
                    "schema": _EVENT_ID,
                    "description": "resume after this event (for clients that cannot set"
                    " the header; the header wins)",
                },
            ],
            "responses": {
                "200": {
                    "description": "the stream",
                    "content": {"text/event-stream": {"schema": STR}},
                },
                **_errors(400, *_ANY, 404),
            },
        }
    },
}


def openapi_document() -> dict[str, Any]:
    """The control API as an OpenAPI 3.1 document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fisk-sm supervisor",
            "version": "1",
            "description": "Control many checkpointed agent runs: submit, watch, suspend,"
            " resume, abort, and answer approvals.",
        },
        "paths": _PATHS,
        "components": {
            "schemas": SCHEMAS,
            "responses": _RESPONSES,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }

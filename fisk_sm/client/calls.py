"""Each route of the control API as a `Call`: the request, and how its answer becomes a record.
The sync and the async client both send these, so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from fisk_sm.client.base import answer_of, json_of, listed, run_path
from fisk_sm.client.records import Approval, Run, approval_from, run_from

__all__ = [
    "Call",
    "action",
    "answer",
    "approvals",
    "diagram_svg",
    "openapi",
    "run",
    "runs",
    "say",
    "submit",
]


@attrs.frozen
class Call:
    """One request (`body` None: none; a POST always sends one) and the parse of its answer."""

    method: str
    path: str
    body: dict[str, Any] | None
    parse: Callable[[bytes], Any]


def _run(raw: bytes) -> Run:
    return run_from(json_of(raw))


def _runs(raw: bytes) -> list[Run]:
    return [run_from(r, f"runs[{i}]") for i, r in enumerate(listed(json_of(raw), "runs"))]


def _approvals(raw: bytes) -> list[Approval]:
    items = listed(json_of(raw), "approvals")
    return [approval_from(a, f"approvals[{i}]") for i, a in enumerate(items)]


def _object(raw: bytes) -> dict[str, Any]:
    value = json_of(raw)
    return value if isinstance(value, dict) else {}


def runs() -> Call:
    """GET /api/runs."""
    return Call("GET", "/api/runs", None, _runs)


def run(run_id: str) -> Call:
    """GET /api/runs/RUN."""
    return Call("GET", run_path(run_id), None, _run)


def submit(prompt: str, name: str | None, config: str | None, chat: bool) -> Call:
    """POST /api/runs."""
    body: dict[str, Any] = {"prompt": prompt}
    if name is not None:
        body["name"] = name
    if config is not None:
        body["config"] = config
    if chat:
        body["chat"] = True
    return Call("POST", "/api/runs", body, _run)


def action(run_id: str, action: str) -> Call:
    """POST /api/runs/RUN/{suspend,resume,abort,end}."""
    return Call("POST", run_path(run_id, action), {}, _run)


def say(run_id: str, text: str) -> Call:
    """POST /api/runs/RUN/say."""
    return Call("POST", run_path(run_id, "say"), {"text": text}, _run)


def approvals() -> Call:
    """GET /api/approvals."""
    return Call("GET", "/api/approvals", None, _approvals)


def answer(run_id: str, tool_use_id: str, answer: str) -> Call:
    """POST /api/runs/RUN/approvals/TOOL_USE_ID."""
    body = answer_of(answer)
    return Call("POST", run_path(run_id, "approvals", tool_use_id), body, _run)


def diagram_svg(run_id: str) -> Call:
    """GET /api/runs/RUN/diagram.svg."""
    return Call("GET", run_path(run_id, "diagram.svg"), None, lambda raw: raw.decode())


def openapi() -> Call:
    """GET /openapi.json."""
    return Call("GET", "/openapi.json", None, _object)

"""The control API: a Starlette app over a `Supervisor`, on the supervisor's own loop.

JSON in and out; errors are `{"error": "<one line>"}` with 400 (a bad body or id, naming the
field), 401 (no or a wrong token), 404 (an unknown run or approval), 409 (the wrong state for
the action). With a token set, every request needs `Authorization: Bearer TOKEN`; `GET /` and
`GET /api/events` also take `?token=TOKEN` (a page's URL, an EventSource, which cannot set
headers). The routes and their JSON are in `fisk_sm.supervisor.openapi`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fisk_sm.config.errors import ConfigError, one_line
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import InvalidIdError, check_run_id
from fisk_sm.machine.diagram import DiagramError, draw
from fisk_sm.machine.path import PathError, SessionPath, session_path
from fisk_sm.machine.table import load_table
from fisk_sm.supervisor.desk import ANSWERS
from fisk_sm.supervisor.openapi import openapi_document
from fisk_sm.supervisor.supervisor import Conflict, NotFound, Supervisor
from fisk_sm.supervisor.views import transcript

__all__ = ["DASHBOARD", "build_app"]

DASHBOARD = Path(__file__).with_name("dashboard.html")
PLACEHOLDER = (
    "<!doctype html><meta charset=utf-8><title>fisk-sm supervisor</title>"
    "<p>The dashboard is not installed; the API is at <code>/api/runs</code>.</p>"
)
#: Paths that also accept the token as `?token=`.
QUERY_TOKEN_PATHS = ("/", "/api/events")
MAX_BODY = 1 << 20


class BadRequest(ValueError):
    """A bad body, field or id (HTTP 400)."""


def error(status: int, message: str) -> JSONResponse:
    """The API's error response."""
    return JSONResponse({"error": one_line(message, 500)}, status_code=status)


class TokenGuard:
    """ASGI middleware: refuse (401) any HTTP request without the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _given(self, scope: Scope) -> bytes | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given: bytes = value[7:].strip()
                return given
        if scope.get("method") == "GET" and scope.get("path") in QUERY_TOKEN_PATHS:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if query.get("token"):
                found: str = query["token"][0]
                return found.encode()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = self._given(scope)
            if given is None or not hmac.compare_digest(given, self.token):
                response = error(401, "a valid token is required: Authorization: Bearer TOKEN")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise BadRequest(f"body: larger than {MAX_BODY} bytes")
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError as exc:
        raise BadRequest(f"body: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name}: required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name}: must be a string, not {type(value).__name__}")
    return value


def _run_id(request: Request, name: str = "run_id") -> str:
    value = str(request.path_params[name])
    try:
        return check_run_id(value)
    except InvalidIdError as exc:
        raise BadRequest(f"{name}: {exc}") from None


Handler = Callable[[Request], Awaitable[Response]]


def _errors(handler: Handler) -> Handler:
    """Map the supervisor's refusals to the API's error responses."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(400, str(exc))
        except NotFound as exc:
            return error(404, str(exc))
        except Conflict as exc:
            return error(409, str(exc))

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


def build_app(supervisor: Supervisor, token: str | None = None) -> ASGIApp:
    """The control API of `supervisor` (every route needs `token`, if given)."""

    async def submit(request: Request) -> Response:
        body = await _body(request)
        prompt = _field(body, "prompt", required=True)
        assert prompt is not None
        if not prompt.strip():
            raise BadRequest("prompt: must not be empty")
        name, config = _field(body, "name"), _field(body, "config")
        chat = body.get("chat", False)
        if not isinstance(chat, bool):
            raise BadRequest(f"chat: must be a boolean, not {type(chat).__name__}")
        try:
            start = supervisor.submit_chat if chat else supervisor.submit
            tracked = await start(prompt, name, config)
        except ConfigError as exc:  # a config that does not load
            raise BadRequest(f"config: {exc}") from None
        return JSONResponse(tracked.to_json(), status_code=201)

    async def list_runs(request: Request) -> Response:
        await supervisor.refresh()
        return JSONResponse({"runs": [t.to_json() for t in supervisor.listing()]})

    async def _path(run_id: str) -> SessionPath | None:
        try:
            records = await supervisor.records_of(run_id)
            return await asyncio.to_thread(session_path, records)
        except (PathError, OSError, ValueError, JournalError):
            return None

    async def show(request: Request) -> Response:
        run_id = _run_id(request)
        await supervisor.refresh()
        tracked = supervisor.get(run_id)
        path = await _path(run_id)
        states = list(path.states) if path is not None else list(tracked.sink.states)
        shown = {**tracked.to_json(), "transcript": transcript(tracked.messages())}
        return JSONResponse({**shown, "path": states})

    async def diagram(request: Request) -> Response:
        run_id = _run_id(request)
        supervisor.get(run_id)
        path = await _path(run_id)
        try:
            svg = await asyncio.to_thread(draw, load_table(), "svg", [path] if path else [])
        except DiagramError as exc:
            return error(501, str(exc))
        return Response(svg, media_type="image/svg+xml")

    def action(name: str) -> Handler:
        async def act(request: Request) -> Response:
            tracked = await getattr(supervisor, name)(_run_id(request))
            return JSONResponse(tracked.to_json(), status_code=202)

        act.__name__ = name
        return act

    async def approvals(request: Request) -> Response:
        await supervisor.refresh()
        return JSONResponse({"approvals": supervisor.approvals()})

    async def answer(request: Request) -> Response:
        run_id = _run_id(request)
        tool_use_id = str(request.path_params["tool_use_id"])
        body = await _body(request)
        given = _field(body, "answer", required=True)
        approval = ANSWERS.get(given or "")
        if approval is None:
            raise BadRequest(f"answer: must be one of once, always, deny; not {given!r}")
        tracked = await supervisor.answer(run_id, tool_use_id, approval)
        return JSONResponse(tracked.to_json())

    async def say(request: Request) -> Response:
        run_id = _run_id(request)
        text = _field(await _body(request), "text", required=True)
        if not (text or "").strip():
            raise BadRequest("text: must not be empty")
        assert text is not None
        return JSONResponse((await supervisor.say(run_id, text)).to_json(), status_code=202)

    async def events(request: Request) -> Response:
        run_id = request.query_params.get("run")
        if run_id is not None:
            try:
                check_run_id(run_id)
            except InvalidIdError as exc:
                raise BadRequest(f"run: {exc}") from None
            supervisor.get(run_id)
        subscriber = supervisor.hub.subscribe(run_id)

        async def stream() -> AsyncIterator[dict[str, str]]:
            try:
                async for name, data in subscriber.items():
                    yield {"event": name, "data": data}
            finally:
                supervisor.hub.unsubscribe(subscriber)

        return EventSourceResponse(stream(), ping=15)

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def dashboard(request: Request) -> Response:
        try:
            page = await asyncio.to_thread(DASHBOARD.read_text, encoding="utf-8")
        except FileNotFoundError:
            page = PLACEHOLDER
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    routes = [
        Route("/", _errors(dashboard), methods=["GET"]),
        Route("/openapi.json", _errors(openapi), methods=["GET"]),
        Route("/api/runs", _errors(submit), methods=["POST"]),
        Route("/api/runs", _errors(list_runs), methods=["GET"]),
        Route("/api/runs/{run_id}", _errors(show), methods=["GET"]),
        Route("/api/runs/{run_id}/diagram.svg", _errors(diagram), methods=["GET"]),
        Route("/api/runs/{run_id}/suspend", _errors(action("suspend")), methods=["POST"]),
        Route("/api/runs/{run_id}/resume", _errors(action("resume")), methods=["POST"]),
        Route("/api/runs/{run_id}/abort", _errors(action("abort")), methods=["POST"]),
        Route("/api/runs/{run_id}/say", _errors(say), methods=["POST"]),
        Route("/api/approvals", _errors(approvals), methods=["GET"]),
        Route("/api/runs/{run_id}/approvals/{tool_use_id}", _errors(answer), methods=["POST"]),
        Route("/api/events", _errors(events), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
    return TokenGuard(app, token) if token else app


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(404, f"no route {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error(405, f"{request.method} is not allowed on {request.url.path}")

"""The control API: a Starlette app over a `Supervisor`, on the supervisor's own loop.

JSON in and out; errors are `{"error": "<one line>"}` with 400 (a bad body or id, naming the
field), 401 (no or a wrong token), 403 (a cross-origin POST), 404 (an unknown run or approval),
409 (the wrong state for the action), 413 (a body over `MAX_BODY`), 415 (a POST that is not
`application/json`), 421 (a `Host` the API is not served under). With a token set, every
request needs `Authorization: Bearer TOKEN`; `GET /` and `GET /api/events` also take
`?token=TOKEN` (a page's URL, an EventSource, which cannot set headers). The defences are the
middlewares of `fisk_sm.supervisor.api.security`; the routes and their JSON are in
`fisk_sm.supervisor.api.openapi`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fisk_sm.config.errors import ConfigError, one_line
from fisk_sm.config.text import UnencodableText
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import InvalidIdError, check_run_id
from fisk_sm.machine.diagram import DiagramError, draw
from fisk_sm.machine.path import PathError, SessionPath, session_path
from fisk_sm.machine.table import load_table
from fisk_sm.operator.sanitize import say as log_line
from fisk_sm.supervisor.api.bodies import BadRequest, field, read_object
from fisk_sm.supervisor.api.methods import MethodGuard, allowed_methods, not_allowed
from fisk_sm.supervisor.api.openapi import openapi_document
from fisk_sm.supervisor.api.page import DASHBOARD, Page, load_page
from fisk_sm.supervisor.api.security import (
    LOOPBACK_NAMES,
    BodyLimit,
    HostGuard,
    HttpOnly,
    JsonOnly,
    OriginGuard,
    SecurityHeaders,
    TokenGuard,
)
from fisk_sm.supervisor.confine import ConfigDirs, NotAllowed
from fisk_sm.supervisor.desk import ANSWERS
from fisk_sm.supervisor.ending import end_chat
from fisk_sm.supervisor.supervisor import Conflict, NotFound, Supervisor
from fisk_sm.supervisor.view.hub import EventHub, Subscriber, parse_event_id
from fisk_sm.supervisor.view.rows import transcript

__all__ = ["DASHBOARD", "MAX_BODY", "ControlApp", "TokenGuard", "build_app", "error"]

MAX_BODY = 1 << 20
#: The hosts of an app built without them (in-process use): the loopback names, any port.
ANY_LOOPBACK = tuple(f"{name}:*" for name in LOOPBACK_NAMES)


def error(status: int, message: str) -> Response:
    """The API's error response (ASCII JSON: a message never fails to encode)."""
    body = json.dumps({"error": one_line(message, 500)})
    return Response(body, status_code=status, media_type="application/json")


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
        except (BadRequest, UnencodableText) as exc:  # the body check refuses the latter first
            return error(400, str(exc))
        except NotFound as exc:
            return error(404, str(exc))
        except Conflict as exc:
            return error(409, str(exc))

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


class ControlApp(Starlette):
    """The API's Starlette app, with `SecurityHeaders` outside everything (500s included) and
    `HttpOnly` outside that (no WebSocket reaches a route)."""

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, wrapped in `SecurityHeaders`, then `HttpOnly`."""
        return HttpOnly(SecurityHeaders(super().build_middleware_stack()))


class EventStream(EventSourceResponse):
    """The event stream of `hub` (one run's, or all), each event with its `id:`, after the
    held events that came `after` the given id (or a gap note): subscribed only while the
    response runs, and unsubscribed however it ends. (Subscribing in the handler leaked the
    subscriber of a `HEAD`, which sse_starlette answers without ever starting the stream.)"""

    def __init__(self, hub: EventHub, run_id: str | None, after: str | None = None) -> None:
        self.hub, self.run_id, self.after = hub, run_id, after
        self.subscriber: Subscriber | None = None
        super().__init__(self._items(), ping=15)

    async def _items(self) -> AsyncIterator[dict[str, str]]:
        assert self.subscriber is not None  # set by __call__ before the stream starts
        async for seq, name, data in self.subscriber.items():
            yield {"id": self.hub.event_id(seq), "event": name, "data": data}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Subscribe, answer, unsubscribe (a client gone, a HEAD, the hub closed)."""
        self.subscriber = self.hub.subscribe(self.run_id, self.after)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hub.unsubscribe(self.subscriber)


def _last_event_id(request: Request) -> str | None:
    """The id a reconnecting reader got last: the `Last-Event-ID` header (an EventSource's),
    else the `last_event_id` query parameter; empty is none (what EventSource sends before
    any id); not `<hex>-<int>` is a BadRequest naming where it came from."""
    for where, value in (
        ("Last-Event-ID", request.headers.get("last-event-id")),
        ("last_event_id", request.query_params.get("last_event_id")),
    ):
        if value:
            if parse_event_id(value) is None:
                raise BadRequest(f"{where}: not an event id (<hex>-<number>): {value[:80]!r}")
            return value
    return None


def build_app(
    supervisor: Supervisor,
    token: str | None = None,
    *,
    hosts: Iterable[str] = ANY_LOOPBACK,
    config_dirs: ConfigDirs | None = None,
    event_buffer: int | None = None,
) -> ControlApp:
    """The control API of `supervisor`: served under `hosts` (`host:port` forms, `host:*` for
    any port), every route needing `token` if given, the last `event_buffer` events held for
    readers that reconnect (default: the hub's), run configs confined to `config_dirs`
    (default: the directory of the supervisor's agent.yaml)."""
    dirs = config_dirs
    if event_buffer is not None:
        supervisor.hub.resize(event_buffer)

    async def confined(text: str) -> str:
        nonlocal dirs
        if dirs is None:
            dirs = await asyncio.to_thread(ConfigDirs.of, supervisor.config.path)
        try:
            return str(await asyncio.to_thread(dirs.confine, text))
        except NotAllowed:
            raise BadRequest("config: not an allowed config file") from None

    async def submit(request: Request) -> Response:
        body = await read_object(request)
        prompt = field(body, "prompt", required=True)
        assert prompt is not None
        if not prompt.strip():
            raise BadRequest("prompt: must not be empty")
        name, config = field(body, "name"), field(body, "config")
        chat = body.get("chat", False)
        if not isinstance(chat, bool):
            raise BadRequest(f"chat: must be a boolean, not {type(chat).__name__}")
        path = await confined(config) if config else None
        try:
            start = supervisor.submit_chat if chat else supervisor.submit
            tracked = await start(prompt, name, path)
        except ConfigError as exc:  # its message may quote the file: for the log only
            log_line(f"fisk-sm supervise: POST /api/runs: {exc}")
            raise BadRequest("config: does not load (see the supervisor's log)") from None
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
            run_id = _run_id(request)
            await read_object(request)  # {}: no fields yet, but a POST has a JSON body
            tracked = await getattr(supervisor, name)(run_id)
            return JSONResponse(tracked.to_json(), status_code=202)

        act.__name__ = name
        return act

    async def approvals(request: Request) -> Response:
        await supervisor.refresh()
        return JSONResponse({"approvals": supervisor.approvals()})

    async def answer(request: Request) -> Response:
        run_id = _run_id(request)
        tool_use_id = str(request.path_params["tool_use_id"])
        body = await read_object(request)
        given = field(body, "answer", required=True)
        approval = ANSWERS.get(given or "")
        if approval is None:
            raise BadRequest(f"answer: must be one of once, always, deny; not {given!r}")
        tracked = await supervisor.answer(run_id, tool_use_id, approval)
        return JSONResponse(tracked.to_json())

    async def say(request: Request) -> Response:
        run_id = _run_id(request)
        text = field(await read_object(request), "text", required=True)
        if not (text or "").strip():
            raise BadRequest("text: must not be empty")
        assert text is not None
        return JSONResponse((await supervisor.say(run_id, text)).to_json(), status_code=202)

    async def end(request: Request) -> Response:
        run_id = _run_id(request)
        await read_object(request)  # {} like the other actions
        tracked = end_chat(supervisor.get(run_id))  # it ends at its (next) prompt
        return JSONResponse(tracked.to_json(), status_code=202)

    async def events(request: Request) -> Response:
        run_id = request.query_params.get("run")
        if run_id is not None:
            try:
                check_run_id(run_id)
            except InvalidIdError as exc:
                raise BadRequest(f"run: {exc}") from None
            supervisor.get(run_id)
        return EventStream(supervisor.hub, run_id, _last_event_id(request))

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    page: Page | None = None

    async def dashboard(request: Request) -> Response:
        nonlocal page
        if page is None:
            page = await asyncio.to_thread(load_page)
        headers = {"Cache-Control": "no-store", "Content-Security-Policy": page.csp}
        return HTMLResponse(page.html, headers=headers)

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
        Route("/api/runs/{run_id}/end", _errors(end), methods=["POST"]),
        Route("/api/approvals", _errors(approvals), methods=["GET"]),
        Route("/api/runs/{run_id}/approvals/{tool_use_id}", _errors(answer), methods=["POST"]),
        Route("/api/events", _errors(events), methods=["GET"]),
    ]
    middleware = [
        Middleware(HostGuard, allowed=hosts),
        # the token right after Host: without it a client learns nothing (not even the routes)
        *([Middleware(TokenGuard, token=token)] if token else []),
        Middleware(MethodGuard, routes=routes),  # 405 before the checks of a POST's body
        Middleware(OriginGuard),
        Middleware(JsonOnly),
        Middleware(BodyLimit, limit=MAX_BODY),
    ]
    handlers = {404: _not_found, 405: _not_allowed, Exception: _failed}
    app = ControlApp(routes=routes, middleware=middleware, exception_handlers=handlers)
    app.router.redirect_slashes = False  # no redirect built from the request's Host
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(404, f"no route {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    """405 with `Allow` (`MethodGuard` answers first; this is the router's own)."""
    allowed = allowed_methods(request.app.router.routes, request.scope)
    return not_allowed(request.method, request.url.path, allowed)


async def _failed(request: Request, exc: Exception) -> Response:
    """The last resort: an unexpected error is a 500 with one line (uvicorn logs the trace)."""
    return error(500, "internal error (see the supervisor's log)")

"""The control API: a Starlette app over a `HostControl` (`fisk_sm.supervisor.interface`), on
the host's own loop. It checks each request, calls the host, and shapes the JSON; it reaches
nothing else of the supervisor (tests/test_layers.py).

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
from fisk_sm.journal.filestore import InvalidIdError, check_run_id
from fisk_sm.machine.diagram import DiagramError, draw
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
from fisk_sm.supervisor.errors import Conflict, NotFound
from fisk_sm.supervisor.interface import (
    ANSWER_NAMES,
    Action,
    Controllable,
    EventFeed,
    HostControl,
    SubmitRequest,
    Subscription,
    approval_json,
    parse_event_id,
)

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
    """The event stream of `feed` (one run's, or all), each event with its `id:`, after the
    held events that came `after` the given id (or a gap note): subscribed only while the
    response runs, and unsubscribed however it ends. (Subscribing in the handler leaked the
    subscriber of a `HEAD`, which sse_starlette answers without ever starting the stream.)"""

    def __init__(self, feed: EventFeed, run_id: str | None, after: str | None = None) -> None:
        self.feed, self.run_id, self.after = feed, run_id, after
        self.subscription: Subscription | None = None
        super().__init__(self._items(), ping=15)

    async def _items(self) -> AsyncIterator[dict[str, str]]:
        assert self.subscription is not None  # set by __call__ before the stream starts
        async for event_id, name, data in self.subscription.events():
            yield {"id": event_id, "event": name, "data": data}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Subscribe, answer, unsubscribe (a client gone, a HEAD, the feed closed)."""
        self.subscription = self.feed.subscribe(self.run_id, self.after)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.feed.unsubscribe(self.subscription)


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
    host: HostControl | Controllable,
    token: str | None = None,
    *,
    hosts: Iterable[str] = ANY_LOOPBACK,
    config_dirs: ConfigDirs | None = None,
) -> ControlApp:
    """The control API of `host` (a `HostControl`, or what hands one out: a `Supervisor`):
    served under `hosts` (`host:port` forms, `host:*` for any port), every route needing
    `token` if given, run configs confined to `config_dirs` (default: the directory of the
    host's agent.yaml)."""
    control = host.control() if isinstance(host, Controllable) else host
    dirs = config_dirs

    async def confined(text: str) -> str:
        nonlocal dirs
        if dirs is None:
            dirs = await asyncio.to_thread(ConfigDirs.of, control.config_path)
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
            row = await control.submit(SubmitRequest(prompt, name, path, chat))
        except ConfigError as exc:  # its message may quote the file: for the log only
            log_line(f"fisk-sm supervise: POST /api/runs: {exc}")
            raise BadRequest("config: does not load (see the supervisor's log)") from None
        return JSONResponse(row.to_json(), status_code=201)

    async def list_runs(request: Request) -> Response:
        return JSONResponse({"runs": [row.to_json() for row in await control.listing()]})

    async def show(request: Request) -> Response:
        return JSONResponse((await control.show(_run_id(request))).to_json())

    async def diagram(request: Request) -> Response:
        path = await control.session_path(_run_id(request))
        try:
            svg = await asyncio.to_thread(draw, load_table(), "svg", [path] if path else [])
        except DiagramError as exc:
            return error(501, str(exc))
        return Response(svg, media_type="image/svg+xml")

    def action(name: Action) -> Handler:
        async def act(request: Request) -> Response:
            run_id = _run_id(request)
            await read_object(request)  # {}: no fields yet, but a POST has a JSON body
            return JSONResponse((await control.act(run_id, name)).to_json(), status_code=202)

        act.__name__ = name
        return act

    async def approvals(request: Request) -> Response:
        pending = [approval_json(approval) for approval in await control.approvals()]
        return JSONResponse({"approvals": pending})

    async def answer(request: Request) -> Response:
        run_id = _run_id(request)
        tool_use_id = str(request.path_params["tool_use_id"])
        body = await read_object(request)
        given = field(body, "answer", required=True)
        if given not in ANSWER_NAMES:
            raise BadRequest(f"answer: must be one of once, always, deny; not {given!r}")
        row = await control.answer(run_id, tool_use_id, given)
        return JSONResponse(row.to_json())

    async def say(request: Request) -> Response:
        run_id = _run_id(request)
        text = field(await read_object(request), "text", required=True)
        if not (text or "").strip():
            raise BadRequest("text: must not be empty")
        assert text is not None
        return JSONResponse((await control.say(run_id, text)).to_json(), status_code=202)

    async def events(request: Request) -> Response:
        run_id = request.query_params.get("run")
        if run_id is not None:
            try:
                check_run_id(run_id)
            except InvalidIdError as exc:
                raise BadRequest(f"run: {exc}") from None
            await control.row(run_id)
        return EventStream(control.events, run_id, _last_event_id(request))

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
        Route("/api/runs/{run_id}/end", _errors(action("end")), methods=["POST"]),
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

"""405 Method Not Allowed for the control API, with the `Allow` header RFC 9110 requires.

Starlette's router answers 405 only after every middleware has run, so a POST to a path that
takes only GET would first meet the POST checks (415 for its content type) and be told the
wrong thing; and where a path has one route per method, Starlette's `Allow` names only the
first route's. `MethodGuard` answers first (after the Host check), from every route on the
path, and `allowed_methods` gives the same list to the app's own 405 handler.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fisk_sm.config.errors import one_line

__all__ = ["MethodGuard", "allowed_methods", "not_allowed"]


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> frozenset[str]:
    """The methods of every route whose path matches the request's (empty: no such path)."""
    allowed: set[str] = set()
    for route in routes:
        if not isinstance(route, Route) or not route.methods:
            continue
        if route.matches(scope)[0] is not Match.NONE:  # PARTIAL: the path, not the method
            allowed |= route.methods
    return frozenset(allowed)


def not_allowed(method: str, path: str, allowed: Iterable[str]) -> Response:
    """The 405 answer: the API's one-line JSON error, and `Allow`."""
    body = json.dumps({"error": one_line(f"{method} is not allowed on {path}", 500)})
    headers = {"Allow": ", ".join(sorted(allowed))}
    return Response(body, status_code=405, headers=headers, media_type="application/json")


class MethodGuard:
    """Answer 405 (with `Allow`) to a method that no route on the request's path takes."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            allowed = allowed_methods(self.routes, scope)
            if allowed and scope["method"] not in allowed:
                response = not_allowed(scope["method"], scope["path"], allowed)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

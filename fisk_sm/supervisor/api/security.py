"""The control API's defences, one small ASGI middleware per policy (`api.build_app` stacks them).

A browser on this machine is the threat: any page it opens can send requests to the API's port.
DNS rebinding makes a hostile name resolve to 127.0.0.1, so the page is "same-origin" with the
API and the browser would show it the answers: `HostGuard` refuses (421) every request whose
`Host` is not one the API is served under. A cross-site form or `fetch` can still send POSTs
without reading the answer: `OriginGuard` refuses (403) an unsafe method from another origin,
and `JsonOnly` refuses (415) a POST that is not `application/json` (what no form, and no
`fetch` without a CORS preflight, can send). `BodyLimit` answers 413 past the size cap without
buffering the body. `SecurityHeaders` puts the headers of `SECURITY_HEADERS` on every answer.
`TokenGuard` refuses (401) a request without the token, when one is set. Every refusal is the
API's one-line JSON error. A header these guards read must come once: two `Origin`s (or `Host`s,
`Content-Type`s, `Authorization`s, `Sec-Fetch-Site`s) are refused, never one of them picked.
`HttpOnly` closes any connection that is not HTTP (a WebSocket upgrade): no guard is written
for those, so none gets through.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LOOPBACK_NAMES",
    "QUERY_TOKEN_PATHS",
    "SECURITY_HEADERS",
    "UNSAFE_METHODS",
    "BodyLimit",
    "BodyTooLarge",
    "DuplicateHeader",
    "HostGuard",
    "HttpOnly",
    "JsonOnly",
    "OriginGuard",
    "SecurityHeaders",
    "TokenGuard",
    "header",
    "refuse",
]

#: The names a loopback listener is also reached under.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Paths that also accept the token as `?token=` (a page's URL, an EventSource).
QUERY_TOKEN_PATHS = ("/", "/api/events")
#: No inline script or style anywhere: the dashboard's are files of their own. Images may be
#: `blob:` URLs (the diagram is fetched with the token, then shown through `createObjectURL`).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:;"
    " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
#: How much of a too-large body is read (and dropped) before answering 413, so the client,
#: still sending, reads the answer instead of a reset connection; past it the connection drops.
DRAIN_LIMIT = 16 << 20


class DuplicateHeader(ValueError):
    """A header a guard reads came more than once (which one a check would see is ambiguous)."""


def header(scope: Scope, name: bytes) -> str | None:
    """The request's `name` header (lower-case bytes), decoded as latin-1; None when absent.
    `DuplicateHeader` when it came more than once (even with the same value)."""
    found = [value for key, value in scope.get("headers", ()) if key == name]
    if len(found) > 1:
        raise DuplicateHeader(name.decode("latin-1"))
    return found[0].decode("latin-1") if found else None


def _header_or_none(scope: Scope, name: bytes) -> tuple[bool, str | None]:
    """(False, None) for a duplicated header, else (True, its value or None)."""
    try:
        return True, header(scope, name)
    except DuplicateHeader:
        return False, None


async def refuse(send: Send, status: int, message: str) -> None:
    """Answer `{"error": message}` with `status` (the connection closes after it)."""
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """Add `SECURITY_HEADERS` to every HTTP answer (errors and the event stream included); a
    route may set its own Content-Security-Policy (the dashboard's allows its inline script)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                given = {k.lower() for k, _ in headers}
                added = [(k, v) for k, v in SECURITY_HEADERS if k not in given]
                message = {**message, "headers": [*headers, *added]}
            await send(message)

        await self.app(scope, receive, with_headers)


class HttpOnly:
    """Close (1008, policy) a WebSocket connection, and ignore any scope that is neither HTTP nor
    lifespan: the guards inside check HTTP requests only, so nothing else may reach the routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "lifespan"):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect; a close before accept refuses the upgrade
            await send({"type": "websocket.close", "code": 1008, "reason": "HTTP only"})


class HostGuard:
    """Refuse (421) a request whose `Host` is not in `allowed`: `host:port` forms, or `host:*`
    for any port (an app served in-process, its port unknown); case does not matter."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        forms = {h.lower() for h in allowed}
        self.exact = frozenset(h for h in forms if not h.endswith(":*"))
        self.any_port = frozenset(h[:-2] for h in forms if h.endswith(":*"))

    def allows(self, host: str) -> bool:
        """Whether `host` (a `Host` header's value) is one this API is served under."""
        host = host.strip().lower()
        if host in self.exact:
            return True
        name, colon, port = host.rpartition(":")
        return bool(colon) and port.isdigit() and not name.endswith(":") and name in self.any_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        single, host = _header_or_none(scope, b"host")
        if scope["type"] == "http" and not (single and self.allows(host or "")):
            await refuse(send, 421, "Host: not a name this API is served under")
            return
        await self.app(scope, receive, send)


class OriginGuard:
    """Refuse (403) a POST, PUT, PATCH or DELETE sent from another origin.

    Allowed: an `Origin` equal to `http://HOST` for the request's own `Host` (which `HostGuard`
    checked; the API serves plain HTTP only, so `https://HOST` is another origin); or no
    `Origin` with `Sec-Fetch-Site` absent, `same-origin` or `none` (curl, `fisk-sm ctl`).
    `same-site` is another port or subdomain: refused, and so is `Origin: null` (a sandboxed
    page, a file: URL), and an `Origin` or `Sec-Fetch-Site` sent twice.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in UNSAFE_METHODS:
            single_origin, origin = _header_or_none(scope, b"origin")
            single_site, site = _header_or_none(scope, b"sec-fetch-site")
            if not (single_origin and single_site):
                ok = False
            elif origin is not None:
                host = (header(scope, b"host") or "").strip().lower()
                ok = origin.strip().lower() == f"http://{host}"
            else:
                ok = (site or "none").strip().lower() in ("same-origin", "none")
            if not ok:
                await refuse(send, 403, "Origin: cross-origin requests are refused")
                return
        await self.app(scope, receive, send)


class JsonOnly:
    """Refuse (415) a POST whose `Content-Type` is not `application/json` (parameters allowed),
    with or without a body: a form or a simple `fetch` cannot send that type cross-origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            single, given = _header_or_none(scope, b"content-type")
            kind = (given or "").split(";", 1)[0].strip().lower()
            if not single or kind != "application/json":
                message = "Content-Type: must be application/json"
                await refuse(send, 415, message)
                return
        await self.app(scope, receive, send)


class BodyTooLarge(Exception):
    """The request body grew past the limit while the app read it."""


class BodyLimit:
    """Answer 413 to a body larger than `limit` bytes: by its `Content-Length`, else by a
    running count of what the app reads (so a huge body is never held in memory)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        single, given = _header_or_none(scope, b"content-length")
        length = (given or "").strip() if single else "twice"  # not digits: refused
        if length and (not length.isdigit() or int(length) > self.limit):
            if length.isdigit() and int(length) <= DRAIN_LIMIT:
                await _drain(receive, DRAIN_LIMIT)
            await refuse(send, 413, f"body: larger than {self.limit} bytes")
            return
        seen = 0
        started = False
        more = True  # whether the client has more body to send (what a drain would wait for)

        async def counted() -> Message:
            nonlocal seen, more
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                more = bool(message.get("more_body", False))
                if seen > self.limit:
                    raise BodyTooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if started:
                raise
            if more:  # the last piece crossed the cap: nothing left to drain, nor to wait for
                await _drain(receive, DRAIN_LIMIT - seen)
            await refuse(send, 413, f"body: larger than {self.limit} bytes")


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of the request body, at most `budget` bytes of it."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class TokenGuard:
    """Refuse (401) any HTTP request without the token (`Authorization: Bearer TOKEN`, or
    `?token=` on the paths of `QUERY_TOKEN_PATHS`)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _given(self, scope: Scope) -> bytes | None:
        value = header(scope, b"authorization")  # DuplicateHeader: refused by the caller
        if value is not None and value[:7].lower() == "bearer ":
            return value[7:].strip().encode("latin-1")
        if scope.get("method") == "GET" and scope.get("path") in QUERY_TOKEN_PATHS:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if query.get("token"):
                found: str = query["token"][0]
                return found.encode("utf-8", "surrogateescape")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                given = self._given(scope)
            except DuplicateHeader:
                given = None
            if given is None or not hmac.compare_digest(given, self.token):
                message = "a valid token is required: Authorization: Bearer TOKEN"
                await refuse(send, 401, message)
                return
        await self.app(scope, receive, send)

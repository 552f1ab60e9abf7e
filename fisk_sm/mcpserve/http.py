"""The MCP servers on streamable HTTP, with the control API's defences of [11/19].

The SDK's transport-security settings are pinned to the listener's own names and port (its
default `allowed_origins`, `http://127.0.0.1:*`, would admit a page on any loopback port), and
the SDK's app is wrapped in the same guards as the control API: `HostGuard` (421 for a `Host`
not served), `OriginGuard` (403 for a POST from another origin: an `Origin` must equal
`http://HOST` exactly), `JsonOnly` (415 for a POST that is not JSON), `BodyLimit`, the token
(`TokenGuard`, 401) when one is set, and `HttpOnly`. A non-loopback `--listen` needs a token.
"""

from __future__ import annotations

import asyncio
import socket

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from fisk_sm.operator.sanitize import say
from fisk_sm.supervisor.api.app import MAX_BODY
from fisk_sm.supervisor.api.security import (
    BodyLimit,
    HostGuard,
    HttpOnly,
    JsonOnly,
    OriginGuard,
    SecurityHeaders,
    TokenGuard,
)
from fisk_sm.supervisor.api.server import (
    bind,
    check_token_rule,
    parse_listen,
    serve_app,
    served_hosts,
    url_of,
)

__all__ = ["PATH", "guarded_app", "serve_http"]

#: Where the MCP endpoint is.
PATH = "/mcp"


def guarded_app(mcp: MCPServer, hosts: frozenset[str], token: str | None) -> ASGIApp:
    """The SDK's streamable-HTTP app for `mcp`, pinned to `hosts` and behind the guards."""
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(hosts),
        allowed_origins=sorted(f"http://{host}" for host in hosts),
    )
    app: ASGIApp = mcp.streamable_http_app(streamable_http_path=PATH, transport_security=security)
    app = BodyLimit(JsonOnly(OriginGuard(app)), limit=MAX_BODY)
    if token:
        app = TokenGuard(app, token)
    return HttpOnly(SecurityHeaders(HostGuard(app, hosts)))


async def serve_http(mcp: MCPServer, listen: str, token: str | None, name: str) -> None:
    """Serve `mcp` on `listen` (HOST:PORT) until cancelled; says its URL on stderr."""
    host, port = parse_listen(listen)
    check_token_rule(host, token)
    sock: socket.socket = bind(host, port)
    app = guarded_app(mcp, served_hosts(sock, host), token)
    async with mcp.session_manager.run():  # the SDK app's lifespan, which uvicorn does not run
        server, task = await serve_app(app, sock)
        say(f"fisk-sm {name}: listening on {url_of(sock)}{PATH}")
        try:
            await asyncio.shield(task)
        finally:
            server.should_exit = True
            await task

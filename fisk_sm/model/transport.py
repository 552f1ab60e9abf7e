"""The HTTP transport under the shared SDK clients: the SDK's aiohttp transport, one loop's own.

`new_client` builds the `anthropic.AsyncAnthropic` that `fisk_sm.model.clients` shares, on the
SDK's aiohttp transport (`anthropic[aiohttp]`, `anthropic.DefaultAioHttpClient`) rather than
its default httpx2 one: at 100 concurrent callers a call costs about 0.6 times the CPU
(`bench/model_transport.py`). Everything above the transport is the SDK's, the same on either:
timeouts, retries, the mapping of errors, streaming, env proxies. aiohttp is a dependency of
fisk-sm, so there is no fallback to httpx2: an install without it fails when the first client
is built, naming the `aiohttp` extra (the SDK's own error).

An aiohttp session belongs to the event loop it was made on (the first request's). Each
transport of the client is wrapped so that it remembers that loop: a request from another loop
(a model built before `asyncio.run`, used by two of them) never reuses the old loop's session
or its pooled connections. It gets a new session, and the old one is closed: on its own loop
if that loop is still open, else at once (on a closed loop aiohttp only drops its pool). The
shared clients are per loop already (`fisk_sm.model.clients`), so for them this never happens.

`close_soon` closes clients that a closed loop left behind, from the running loop.

A plain (not streamed) call, as `AnthropicModel` makes it, goes through the SDK's own
`client.post` (its documented way to call any endpoint) with the body built by
`ModelRequest.body` (encoded here, message by message; a resumed conversation's history
spliced in as the journal's own bytes), rather than `messages.create`. Everything that makes
a call a call stays the SDK's: the request, its headers, retries, timeouts, cancellation and
the mapping of error statuses. What is skipped is what
`messages.create` adds on top for no one, 13 to 30% of a call's own CPU through the engine
(`bench/model_call.py`): its copy of the whole conversation to prepare it for JSON (the body here
is plain JSON already), the raw-response wrapper, and an OpenTelemetry span that nothing records.
So the shortcut is taken only while nothing could record or carry that span (no tracer provider
set, no current span) and the model is not one `messages.create` warns about; otherwise the
call goes through `messages.create` exactly as before. `lean_calls` counts the calls made by the
shortcut.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

from fisk_sm.config.jsontypes import JSONObject

if TYPE_CHECKING:  # the SDK and aiohttp are imported when the first client is built
    import asyncio
    import ssl

    import anthropic
    import httpx2
    from httpx2._types import CertTypes

__all__ = ["close_soon", "counted", "encode_json", "lean_call", "lean_calls", "new_client"]

#: The calls made through `client.post` so far, in this process (what a test can check).
lean_calls = 0
#: The body as the SDK encodes it (`anthropic._utils._json.openapi_dumps`): compact, UTF-8,
#: and no NaN or Infinity (a ValueError, as from the SDK).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

#: The tasks of `close_soon` still running (a task nobody references may be collected).
_CLOSING: set[asyncio.Task[None]] = set()


def new_client(base_url: str | None, api_key: str) -> anthropic.AsyncAnthropic:
    """A client of `base_url` (None: the SDK's default) and `api_key`, on aiohttp. Blocking
    (an SSL context, and the SDK's import the first time): `clients.warm_up` calls it in a
    worker thread."""
    import anthropic

    return anthropic.AsyncAnthropic(
        api_key=api_key, base_url=base_url, http_client=_http_client_class()()
    )


async def _close_all(clients: list[anthropic.AsyncAnthropic]) -> None:
    for client in clients:
        await client.close()


def close_soon(clients: Iterable[anthropic.AsyncAnthropic]) -> None:
    """Close `clients` in a task on the running loop (their sessions' loops are closed)."""
    import asyncio

    left = list(clients)
    if not left:
        return
    task = asyncio.get_running_loop().create_task(_close_all(left))
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


@functools.cache
def _http_client_class() -> type[httpx2.AsyncClient]:
    """`anthropic.DefaultAioHttpClient` with each of its transports bound to one loop at a time
    (defined on first use: the module must not import the SDK or aiohttp)."""
    import asyncio

    import aiohttp
    import anthropic
    import httpx2

    class LoopBound(httpx2.AsyncBaseTransport):
        """An aiohttp transport whose session is only ever used on the loop that made it."""

        def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
            self.inner = inner
            self.loop: asyncio.AbstractEventLoop | None = None  # the session's

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            loop = asyncio.get_running_loop()
            if loop is not self.loop:
                await self._let_go()
                self.loop = loop
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            if self.loop is None or self.loop is asyncio.get_running_loop():
                await self.inner.aclose()
            else:
                await self._let_go()

        async def _let_go(self) -> None:
            """Drop the session of the loop used before (the next request makes a new one)."""
            session, loop = getattr(self.inner, "client", None), self.loop
            if not isinstance(session, aiohttp.ClientSession) or loop is None:
                return
            self.inner.client = None  # type: ignore[attr-defined]  # AiohttpTransport.client
            if loop.is_closed():  # nothing left to wait for: aiohttp drops the pool
                await session.close()
            else:
                asyncio.run_coroutine_threadsafe(session.close(), loop)

    class Client(anthropic.DefaultAioHttpClient):
        """The SDK's aiohttp client, each transport it builds wrapped in `LoopBound`."""

        def _init_transport(
            self,
            verify: ssl.SSLContext | str | bool = True,
            cert: CertTypes | None = None,
            trust_env: bool = True,
            http1: bool = True,
            http2: bool = False,
            limits: httpx2.Limits = anthropic.DEFAULT_CONNECTION_LIMITS,
            transport: httpx2.AsyncBaseTransport | None = None,
        ) -> httpx2.AsyncBaseTransport:
            built = super()._init_transport(
                verify=verify,
                cert=cert,
                trust_env=trust_env,
                http1=http1,
                http2=http2,
                limits=limits,
                transport=transport,
            )
            return built if transport is not None else LoopBound(built)

        def _init_proxy_transport(
            self,
            proxy: httpx2.Proxy,
            verify: ssl.SSLContext | str | bool = True,
            cert: CertTypes | None = None,
            trust_env: bool = True,
            http1: bool = True,
            http2: bool = False,
            limits: httpx2.Limits = anthropic.DEFAULT_CONNECTION_LIMITS,
        ) -> httpx2.AsyncBaseTransport:
            built = super()._init_proxy_transport(
                proxy,
                verify=verify,
                cert=cert,
                trust_env=trust_env,
                http1=http1,
                http2=http2,
                limits=limits,
            )
            return LoopBound(built)

    return Client


def lean_call(model: object, thinking: object) -> bool:
    """Whether a plain call may skip `messages.create` for `client.post`: no span of the SDK
    could record or propagate (no tracer provider is set, and no span is current), and the SDK
    has no warning for `model` (deprecated, or deprecated with `thinking.type=enabled`)."""
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    if trace.get_current_span().get_span_context().is_valid:
        return False
    deprecated, with_thinking = _warned_models()
    if model in deprecated:
        return False
    enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    return not (enabled and model in with_thinking)


def encode_json(value: JSONObject) -> bytes:
    """`value` as the SDK encodes a request's JSON body."""
    return _ENCODE(value).encode()


def counted(body: bytes) -> bytes:
    """`body`, a lean call's, counted in `lean_calls`."""
    global lean_calls
    lean_calls += 1
    return body


@functools.cache
def _warned_models() -> tuple[Container[object], Container[object]]:
    """The models `messages.create` warns about: every model when the SDK no longer says which
    (a later SDK: the shortcut is then never taken, and tests/test_model_lean.py fails)."""
    from anthropic.resources.messages import messages

    everything = _Everything()
    deprecated = getattr(messages, "DEPRECATED_MODELS", everything)
    with_thinking = getattr(messages, "MODELS_TO_WARN_WITH_THINKING_ENABLED", everything)
    return deprecated, with_thinking


class _Everything:
    def __contains__(self, item: object) -> bool:
        return True

"""Model calls: one request to the Anthropic Messages API under `call_timeout`.

`AnthropicModel` uses the real `anthropic.AsyncAnthropic`. The whole call, the SDK's own retries
included, runs under one `call_timeout` deadline, as the reference does; each attempt also gets
that timeout. The reply is read as the raw HTTP body (the SDK still retries and maps error
statuses; a plain call goes through the SDK's `client.post`: `fisk_sm.model.transport`) and
parsed and checked by `fisk_sm.model.reply`, never built into the SDK's models:
content blocks stay exactly as sent, because thinking signatures break if blocks are
re-encoded, and a malformed reply becomes a `ModelError` ("malformed model reply: ...") before
any of it reaches the journal. Anything with the same `create` method can stand in for the
model (the benchmarks use an in-process one).

Streaming. A model given `on_text` asks for the reply as Server-Sent Events (`"stream": true`,
through the SDK's `with_streaming_response`, so retries and error statuses work as for a plain
call) and hands each text delta to `on_text` as it arrives (a chat shows the answer as it is
written). The events are assembled into the same message dict a plain call returns, and that
goes through the same `parse_reply`: the journal gets the whole turn, never a part of it. An
`error` event mid-stream is a `ModelError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from fisk_sm.config.agent import LLMConfig
from fisk_sm.config.thinking import Thinking
from fisk_sm.model.blocks import Message
from fisk_sm.model.clients import ClientShare, acquire, client_key
from fisk_sm.model.reply import ModelError, one_line, parse_reply
from fisk_sm.model.transport import counted, encode_json, lean_call

if TYPE_CHECKING:  # the SDK is imported when a model is built (`clients.warm_up`: off the loop)
    import anthropic

__all__ = ["AnthropicModel", "ModelClient", "ModelError", "ModelRequest", "build_request"]


@attrs.frozen
class ModelRequest:
    """The parameters of one Messages API call."""

    model: str
    max_tokens: int
    messages: Sequence[Message] = attrs.field(eq=False)
    system: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    thinking: dict[str, Any] | None = None
    #: The prompt-cache TTL ("5m" or "1h"), or None to send no cache breakpoints.
    cache_ttl: str | None = None

    @property
    def thinking_label(self) -> str:
        """The thinking sent, as the fingerprint records it (`Thinking.label`): "off",
        "adaptive" or "budget_tokens=N"."""
        if not self.thinking:
            return "off"
        if self.thinking.get("type") == "enabled":
            return f"budget_tokens={self.thinking.get('budget_tokens')}"
        return "adaptive"

    def params(self) -> dict[str, Any]:
        """Keyword arguments for `messages.create`.

        With a `cache_ttl`, two cache breakpoints are set: on the last system block (so the
        tools and the system prompt are cached) and on the last block of the conversation (so
        each call reads the whole conversation so far from the cache and adds its tail). The
        stored conversation is never changed: only the copies sent carry `cache_control`.

        This is where the typed conversation becomes JSON for the wire, once per call: each
        block the model sent goes back as the very object it came as (`fisk_sm.model.blocks`).
        """
        control = self._control()
        messages = [m.to_json() for m in self.messages]
        if control is not None:
            messages = _with_tail_breakpoint(messages, control)
        # In the order `messages.create` sends them: a lean call's body is the same bytes.
        return {"max_tokens": self.max_tokens, "messages": messages, **self._others(control)}

    def body(self) -> bytes:
        """The JSON body of a plain call with `params()`, as the SDK encodes it, built message
        by message: one that holds its JSON as bytes already (`Message.raw`: a resumed
        conversation's history, the journal's own bytes) is sent as those bytes, never decoded;
        the last is built, for its cache breakpoint. Counted in `transport.lean_calls`."""
        control, messages = self._control(), self.messages
        head = encode_json({"max_tokens": self.max_tokens})[:-1]
        pieces: list[bytes | memoryview] = [head, b',"messages":[']
        append, extend = pieces.append, pieces.extend
        for message in messages[:-1]:
            raw = message.raw()
            if raw is None:
                append(encode_json(message.to_json()))
            else:
                extend(raw)
            append(b",")
        if messages:
            last = [messages[-1].to_json()]
            if control is not None:
                last = _with_tail_breakpoint(last, control)
            append(encode_json(last[0]))
        append(b"],")
        append(encode_json(self._others(control))[1:])
        return counted(b"".join(pieces))

    def _control(self) -> dict[str, str] | None:
        """The cache breakpoints' `cache_control`, or None (no `cache_ttl`)."""
        return None if self.cache_ttl is None else {"type": "ephemeral", "ttl": self.cache_ttl}

    def _others(self, control: dict[str, str] | None) -> dict[str, Any]:
        """The parameters after `messages`, in `messages.create`'s order."""
        params: dict[str, Any] = {"model": self.model}
        if self.system:
            system = list(self.system)
            if control is not None:
                system[-1] = {**system[-1], "cache_control": control}
            params["system"] = system
        if self.thinking:
            params["thinking"] = self.thinking
        if self.tools:
            params["tools"] = list(self.tools)
        return params


#: Blocks that may carry a cache breakpoint (thinking blocks, for one, may not).
_CACHEABLE = frozenset({"text", "tool_result", "tool_use", "image", "document"})


def _with_tail_breakpoint(
    messages: list[dict[str, Any]], control: dict[str, str]
) -> list[dict[str, Any]]:
    """`messages` with a breakpoint on the last block of the last message, when it can take one."""
    if not messages:
        return messages
    last = messages[-1]
    content = last.get("content")
    blocks: list[dict[str, Any]]
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content:
        blocks = list(content)
    else:
        return messages
    if blocks[-1].get("type") not in _CACHEABLE:
        return messages
    blocks[-1] = {**blocks[-1], "cache_control": control}
    return [*messages[:-1], {**last, "content": blocks}]


def build_request(
    llm: LLMConfig,
    system: tuple[dict[str, Any], ...],
    tools: tuple[dict[str, Any], ...],
    messages: Sequence[Message],
    *,
    interactive: bool = False,
) -> ModelRequest:
    """The request for the next call: output cap, thinking and the prompt cache.

    The cache lives 1h for an interactive run (an operator may take a while to answer) and 5m
    otherwise; `llm.no_prompt_cache` turns it off.
    """
    thinking = _thinking_param(llm.resolved_thinking)
    ttl = None if llm.no_prompt_cache else ("1h" if interactive else "5m")
    return ModelRequest(
        model=llm.model,
        max_tokens=llm.output_cap,
        messages=messages,
        system=system,
        tools=tools,
        thinking=thinking,
        cache_ttl=ttl,
    )


def _thinking_param(thinking: Thinking) -> dict[str, Any] | None:
    """The request's `thinking`: adaptive (summarized), a budget, or none."""
    if not thinking.enabled:
        return None
    if thinking.mode == "budget":
        return {"type": "enabled", "budget_tokens": thinking.budget_tokens}
    return {"type": "adaptive", "display": "summarized"}


def _thinking_refused(request: ModelRequest, exc: anthropic.APIStatusError) -> str | None:
    """The one line for a 400 the thinking setting caused (its message names thinking or the
    budget), or None: a 400 about anything else is not blamed on the setting."""
    if exc.status_code != 400 or not request.thinking:
        return None
    reason = _reason(exc)
    if "thinking" not in reason.lower() and "budget_tokens" not in reason:
        return None
    form = request.thinking_label
    return f"llm.thinking: model {request.model} refused {form} thinking (400: {reason})"


class ModelClient(Protocol):
    """Anything that answers a request with a Messages API reply as a JSON-ready dict."""

    async def create(self, request: ModelRequest) -> dict[str, Any]: ...


@attrs.define
class AnthropicModel:
    """The real model, through `anthropic.AsyncAnthropic`.

    Its client is taken when the model is built, never inside a run's step: the running loop's
    shared client for this base URL and key (`fisk_sm.model.clients`), seen through this model's
    timeout and retries. `aclose()` lets go of it; the last user closes it.
    """

    llm: LLMConfig
    api_key: str | None = None
    max_retries: int = 2
    #: Called with each piece of the answer's text as it streams in; None: no streaming.
    on_text: Callable[[str], None] | None = None
    client: anthropic.AsyncAnthropic = attrs.field(init=False, repr=False)
    _share: ClientShare = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        options = (self.llm.budget.call_timeout, self.max_retries)
        self._share = acquire(client_key(self.llm.base_url, self.api_key), options)
        self.client = self._share.client

    async def create(self, request: ModelRequest) -> dict[str, Any]:
        """One call; every failure becomes a `ModelError` naming what went wrong in one line."""
        import asyncio

        import anthropic

        deadline = self.llm.budget.call_timeout
        try:
            async with asyncio.timeout(deadline):
                if self.on_text is not None:
                    body = await self._streamed(request, self.on_text)
                else:
                    body = await self._plain(request)
        except TimeoutError:
            raise ModelError(f"llm call: timed out after {deadline:g}s") from None
        except anthropic.APIStatusError as exc:
            refused = _thinking_refused(request, exc)
            if refused is not None:
                raise ModelError(refused) from None
            raise ModelError(f"llm call: HTTP {exc.status_code}: {_reason(exc)}") from None
        except anthropic.APIError as exc:
            raise ModelError(f"llm call: {one_line(str(exc))}") from None
        return parse_reply(body)

    async def _plain(self, request: ModelRequest) -> bytes:
        """The raw body of the reply to a plain call (`fisk_sm.model.transport`: when the SDK's
        `client.post` may stand in for `messages.create`, with `request.body()`)."""
        if not lean_call(request.model, request.thinking):
            raw = await self.client.messages.with_raw_response.create(**request.params())
            data: bytes = await raw.read()
            return data
        import httpx2

        content = request.body()
        response = await self.client.post("/v1/messages", cast_to=httpx2.Response, content=content)
        return response.content

    async def _streamed(self, request: ModelRequest, on_text: Callable[[str], None]) -> bytes:
        """The reply of a streamed call, assembled from its events, as a JSON body."""
        create = self.client.messages.with_streaming_response.create
        async with create(**request.params(), stream=True) as response:
            message = await assemble(_sse_data(response.iter_lines()), on_text)
        return json.dumps(message).encode()

    async def aclose(self) -> None:
        """Let go of the client (closed once no other model on this loop uses it); idempotent."""
        await self._share.release()


def _reason(exc: anthropic.APIStatusError) -> str:
    """The error's message, on one line: a proxy's error page must not become the run's report.

    Read from the body, not from `exc.message`, whose wording changes between SDK releases
    (2.17 prefixes the status and appends the request id and path)."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return one_line(str(error["message"]))
    if isinstance(body, str) and body.strip():
        return one_line(body)
    return one_line(str(exc.message))


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON `data:` of each Server-Sent Event (one data line per event, as the API sends)."""
    async for line in lines:
        if line.startswith("data:"):
            try:
                event = json.loads(line[5:].strip())
            except ValueError:
                raise ModelError("malformed model reply: a stream event is not JSON") from None
            if isinstance(event, dict):
                yield event


def _delta(block: dict[str, Any], delta: dict[str, Any], parts: dict[int, str], at: int) -> str:
    """Apply one content delta to its block; the text it added to the answer, if any."""
    kind = delta.get("type")
    if kind == "text_delta":
        text = str(delta.get("text", ""))
        block["text"] = block.get("text", "") + text
        return text
    if kind == "input_json_delta":
        parts[at] = parts.get(at, "") + str(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))
    return ""


async def assemble(
    events: AsyncIterator[dict[str, Any]], on_text: Callable[[str], None]
) -> dict[str, Any]:
    """The message a stream of Messages API events spells, handing text deltas to `on_text`."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    parts: dict[int, str] = {}
    async for event in events:
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event.get("message") or {})
        elif kind == "content_block_start":
            blocks[int(event.get("index", len(blocks)))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            at = int(event.get("index", 0))
            text = _delta(blocks.setdefault(at, {}), event.get("delta") or {}, parts, at)
            if text:
                on_text(text)
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            usage = {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            message["usage"] = {**(message.get("usage") or {}), **usage}
        elif kind == "error":
            error = event.get("error") or {}
            raise ModelError(f"llm call: stream error: {one_line(str(error.get('message')))}")
    for at, partial in parts.items():
        try:
            blocks[at]["input"] = json.loads(partial) if partial else {}
        except ValueError:
            raise ModelError("malformed model reply: a tool_use input is not JSON") from None
    message["content"] = [blocks[at] for at in sorted(blocks)]
    return message

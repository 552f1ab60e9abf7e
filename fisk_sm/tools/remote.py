"""Remote tools over NATS request/reply: import them from tool hosts, or serve Python tools.

Protocol. A tool host serves under a subject prefix `P` (NATS tokens, no wildcards). Every
payload is UTF-8 JSON.

- `P.list`, with an empty request, answers `{"tools": [<tool definition>...], "agent": "<host
  name>"}`. A tool definition is the Messages API's: `name` (`^[a-zA-Z0-9_-]{1,64}$`),
  `description` and `input_schema`.
- `P.call.<tool name>`, with the tool input (a JSON object), answers `{"result": <any JSON>}`
  (normally the command-result shape `{command, exit_code, output, truncated?}`) or
  `{"error": "<message>"}` for a failure of the harness or of the invocation.

Importing. `import_remote_tools` asks every host for its list once, at setup. A host that does
not answer (no responders, a timeout) or answers something malformed is a `RemoteError`: it
aborts the run. A remote tool keeps its bare name unless a local tool has taken it or more than
one host offers it; then it becomes `<alias>_<bare>`. A collision that still remains is a
`RemoteError`. Each call is one request under the run's `call_timeout`: a timeout, no
responders, an `{"error"}` reply or a malformed reply raise `ToolError` (an `is_error` result for
the model); `{"result": X}` returns X. A host's `timeout` in agent.yaml replaces `call_timeout`
for its calls, and `max_output` caps their text (head and tail kept, as for every tool). Remote
tools are gated by their host, never locally.

Serving. `serve_tools` makes a tool host of Python tools, dispatched through `ToolBox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

import attrs
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.errors import one_line
from fisk_sm.config.limits import MAX_OUTPUT
from fisk_sm.config.names import IDENTITY_RE, SUBJECT_RE, TOOL_NAME_RE
from fisk_sm.tools.base import Tool, ToolBox, ToolError, ToolLoadError
from fisk_sm.tools.foreign import Offered, local_names

__all__ = [
    "RemoteError",
    "RemoteSpec",
    "ToolHost",
    "connect_nats",
    "connect_remote_tools",
    "import_remote_tools",
    "serve_tools",
    "settle",
]


class RemoteError(ToolLoadError):
    """A remote tool host could not be imported from; the run must not start."""


def _check_alias(_: Any, __: Any, value: str) -> None:
    if not IDENTITY_RE.fullmatch(value):
        raise ValueError(f"remote tool alias {value!r} must match {IDENTITY_RE.pattern}")


def _check_subject(_: Any, __: Any, value: str) -> None:
    if not SUBJECT_RE.fullmatch(value):
        raise ValueError(
            f"remote tool subject {value!r} must be dot-separated NATS tokens without wildcards"
        )


@attrs.frozen
class RemoteSpec:
    """One tool host to import from: a local alias and the host's subject prefix; `timeout`
    (seconds, None: the import's) bounds each call, `max_output` (bytes) its result's text."""

    alias: str = attrs.field(validator=_check_alias)
    subject: str = attrs.field(validator=_check_subject)
    timeout: float | None = None
    max_output: int = MAX_OUTPUT

    @property
    def label(self) -> str:
        """How messages name the host: `'ops' (tools.ops)`."""
        return f"{self.alias!r} ({self.subject})"


@attrs.frozen
class _Offer:
    """One tool as a host lists it."""

    spec: RemoteSpec
    agent: str
    name: str
    description: str
    input_schema: dict[str, Any]


def _decode(data: bytes) -> Any:
    """The JSON in a payload; ValueError (with a short reason) if there is none."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None


async def _request(nc: Client, subject: str, payload: bytes, seconds: float) -> Any:
    """One request; ConnectionError names why nobody answered, ValueError a bad reply."""
    try:
        msg = await nc.request(subject, payload, timeout=seconds)
    except NoRespondersError:
        raise ConnectionError("no responders") from None
    except TimeoutError:
        raise ConnectionError(f"no reply within {seconds:g}s") from None
    except NatsError as exc:
        raise ConnectionError(str(exc) or type(exc).__name__) from None
    return _decode(msg.data)


def _parse_listing(spec: RemoteSpec, reply: Any) -> list[_Offer]:
    if not isinstance(reply, dict) or not isinstance(reply.get("tools"), list):
        raise ValueError('expected an object with a "tools" list')
    agent = reply.get("agent", spec.alias)
    if not isinstance(agent, str) or not agent:
        raise ValueError('"agent" must be a non-empty string')
    offers: list[_Offer] = []
    for entry in reply["tools"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
            raise ValueError(f"bad tool name {name!r}: must match {TOOL_NAME_RE.pattern}")
        description = entry.get("description", "")
        schema = entry.get("input_schema")
        if not isinstance(description, str) or not isinstance(schema, dict):
            raise ValueError(f"tool {name!r} needs a string description and an input_schema")
        if any(o.name == name for o in offers):
            raise ValueError(f"tool {name!r} is listed twice")
        offers.append(_Offer(spec, agent, name, description, schema))
    return offers


async def _list_host(nc: Client, spec: RemoteSpec, seconds: float) -> list[_Offer]:
    try:
        return _parse_listing(spec, await _request(nc, f"{spec.subject}.list", b"", seconds))
    except ConnectionError as exc:
        raise RemoteError(f"remote tool host {spec.label} did not answer: {exc}") from None
    except ValueError as exc:
        raise RemoteError(
            f"remote tool host {spec.label} sent a malformed tool list: {exc}"
        ) from None


def _caller(nc: Client, offer: _Offer, name: str, timeout: float) -> Callable[..., Any]:
    subject = f"{offer.spec.subject}.call.{offer.name}"
    where = f"remote tool {name!r} on host {offer.spec.label}"

    async def call(**arguments: Any) -> Any:
        payload = json.dumps(arguments, ensure_ascii=False, default=str).encode()
        try:
            reply = await _request(nc, subject, payload, timeout)
        except ConnectionError as exc:
            raise ToolError(f"{where} did not answer: {exc}") from None
        except ValueError as exc:
            raise ToolError(f"{where} sent a malformed reply: {exc}") from None
        if isinstance(reply, dict) and "error" in reply:
            raise ToolError(f"{where} failed: {reply['error']}")
        if isinstance(reply, dict) and "result" in reply:
            return reply["result"]
        raise ToolError(f'{where} sent a malformed reply: expected "result" or "error"')

    call.__name__ = name
    return call


def _local_names(offers: Sequence[_Offer], taken: Collection[str]) -> list[str]:
    """The name each offer is registered under; RemoteError if two would still collide."""
    offered = [
        Offered(o.spec.alias, o.name, f"tool {o.name!r} of remote tool host {o.spec.label}")
        for o in offers
    ]
    return local_names(offered, taken, RemoteError)


async def import_remote_tools(
    nc: Client,
    specs: Sequence[RemoteSpec],
    *,
    taken: Collection[str],
    timeout: float,  # noqa: ASYNC109 - each request's own deadline, kept for the calls too
) -> list[Tool]:
    """Import the tools of every host in `specs`, in spec order and each host's list order.

    `taken` holds the local tool names; `timeout` (the run's `call_timeout`) bounds the list
    request and every later call (unless the host's spec has a `timeout` of its own). Raises
    RemoteError if a host fails or names still collide.
    """
    aliases = Counter(spec.alias for spec in specs)
    doubled = sorted(alias for alias, count in aliases.items() if count > 1)
    if doubled:
        raise RemoteError(f"remote tool alias {doubled[0]!r} is used more than once")
    listed = await asyncio.gather(
        *(_list_host(nc, spec, timeout) for spec in specs), return_exceptions=True
    )
    offers: list[_Offer] = []
    for result in listed:
        if isinstance(result, BaseException):
            raise result
        offers.extend(result)
    return [
        Tool(
            name=name,
            description=f"{offer.description} (remote: {offer.agent})".lstrip(),
            input_schema=offer.input_schema,
            fn=_caller(nc, offer, name, offer.spec.timeout or timeout),
            kind="remote",
            agent=offer.agent,
            max_output=offer.spec.max_output,
        )
        for offer, name in zip(offers, _local_names(offers, set(taken)), strict=True)
    ]


async def _quiet(error: Exception) -> None:
    """nats-py prints a traceback for every failed attempt unless given an error callback."""


async def connect_nats(url: str, **options: Any) -> Client:
    """A connection to the NATS server at `url` that fails fast and quietly: by default no
    reconnects (a caller's next request then fails at once) and no tracebacks printed by
    nats-py; `options` (nats-py's `connect` keywords) override that.

    Raises ConnectionError with one line naming `url` if the server cannot be reached.
    """
    import nats

    settings: dict[str, Any] = {
        "connect_timeout": 2,
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,  # nats-py: 0 would mean "retry forever"
        "reconnect_time_wait": 0.2,
        "error_cb": _quiet,
    }
    try:
        return await nats.connect(url, **{**settings, **options})
    except (OSError, NatsError, TimeoutError) as exc:
        reason = one_line(exc) or type(exc).__name__
        raise ConnectionError(f"cannot reach the NATS server at {url}: {reason}") from None


async def connect_remote_tools(
    config: AgentConfig, taken: Collection[str]
) -> tuple[list[Tool], Callable[[], Coroutine[Any, Any, None]]]:
    """Connect to `config.nats.url` and import the tools of `config.remote_tools`.

    Returns the tools and a coroutine function that closes the connection; the connection must
    stay open while the run uses the tools. Any failure is a one-line `RemoteError`.
    """
    try:
        nc = await connect_nats(config.nats.url)
    except ConnectionError as exc:
        raise RemoteError(str(exc)) from None
    specs = [
        RemoteSpec(host.alias, host.subject, host.timeout, host.max_output)
        for host in config.remote_tools
    ]
    try:
        tools = await import_remote_tools(
            nc, specs, taken=taken, timeout=config.llm.budget.call_timeout
        )
    except BaseException:
        await nc.close()
        raise
    return tools, nc.close


@attrs.define(eq=False)
class ToolHost:
    """A running tool host: `await host.stop()` (or `async with`) ends it."""

    nc: Client = attrs.field(repr=False)
    subject: str
    agent: str
    subscriptions: list[Subscription] = attrs.field(factory=list)
    _calls: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Answer one call in its own task, so that a slow tool does not hold up the others."""
        task = asyncio.get_running_loop().create_task(work)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    @property
    def calls(self) -> int:
        """How many calls are being answered right now."""
        return len(self._calls)

    async def stop(self, grace: float = 0.0) -> int:
        """Stop answering, give the calls still running `grace` seconds to finish and answer,
        then cancel the rest; the connection stays open. Returns how many were cancelled (a
        sync tool's worker thread goes on running: only its answer is dropped).

        Once this returns the server no longer routes the host's subjects to it: a request
        finds no responders (unless another host serves them).
        """
        subscriptions, self.subscriptions = self.subscriptions, []
        for sub in subscriptions:
            with contextlib.suppress(NatsError):  # the connection or subscription is gone
                await sub.unsubscribe()
        with contextlib.suppress(NatsError):
            await settle(self.nc)
        calls = list(self._calls)
        if calls and grace > 0:
            await asyncio.wait(calls, timeout=grace)
        unfinished = [task for task in calls if not task.done()]
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        return len(unfinished)

    async def __aenter__(self) -> ToolHost:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


async def _answer(box: ToolBox, name: str, data: bytes) -> dict[str, Any]:
    """The reply to one call of tool `name` with the raw input `data`."""
    try:
        arguments = _decode(data) if data.strip() else {}
    except ValueError as exc:
        return {"error": f"tool {name!r} input is {exc}"}
    outcome = box.rejection(name, arguments) or await box.invoke(name, arguments)
    if outcome.is_error:
        return {"error": outcome.content}
    try:
        return {"result": json.loads(outcome.content)}
    except json.JSONDecodeError:
        return {"result": outcome.content}


async def settle(nc: Client) -> None:
    """Return once the server has every subscription `nc` made so far.

    nats-py's `flush()` writes its PING straight to the socket, ahead of commands still queued
    for its flusher task, so one PONG may come back before a new SUB is read. The first flush
    gives the flusher its turn; the PONG of the second one follows the SUB.
    """
    await nc.flush()
    await nc.flush()


async def serve_tools(
    nc: Client, subject: str, tools: Sequence[Tool], *, agent: str, queue: str = ""
) -> ToolHost:
    """Serve `tools` under `subject` as the tool host `agent` until the host is stopped.

    `queue` puts the subscriptions in a NATS queue group, so that several processes can share
    one subject. Raises ValueError for a bad subject or two tools with one name.
    """
    _check_subject(None, None, subject)
    box = ToolBox.of(tools)
    listing = json.dumps({"tools": box.definitions, "agent": agent}, ensure_ascii=False).encode()
    host = ToolHost(nc, subject, agent)
    call_prefix = f"{subject}.call."

    async def reply(msg: Msg, payload: bytes) -> None:
        with contextlib.suppress(NatsError):  # the connection closed: nobody is left to answer
            await nc.publish(msg.reply, payload)

    async def on_list(msg: Msg) -> None:
        if msg.reply:
            await reply(msg, listing)

    async def call(msg: Msg) -> None:
        answer = await _answer(box, msg.subject.removeprefix(call_prefix), msg.data)
        await reply(msg, json.dumps(answer, ensure_ascii=False, default=str).encode())

    async def on_call(msg: Msg) -> None:
        if msg.reply:
            host.spawn(call(msg))

    host.subscriptions.append(await nc.subscribe(f"{subject}.list", queue, cb=on_list))
    host.subscriptions.append(await nc.subscribe(f"{call_prefix}*", queue, cb=on_call))
    await settle(nc)
    return host

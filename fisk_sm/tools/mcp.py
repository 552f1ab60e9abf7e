"""MCP (Model Context Protocol) servers as a tool source, through the `mcp` SDK.

Each server agent.yaml declares under `mcp_servers:` (`fisk_sm.config.mcp.McpServer`) is
connected when the run starts (`Harness.start_mcp_servers`, on the event loop, never blocking
it): a stdio server is started as a process the run owns (`fisk_sm.tools.mcp_stdio`), a
streamable HTTP one is reached at its URL. The session is initialized and the tools listed,
within the declaration's `timeout`; a server that fails is an `McpError` (one line, the run
does not start).

Its tools join the tool set with kind `mcp` and the server's alias as their `agent`:

- names follow the remote tools' rule (`fisk_sm.tools.foreign`): `<alias>_<name>` when a
  local tool has the name or two sources offer it;
- input schemas pass through unchanged; descriptions too;
- tags are the declaration's, plus `ai:confirm` unless it says `confirm: false`: a foreign
  server's tools are gated by default;
- a result's text becomes the tool_result content; one with images (of a type the Messages API
  takes) becomes content blocks, text and images (`content_blocks`); `isError` raises
  `ToolError`, so the model gets an `is_error` result; a call that fails or outlasts `timeout`
  too; text over `max_output` keeps its head and tail, and an image over `max_image` makes
  the result an `is_error` (the dispatch does both, `fisk_sm.tools.base.ToolBox.invoke`);
- the declaration's `crash_policy` applies on resume, as for any tool.

Each connection lives in a task of its own, because the SDK's transports hold anyio task groups
that must be left by the task that entered them, while the run that calls the tools and the
code that closes the harness may be other tasks. `McpServers.aclose` stops them all: a stdio
server's process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import mcp.types
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from fisk_sm.config.errors import one_line
from fisk_sm.config.mcp import McpServer
from fisk_sm.tools.base import Content, Tool, ToolError, ToolLoadError
from fisk_sm.tools.foreign import Offered, local_names
from fisk_sm.tools.gate import CONFIRM_TAG
from fisk_sm.tools.mcp_stdio import ServerProcess, stdio_transport

__all__ = ["IMAGE_TYPES", "McpConnection", "McpError", "McpServers", "content_blocks"]

#: The image media types the Messages API takes (in a tool_result too).
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


class McpError(ToolLoadError):
    """An MCP server could not be started, initialized or listed; the run must not start."""


#: What a call to a server may raise: the SDK's error (an `isError`-less failure, its own
#: timeout), a stream closed by a server that died (anyio, in a task group), the transport's,
#: an answer that does not parse (pydantic's ValidationError is a ValueError).
#: Anything else is a bug, and `ToolSet._call` still makes it the call's is_error result.
_CALL_ERRORS = (
    MCPError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ValueError,
    OSError,
    TimeoutError,
    ExceptionGroup,
)


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the SDK's task groups wrap them."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException, timeout: float) -> str:
    exc = _leaf(exc)
    # The SDK reports a request that outlasted its read timeout as an error of its own.
    if isinstance(exc, TimeoutError) or getattr(exc, "code", None) == mcp.types.REQUEST_TIMEOUT:
        return f"no answer within {timeout:g}s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return one_line(exc, 300) or type(exc).__name__


def tool_tags(server: McpServer) -> tuple[str, ...]:
    """The tags of the server's tools: the declared ones, then `ai:confirm` unless
    `confirm: false`."""
    if not server.confirm or CONFIRM_TAG in server.tags:
        return server.tags
    return (*server.tags, CONFIRM_TAG)


def content_blocks(result: mcp.types.CallToolResult) -> list[dict[str, Any]]:
    """The result as Messages API content blocks: text, images of a type the API takes, and a
    short note for anything else (audio, other binaries, resource links)."""
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, mcp.types.TextContent):
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, mcp.types.ImageContent) and item.mime_type in IMAGE_TYPES:
            source = {"type": "base64", "media_type": item.mime_type, "data": item.data}
            blocks.append({"type": "image", "source": source})
        elif isinstance(item, mcp.types.EmbeddedResource) and isinstance(
            item.resource, mcp.types.TextResourceContents
        ):
            blocks.append({"type": "text", "text": item.resource.text})
        else:
            blocks.append({"type": "text", "text": f"[{_kind(item)} content left out]"})
    if not blocks and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
        blocks.append({"type": "text", "text": text})
    return blocks


def _kind(item: Any) -> str:
    return str(getattr(item, "mime_type", None) or getattr(item, "type", "unknown"))


def result_text(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The blocks as one text: an image is named by its media type."""
    parts = [
        str(b["text"]) if b["type"] == "text" else f"[image: {b['source']['media_type']}]"
        for b in blocks
    ]
    return "\n".join(parts)


@attrs.define(eq=False)
class McpConnection:
    """One connected server: its initialized session, what it listed, and its process (stdio)."""

    server: McpServer
    session: ClientSession = attrs.field(repr=False)
    listed: list[mcp.types.Tool] = attrs.field(repr=False)
    process: ServerProcess | None = None
    _stop: asyncio.Event = attrs.field(factory=asyncio.Event, repr=False)
    _task: asyncio.Task[None] | None = attrs.field(default=None, repr=False)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str | Content:
        """Call tool `name` (its name on the server); ToolError for an `isError` result or a
        failed call."""
        where = f"MCP tool {name!r} of server {self.server.where}"
        try:
            result = await self.session.call_tool(
                name, dict(arguments), read_timeout_seconds=self.server.timeout
            )
        except _CALL_ERRORS as exc:
            raise ToolError(f"{where} failed: {_reason(exc, self.server.timeout)}") from None
        blocks = content_blocks(result)
        text = result_text(blocks)
        if result.is_error:
            raise ToolError(text or f"{where} reported an error")
        if any(block["type"] == "image" for block in blocks):
            return Content(text, tuple(blocks))
        return text

    def tool(self, listed: mcp.types.Tool, name: str) -> Tool:
        """The run's `Tool` for `listed`, registered as `name`."""

        async def call(**arguments: Any) -> str | Content:
            return await self.call(listed.name, arguments)

        call.__name__ = call.__qualname__ = name
        return Tool(
            name=name,
            description=listed.description or listed.title or listed.name,
            input_schema=dict(listed.input_schema),
            fn=call,
            crash_policy=self.server.crash_policy,
            tags=tool_tags(self.server),
            kind="mcp",
            agent=self.server.alias,
            max_output=self.server.max_output,
            max_image=self.server.max_image,
        )

    async def aclose(self) -> None:
        """Close the session and the transport (a stdio server's group is killed); idempotent."""
        self._stop.set()
        task = self._task
        if task is not None:
            await asyncio.shield(task)  # the owner task leaves what it entered


@contextlib.asynccontextmanager
async def _transport(
    server: McpServer, work_dir: Path
) -> AsyncIterator[tuple[TransportStreams, ServerProcess | None]]:
    if server.url is not None:
        async with streamable_http_client(server.url) as streams:
            yield streams, None
    else:
        started = stdio_transport(server.command, work_dir=work_dir, pass_env=server.pass_env)
        async with started as (streams, process):
            yield streams, process


async def _list_tools(session: ClientSession) -> list[mcp.types.Tool]:
    listed: list[mcp.types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp.types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return listed


async def _own(server: McpServer, work_dir: Path, ready: asyncio.Future[McpConnection]) -> None:
    """Connect, publish the connection through `ready`, and hold it until it is stopped."""
    process: ServerProcess | None = None
    try:
        async with (
            _transport(server, work_dir) as (streams, process),
            ClientSession(*streams, read_timeout_seconds=server.timeout) as session,
        ):
            with anyio.fail_after(server.timeout):
                await session.initialize()
                listed = await _list_tools(session)
            connection = McpConnection(server, session, listed, process)
            connection._task = asyncio.current_task()
            ready.set_result(connection)
            await connection._stop.wait()
    except BaseException as exc:
        if not ready.done():
            words = process.last_words() if process is not None else ""
            reason = _reason(exc, server.timeout) + (f" (stderr: {words})" if words else "")
            ready.set_exception(McpError(f"MCP server {server.where} did not start: {reason}"))
        if not isinstance(exc, Exception):
            raise
        # A server that dies mid-run ends here; its tools' calls then fail as is_error results.


async def connect(server: McpServer, work_dir: Path) -> McpConnection:
    """Start (stdio) or reach (http) `server`, initialize a session and list its tools."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[McpConnection] = loop.create_future()
    task = loop.create_task(_own(server, work_dir, ready), name=f"mcp:{server.alias}")
    try:
        return await asyncio.shield(ready)
    except BaseException:
        if ready.done() and not ready.cancelled() and ready.exception() is None:
            await ready.result().aclose()  # connected, but our caller was cancelled
        else:
            task.cancel()  # still starting: the transport kills what it started
            # Its end as asked (`_own` puts any other failure in `ready`); then ours is raised.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
            if ready.done() and not ready.cancelled():
                ready.exception()  # seen: that it did not start is no news to our caller
        raise


@attrs.define(eq=False)
class McpServers:
    """The connected MCP servers of one run, and the tools they contribute."""

    connections: list[McpConnection] = attrs.Factory(list)
    tools: list[Tool] = attrs.Factory(list)

    @classmethod
    async def open(
        cls, servers: Sequence[McpServer], *, taken: Collection[str], work_dir: Path
    ) -> McpServers:
        """Connect every server (together), then name their tools; on any failure the ones
        connected are closed and the first failure (in declaration order) is raised."""
        results = await asyncio.gather(
            *(connect(server, work_dir) for server in servers), return_exceptions=True
        )
        opened = cls([r for r in results if isinstance(r, McpConnection)])
        try:
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            pairs = [(c, listed) for c in opened.connections for listed in c.listed]
            offered = [
                Offered(c.server.alias, t.name, f"tool {t.name!r} of MCP server {c.server.where}")
                for c, t in pairs
            ]
            names = local_names(offered, taken, McpError)
        except BaseException:
            await opened.aclose()
            raise
        opened.tools = [c.tool(t, name) for (c, t), name in zip(pairs, names, strict=True)]
        return opened

    def server_of(self, tool: Tool) -> McpConnection | None:
        """The connection `tool` comes from (None for a tool that is not an MCP server's)."""
        return next((c for c in self.connections if c.server.alias == tool.agent), None)

    async def aclose(self) -> None:
        """Close every connection; idempotent."""
        await asyncio.gather(*(c.aclose() for c in self.connections), return_exceptions=True)

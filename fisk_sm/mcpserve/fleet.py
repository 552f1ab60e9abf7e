"""`fisk-sm mcp-serve --supervisor URL`: a supervisor's control API as MCP tools, its runs as
resources, through `fisk_sm.client` (`AsyncClient`).

Tools: `submit`, `list_runs`, `show_run`, `approvals`, `approve`, `suspend`, `resume`, `abort`
and `wait`, each annotated as what it is (reads `readOnlyHint`; `approve` and `abort`
`destructiveHint`: the gate inside the supervisor stays the real defence). Each run is the
resource `fisk-sm://runs/{id}`: its JSON, with its transcript and its path on the machine. On
the pinned revision (2026-07-28) a client follows a run's changes with `subscriptions/listen`
(`resource_subscriptions=[uri]`) and gets `notifications/resources/updated` for it: the
server reads the supervisor's event stream and publishes an update per run event. Every result
is capped like a tool's result (`fisk_sm.tools.output.cap_text`); a refusal of the API is the
call's error, in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Literal, cast

import attrs
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from fisk_sm.client.aio import AsyncClient
from fisk_sm.client.base import run_path
from fisk_sm.client.errors import ClientError
from fisk_sm.client.records import Run, StreamEvent
from fisk_sm.config.limits import MAX_OUTPUT
from fisk_sm.operator.sanitize import sanitize
from fisk_sm.tools.output import cap_text

__all__ = ["DONE", "Fleet", "run_uri", "serve_fleet"]

#: A run's statuses once it ended or was suspended (what `wait` waits for with `until="done"`).
DONE = frozenset(
    {"completed", "failed", "budget_exhausted", "iterations_exhausted", "aborted", "suspended"}
)
READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
CHANGE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTROY = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def run_uri(run_id: str) -> str:
    """The resource of a run."""
    return f"fisk-sm://runs/{run_id}"


def _json(value: object) -> str:
    def plain(obj: object) -> object:
        if attrs.has(type(obj)):
            return attrs.asdict(cast(attrs.AttrsInstance, obj))
        raise TypeError(type(obj).__name__)

    text, _ = cap_text(json.dumps(value, default=plain, ensure_ascii=False), MAX_OUTPUT)
    return text


def _result(value: object) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=_json(value))])


def _refused(exc: Exception) -> CallToolResult:
    text = sanitize(str(exc), 500) or type(exc).__name__
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class Fleet:
    """The supervisor's tools and resources, served by `mcp`."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.bus = InMemorySubscriptionBus()
        self.mcp = MCPServer(
            "fisk-sm supervisor",
            instructions="The runs of a fisk-sm supervisor: submit, watch, approve.",
            log_level="WARNING",
            subscriptions=self.bus,
        )
        tool = self.mcp.tool
        tool(
            description="Start a run of PROMPT (NAME: a label; CONFIG: an agent.yaml under the"
            " supervisor's --config-dir, else its own agent).",
            annotations=CHANGE,
        )(self.submit)
        tool(description="The runs, newest first.", annotations=READ)(self.list_runs)
        tool(description="One run: transcript, path, counters.", annotations=READ)(self.show_run)
        tool(description="The tool calls waiting for an answer.", annotations=READ)(self.approvals)
        tool(
            description="Answer a waiting tool call: once, always (for the run) or deny.",
            annotations=DESTROY,
        )(self.approve)
        tool(description="Suspend a run (resumable).", annotations=CHANGE)(self.suspend)
        tool(description="Resume a suspended run.", annotations=CHANGE)(self.resume)
        tool(description="Abort a run for good.", annotations=DESTROY)(self.abort)
        tool(
            description="Wait until a run is parked on an approval or done (at most SECONDS).",
            annotations=READ,
        )(self.wait)
        self.mcp.resource(
            "fisk-sm://runs/{id}",
            name="run",
            description="A run: its status, transcript and path on the machine (JSON).",
            mime_type="application/json",
        )(self.run_resource)

    async def _call(self, request: Awaitable[object]) -> CallToolResult:
        try:
            return _result(await request)
        except ClientError as exc:
            return _refused(exc)

    async def submit(
        self, prompt: str, name: str | None = None, config: str | None = None
    ) -> CallToolResult:
        """`submit` (`config`: an agent.yaml the supervisor may run, by its own rules)."""
        return await self._call(self.client.submit(prompt, name, config))

    async def list_runs(self) -> CallToolResult:
        """`list_runs`: without transcripts."""
        return await self._call(self.client.runs())

    async def show_run(self, run_id: str) -> CallToolResult:
        """`show_run`."""
        return await self._call(self.client.run(run_id))

    async def approvals(self) -> CallToolResult:
        """`approvals`."""
        return await self._call(self.client.approvals())

    async def approve(
        self, run_id: str, tool_use_id: str, answer: Literal["once", "always", "deny"]
    ) -> CallToolResult:
        """`approve`."""
        return await self._call(self.client.answer(run_id, tool_use_id, answer))

    async def suspend(self, run_id: str) -> CallToolResult:
        """`suspend`."""
        return await self._call(self.client.suspend(run_id))

    async def resume(self, run_id: str) -> CallToolResult:
        """`resume`."""
        return await self._call(self.client.resume(run_id))

    async def abort(self, run_id: str) -> CallToolResult:
        """`abort`."""
        return await self._call(self.client.abort(run_id))

    async def wait(
        self, run_id: str, until: Literal["parked", "done"] = "done", seconds: float = 60.0
    ) -> CallToolResult:
        """`wait`: the run once its status is `until` (parked: waiting for an approval)."""
        try:
            run_path(run_id)  # nothing from the client is trusted as a path
            found = await asyncio.wait_for(self._until(run_id, until), max(0.0, seconds))
        except TimeoutError:
            return _refused(TimeoutError(f"wait: {run_id} is not {until} after {seconds:g}s"))
        except (ClientError, ValueError) as exc:
            return _refused(exc)
        return _result(found)

    async def _until(self, run_id: str, until: str) -> Run:
        def stopped(run: Run) -> bool:  # where it is waited for, or past it (it ended)
            return run.status in DONE or (until == "parked" and run.status == "parked")

        stream = self.client.events(run=run_id)
        try:
            run = await self.client.run(run_id)  # after subscribing: nothing is missed
            if stopped(run):
                return run
            async for event in stream:
                if event.lost_events or event.name in ("RunParked", "RunUpdated", "RunEnded"):
                    run = await self.client.run(run_id)
                    if stopped(run):
                        return run
        finally:
            close = getattr(stream, "aclose", None)  # the stream's connection, at once
            if close is not None:
                await close()
        raise ClientError("wait: the event stream ended")

    async def run_resource(self, id: str) -> str:
        """The resource `fisk-sm://runs/{id}`."""
        return _json(await self.client.run(id))

    async def follow(self) -> None:
        """Publish a resource update for each run event of the supervisor (until cancelled)."""
        async for event in self.client.events():
            await self._updated(event)

    async def _updated(self, event: StreamEvent) -> None:
        run_id = event.run_id
        if run_id is not None:
            await self.bus.publish(ResourceUpdated(uri=run_uri(run_id)))


async def serve_fleet(url: str, token: str | None, listen: str | None, served: str | None) -> int:
    """Serve the supervisor at `url` over MCP (stdio, or HTTP at `listen`)."""
    from fisk_sm.mcpserve.command import serve

    async with AsyncClient(url, token) as client:
        fleet = Fleet(client)
        follow = asyncio.ensure_future(fleet.follow())
        try:
            await serve(fleet.mcp, listen, served, "mcp-serve")
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientError):  # stopped, or lost
                await follow
    return 0

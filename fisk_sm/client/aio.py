"""`AsyncClient`: the control API of a `fisk-sm supervise`, on asyncio, on httpx2 (imported when
the first client is made). The same methods as `Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fisk_sm.client import calls
from fisk_sm.client.base import RETRY_STATUSES, STREAM_SILENCE, Base, Resume
from fisk_sm.client.calls import Call
from fisk_sm.client.records import Approval, Run, StreamEvent

__all__ = ["AsyncClient"]


class AsyncClient(Base):
    """The control API at `url` (default: as `fisk-sm ctl` finds it) with `token` (default:
    `$FISK_SM_TOKEN`). Each method is one request; a refusal is a typed `ClientError`.
    Use it as an async context manager, or `await close()` it."""

    def __init__(self, url: str | None = None, token: str | None = None, **kw: Any) -> None:
        super().__init__(url, token, **kw)
        import httpx2

        self._httpx = httpx2
        self._http = httpx2.AsyncClient(timeout=self.timeout, trust_env=False)

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, call: Call) -> Any:
        try:
            response = await self._http.request(
                call.method, self.url + call.path, json=call.body, headers=self.headers()
            )
        except self._httpx.TransportError as exc:
            raise self.unavailable(exc) from None
        if not 200 <= response.status_code < 300:
            raise self.refused(response.status_code, response.content)
        return call.parse(response.content)

    async def runs(self) -> list[Run]:
        """Every run, newest first."""
        found: list[Run] = await self._send(calls.runs())
        return found

    async def run(self, run_id: str) -> Run:
        """One run, with its transcript's tail and the states it went through (`path`)."""
        found: Run = await self._send(calls.run(run_id))
        return found

    async def submit(
        self, prompt: str, name: str | None = None, config: str | None = None, chat: bool = False
    ) -> Run:
        """Start a run of `prompt` (a chat waits for `say` after each answer)."""
        found: Run = await self._send(calls.submit(prompt, name, config, chat))
        return found

    async def suspend(self, run_id: str) -> Run:
        """Suspend a run."""
        found: Run = await self._send(calls.action(run_id, "suspend"))
        return found

    async def resume(self, run_id: str) -> Run:
        """Resume a suspended run."""
        found: Run = await self._send(calls.action(run_id, "resume"))
        return found

    async def abort(self, run_id: str) -> Run:
        """Abort a run for good."""
        found: Run = await self._send(calls.action(run_id, "abort"))
        return found

    async def end(self, run_id: str) -> Run:
        """End a chat run: it completes."""
        found: Run = await self._send(calls.action(run_id, "end"))
        return found

    async def say(self, run_id: str, text: str) -> Run:
        """Post a follow-up to a chat run waiting for input."""
        found: Run = await self._send(calls.say(run_id, text))
        return found

    async def approvals(self) -> list[Approval]:
        """The approvals waiting for an answer."""
        found: list[Approval] = await self._send(calls.approvals())
        return found

    async def answer(self, run_id: str, tool_use_id: str, answer: str) -> Run:
        """Answer an approval: "once", "always" or "deny"."""
        found: Run = await self._send(calls.answer(run_id, tool_use_id, answer))
        return found

    async def diagram_svg(self, run_id: str) -> str:
        """The state diagram of a run's path, as SVG."""
        found: str = await self._send(calls.diagram_svg(run_id))
        return found

    async def openapi(self) -> dict[str, Any]:
        """The control API's OpenAPI document."""
        found: dict[str, Any] = await self._send(calls.openapi())
        return found

    async def events(
        self, run: str | None = None, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The event stream (of `run` only, if given), after `last_event_id` if given, for as
        long as it is read. A dropped connection is reopened with the last id read (nothing
        missed, nothing twice); an `EventsGap` comes when that was not possible (reload the
        runs and approvals); `StreamLost` once `retries` reconnections in a row failed."""
        resume = Resume(self, run, last_event_id)
        timeout = self._httpx.Timeout(self.timeout, read=STREAM_SILENCE)
        while True:
            params, headers = resume.request()
            why: BaseException | str
            try:
                async with self._http.stream(
                    "GET",
                    self.url + "/api/events",
                    params=params,
                    headers=headers,
                    timeout=timeout,
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        why = f"HTTP {response.status_code}"
                    elif response.status_code != 200:
                        raise self.refused(response.status_code, await response.aread())
                    else:
                        async for line in response.aiter_lines():
                            event = resume.feed(line)
                            if event is not None:
                                yield event
                        why = "the supervisor closed the stream"
            except self._httpx.TransportError as exc:
                why = exc
            await asyncio.sleep(resume.broke(why))

"""`Client`: the control API of a `fisk-sm supervise`, synchronously, on httpx2 (imported when
the first client is made)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fisk_sm.client import calls
from fisk_sm.client.base import RETRY_STATUSES, STREAM_SILENCE, Base, Resume
from fisk_sm.client.calls import Call
from fisk_sm.client.records import Approval, Run, StreamEvent

__all__ = ["Client"]


class Client(Base):
    """The control API at `url` (default: as `fisk-sm ctl` finds it) with `token` (default:
    `$FISK_SM_TOKEN`). Each method is one request; a refusal is a typed `ClientError`.
    Use it as a context manager, or `close()` it."""

    def __init__(self, url: str | None = None, token: str | None = None, **kw: Any) -> None:
        super().__init__(url, token, **kw)
        import httpx2

        self._httpx = httpx2
        self._http = httpx2.Client(timeout=self.timeout, trust_env=False)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call) -> Any:
        try:
            response = self._http.request(
                call.method, self.url + call.path, json=call.body, headers=self.headers()
            )
        except self._httpx.TransportError as exc:
            raise self.unavailable(exc) from None
        if not 200 <= response.status_code < 300:
            raise self.refused(response.status_code, response.content)
        return call.parse(response.content)

    def runs(self) -> list[Run]:
        """Every run, newest first."""
        found: list[Run] = self._send(calls.runs())
        return found

    def run(self, run_id: str) -> Run:
        """One run, with its transcript's tail and the states it went through (`path`)."""
        found: Run = self._send(calls.run(run_id))
        return found

    def submit(
        self, prompt: str, name: str | None = None, config: str | None = None, chat: bool = False
    ) -> Run:
        """Start a run of `prompt` (a chat waits for `say` after each answer)."""
        found: Run = self._send(calls.submit(prompt, name, config, chat))
        return found

    def suspend(self, run_id: str) -> Run:
        """Suspend a run."""
        found: Run = self._send(calls.action(run_id, "suspend"))
        return found

    def resume(self, run_id: str) -> Run:
        """Resume a suspended run."""
        found: Run = self._send(calls.action(run_id, "resume"))
        return found

    def abort(self, run_id: str) -> Run:
        """Abort a run for good."""
        found: Run = self._send(calls.action(run_id, "abort"))
        return found

    def end(self, run_id: str) -> Run:
        """End a chat run: it completes."""
        found: Run = self._send(calls.action(run_id, "end"))
        return found

    def say(self, run_id: str, text: str) -> Run:
        """Post a follow-up to a chat run waiting for input."""
        found: Run = self._send(calls.say(run_id, text))
        return found

    def approvals(self) -> list[Approval]:
        """The approvals waiting for an answer."""
        found: list[Approval] = self._send(calls.approvals())
        return found

    def answer(self, run_id: str, tool_use_id: str, answer: str) -> Run:
        """Answer an approval: "once", "always" or "deny"."""
        found: Run = self._send(calls.answer(run_id, tool_use_id, answer))
        return found

    def diagram_svg(self, run_id: str) -> str:
        """The state diagram of a run's path, as SVG."""
        found: str = self._send(calls.diagram_svg(run_id))
        return found

    def openapi(self) -> dict[str, Any]:
        """The control API's OpenAPI document."""
        found: dict[str, Any] = self._send(calls.openapi())
        return found

    def events(
        self, run: str | None = None, last_event_id: str | None = None
    ) -> Iterator[StreamEvent]:
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
                with self._http.stream(
                    "GET",
                    self.url + "/api/events",
                    params=params,
                    headers=headers,
                    timeout=timeout,
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        why = f"HTTP {response.status_code}"
                    elif response.status_code != 200:
                        raise self.refused(response.status_code, response.read())
                    else:
                        for line in response.iter_lines():
                            event = resume.feed(line)
                            if event is not None:
                                yield event
                        why = "the supervisor closed the stream"
            except self._httpx.TransportError as exc:
                why = exc
            time.sleep(resume.broke(why))

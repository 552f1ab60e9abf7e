"""What the sync and the async client share: the requests' paths, headers and bodies, the
mapping of answers to records and typed errors, and the reconnection of the event stream."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fisk_sm.client.errors import (
    BadAnswer,
    BadRequest,
    StreamLost,
    Unavailable,
    error_for,
)
from fisk_sm.client.locate import (
    default_token,
    default_url,
    token_problem,
    url_problem,
)
from fisk_sm.client.records import GAP, StreamEvent, event_from
from fisk_sm.client.sse import SseParser

__all__ = [
    "ANSWERS",
    "RETRY_STATUSES",
    "STREAM_SILENCE",
    "Base",
    "Resume",
    "answer_of",
    "json_of",
    "listed",
    "run_path",
]

ANSWERS = ("once", "always", "deny")
#: How long a request (not the event stream) may wait for its answer.
TIMEOUT = 30.0
#: How long the event stream may be silent: the supervisor pings every 15 s, so a longer
#: silence is a connection that died without a word (it is reconnected).
STREAM_SILENCE = 45.0
#: Statuses a proxy answers while the supervisor is away: the event stream retries them.
RETRY_STATUSES = (502, 503, 504)


class Base:
    """The URL, token and request shapes of a client of the control API."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT,
        retries: int = 5,
        backoff: float = 0.2,
    ) -> None:
        url = url or default_url(env)
        problem = url_problem(url)
        if problem is not None:
            raise BadRequest(f"url: {problem}")
        token = token or default_token(env)
        if token and (problem := token_problem(token)) is not None:
            raise BadRequest(f"token: {problem}")
        if retries < 0 or backoff < 0:
            raise ValueError("retries and backoff must not be negative")
        self.url = url.rstrip("/")
        self.token = token or None
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def headers(self) -> dict[str, str]:
        """Every request's headers: JSON, and the bearer token if there is one."""
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def refused(self, status: int, body: bytes) -> Exception:
        """The typed error of a non-2xx answer, with the server's one line."""
        try:
            message = str(json.loads(body)["error"])
        except (ValueError, KeyError, TypeError):
            message = body[:200].decode("utf-8", "replace") or f"HTTP {status}"
        return error_for(status, f"the supervisor answered {status}: {message}")

    def unavailable(self, exc: BaseException) -> Unavailable:
        """No answer (or half of one) from the supervisor."""
        return Unavailable(
            f"cannot reach the supervisor at {self.url}: {exc or type(exc).__name__}"
        )


def run_path(run_id: str, *rest: str) -> str:
    """`/api/runs/RUN/...`; a RUN or TOOL_USE_ID that could step out of it is a BadRequest."""
    import urllib.parse

    from fisk_sm.journal.ids import run_id_problem

    problem = run_id_problem(run_id)
    if problem is not None:
        raise BadRequest(f"run_id: {problem}")
    return "/".join(["/api/runs", *(urllib.parse.quote(p, safe="") for p in (run_id, *rest))])


def answer_of(answer: str) -> dict[str, str]:
    """The body of an answer to an approval."""
    if answer not in ANSWERS:
        raise BadRequest(f"answer: must be one of once, always, deny; not {answer!r}")
    return {"answer": answer}


def json_of(body: bytes) -> Any:
    """The answer's JSON, or a BadAnswer."""
    try:
        return json.loads(body)
    except ValueError:
        raise BadAnswer("the server's answer is not JSON: is that a fisk-sm supervisor?") from None


def listed(value: Any, key: str) -> list[Any]:
    """`value[key]`, a list, of the answer's object."""
    if not isinstance(value, dict) or not isinstance(value.get(key), list):
        raise BadAnswer(f"{key}: missing from the supervisor's answer")
    items: list[Any] = value[key]
    return items


class Resume:
    """One `events()` call's reconnection: the last id read, the failures in a row, and the
    parser of the current connection."""

    def __init__(self, base: Base, run: str | None, last_event_id: str | None) -> None:
        if run is not None:
            run_path(run)  # the same check as every other run id
        self.base = base
        self.run = run
        self.last_event_id = last_event_id or None
        self.failures = 0
        self.parser = SseParser()

    def request(self) -> tuple[dict[str, str], dict[str, str]]:
        """The query parameters and headers of the next connection (and a fresh parser)."""
        self.parser = SseParser()
        params = {"run": self.run} if self.run else {}
        headers = {**self.base.headers(), "Accept": "text/event-stream"}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        return params, headers

    def feed(self, line: str) -> StreamEvent | None:
        """Take one line of the stream; the event it completes, if any (its id noted)."""
        parsed = self.parser.feed(line)
        if parsed is None:
            return None
        event = event_from(*parsed)
        if event.id:
            self.last_event_id = event.id
        if event.name != GAP:
            self.failures = 0  # the stream works again: the retries start afresh
        return event

    def broke(self, why: BaseException | str) -> float:
        """The connection broke (or never came): seconds to wait before the next, or a
        StreamLost once `retries` reconnections in a row have failed."""
        self.failures += 1
        if self.failures > self.base.retries:
            raise StreamLost(
                f"the event stream of {self.base.url} broke off and {self.base.retries}"
                f" reconnection(s) failed ({why}); the last event read: "
                f"{self.last_event_id or 'none'}",
                self.last_event_id,
            )
        return min(self.base.backoff * 2.0 ** (self.failures - 1), 10.0)

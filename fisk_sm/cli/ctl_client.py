"""The HTTP side of `fisk-sm ctl`: the control API over `urllib.request`, no other dependency.

`Client.call` returns the body of a 2xx answer; anything else becomes a `CtlError` carrying the
exit code it means: 69 no supervisor answered at the URL (refused, unreachable, timed out),
77 the token was refused (401, 403), 2 the server refused the input (400, 413 too large), 1 any
other refusal (404 unknown run or approval, 409 wrong state, 421 a Host the supervisor does not
answer under). `read_sse` parses a text/event-stream as it comes. The URL and token are found
by `fisk_sm.client.locate`, the exit codes are `fisk_sm.client.errors`' (the Python client's).
"""

from __future__ import annotations

from fisk_sm.client.errors import EXIT_NOPERM, EXIT_UNAVAILABLE, exit_code
from fisk_sm.client.locate import DEFAULT_URL, default_url, token_problem, url_problem
from fisk_sm.client.sse import SseParser
from fisk_sm.operator.sanitize import sanitize, say

# `ctl --help` imports this module and needs none of json, urllib, pathlib or typing (together
# some 8 ms, a third of a bare interpreter): each is imported where it is first used.
#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import urllib.error
    import urllib.request
    from collections.abc import Iterator
    from typing import Any

__all__ = [
    "DEFAULT_URL",
    "EXIT_NOPERM",
    "EXIT_UNAVAILABLE",
    "Client",
    "CtlError",
    "EventFeed",
    "default_url",
    "parse_json",
    "read_events",
    "read_sse",
]

#: How long a request (not the event stream) may wait for its answer.
TIMEOUT = 30.0


class CtlError(Exception):
    """What ends `ctl` early: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _checked_url(url: str) -> str:
    """`url` without a trailing slash, or a CtlError (exit 2) naming --url."""
    problem = url_problem(url)
    if problem is not None:
        raise CtlError(f"--url: {problem}", 2)
    return url.rstrip("/")


def _checked_token(token: str) -> str:
    problem = token_problem(token)
    if problem is not None:
        raise CtlError(f"--token: {problem}", 2)
    return token


class Client:
    """The control API at `url`, with `token` (if any) as a bearer token."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = _checked_url(url)
        self.token = _checked_token(token) if token else None

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None or method != "GET":  # the API takes a POST only as JSON (415)
            import json

            data = json.dumps({} if body is None else body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        import urllib.request

        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        import urllib.error
        import urllib.request

        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise _refusal(e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CtlError(
                f"cannot connect to the supervisor at {self.url}: {reason}", EXIT_UNAVAILABLE
            ) from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        """The body of the server's (2xx) answer to `method path`."""
        with self._open(self._request(method, path, body), TIMEOUT) as response:
            try:
                return bytes(response.read())
            except OSError as e:  # a timeout too
                raise CtlError(f"{self.url}: the answer broke off: {e}", EXIT_UNAVAILABLE) from None

    def stream(self, path: str, last_event_id: str | None = None) -> Any:
        """The open response of the event stream at `path` (once subscribed, before any event),
        after `last_event_id` if given: read it with `read_sse`."""
        request = self._request("GET", path, None)
        request.add_header("Accept", "text/event-stream")
        if last_event_id:
            request.add_header("Last-Event-ID", last_event_id)
        return self._open(request, None)


def _refusal(error: urllib.error.HTTPError) -> CtlError:
    """The server's `{"error": ...}` as one line, with the exit code its status means."""
    import json

    try:
        message = str(json.loads(error.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        message = str(error.reason)
    status = error.code
    return CtlError(
        f"the supervisor answered {status}: {sanitize(message, 300)}", exit_code(status)
    )


def read_sse(lines: Any) -> Iterator[tuple[str | None, str, str]]:
    """Parse a text/event-stream: each event's id (None without one), name (default "message")
    and joined data lines."""
    parser = SseParser()
    for raw in lines:
        event = parser.feed(raw)
        if event is not None:
            yield event
    last = parser.end()
    if last is not None:
        yield last


def read_events(lines: Any) -> Iterator[tuple[str, str]]:
    """Parse a text/event-stream: each event's name (default "message") and joined data lines."""
    for _, name, data in read_sse(lines):
        yield name, data


#: Reconnections in a row `EventFeed` tries before it gives up (exit 69), the first pause and
#: the longest (some 20 s in all: a supervisor restarting, a proxy's hiccup).
RETRIES, BACKOFF, MOST = 8, 0.2, 5.0


class EventFeed:
    """The event stream at `path`, read as (id, name, data); a dropped connection is opened
    again with the id of the last event read (a one-line note on stderr), so that the server
    replays what was missed or says `EventsGap`. Gives up (CtlError, exit 69) after `RETRIES`
    failed reconnections in a row. `open()` subscribes before the first event is read."""

    def __init__(self, client: Client, path: str) -> None:
        self.client, self.path = client, path
        self.last_id: str | None = None
        self.response: Any = None

    def open(self) -> None:
        """Subscribe (again, after the last id read)."""
        self.response = self.client.stream(self.path, self.last_id)

    def close(self) -> None:
        """Drop the connection."""
        if self.response is not None:
            self.response.close()
            self.response = None

    def __iter__(self) -> Iterator[tuple[str | None, str, str]]:
        import http.client
        import time

        failures, first = 0, ""
        try:
            while True:
                try:
                    if self.response is None:
                        self.open()
                    for event in read_sse(self.response):
                        if event[0]:
                            self.last_id = event[0]
                        if event[1] != "EventsGap":
                            failures, first = 0, ""  # it works again: retries start afresh
                        yield event
                    why = "closed the event stream"
                except CtlError as e:
                    if e.code != EXIT_UNAVAILABLE:
                        raise  # refused (a token, a bad id): no retry will help
                    why = str(e)
                except (OSError, http.client.HTTPException) as e:
                    why = f"broke off the event stream ({e.__class__.__name__}: {e})"
                self.close()
                first, failures = first or why, failures + 1
                if failures > RETRIES:
                    raise CtlError(
                        f"the supervisor at {self.client.url} {first}; {RETRIES}"
                        f" reconnection(s) failed (last: {sanitize(why, 200)})",
                        EXIT_UNAVAILABLE,
                    )
                delay = min(BACKOFF * 2.0 ** (failures - 1), MOST)
                say(
                    f"fisk-sm ctl: the supervisor at {self.client.url} {sanitize(why, 200)};"
                    f" reconnecting after event {self.last_id or '(none yet)'} in {delay:.1f}s"
                )
                time.sleep(delay)
        finally:
            self.close()


def parse_json(body: bytes) -> Any:
    """`body` parsed as JSON, or a CtlError (exit 1) saying the server is not a supervisor."""
    import json

    try:
        return json.loads(body)
    except ValueError:
        raise CtlError(
            "the server's answer is not JSON: is that a fisk-sm supervisor?", 1
        ) from None

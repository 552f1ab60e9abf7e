"""The HTTP side of `fisk-sm ctl`: the control API over `urllib.request`, no other dependency.

`Client.call` returns the body of a 2xx answer; anything else becomes a `CtlError` carrying the
exit code it means: 69 no supervisor answered at the URL (refused, unreachable, timed out),
77 the token was refused (401, 403), 2 the server refused the input (400, 413 too large), 1 any
other refusal (404 unknown run or approval, 409 wrong state, 421 a Host the supervisor does not
answer under). `read_events` parses a text/event-stream as it comes.
"""

from __future__ import annotations

import os

from fisk_sm.operator.sanitize import sanitize

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
    "default_url",
    "parse_json",
    "read_events",
]

DEFAULT_URL = "http://127.0.0.1:8765"
#: No supervisor answered (sysexits.h EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: The supervisor refused the token (sysexits.h EX_NOPERM).
EXIT_NOPERM = 77
#: How long a request (not the event stream) may wait for its answer.
TIMEOUT = 30.0


class CtlError(Exception):
    """What ends `ctl` early: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def default_url(env: dict[str, str] | None = None) -> str:
    """`$FISK_SM_URL`, else the URL in the default sessions directory's `supervisor.url`
    (`$XDG_STATE_HOME/fisk-sm/runs`), else 127.0.0.1:8765."""
    env = dict(os.environ) if env is None else env
    if env.get("FISK_SM_URL"):
        return env["FISK_SM_URL"]
    from fisk_sm.journal.statedir import default_directory

    try:  # where `supervise` writes it with the default sessions directory
        written = (default_directory(env) / "supervisor.url").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        written = ""
    return written.strip() or DEFAULT_URL


def _checked_url(url: str) -> str:
    """`url` without a trailing slash, or a CtlError (exit 2) naming --url."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CtlError(f"--url: not an http(s) URL: {sanitize(url, 200)}", 2)
    try:
        parts.port  # noqa: B018 - the property validates the port
    except ValueError:
        raise CtlError(f"--url: bad port in {sanitize(url, 200)}", 2) from None
    return url.rstrip("/")


def _checked_token(token: str) -> str:
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in token):
        raise CtlError("--token: only printable ASCII without spaces is allowed", 2)
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

    def stream(self, path: str) -> Any:
        """The open response of the event stream at `path` (once subscribed, before any event):
        read it with `_sse`."""
        request = self._request("GET", path, None)
        request.add_header("Accept", "text/event-stream")
        return self._open(request, None)


def _refusal(error: urllib.error.HTTPError) -> CtlError:
    """The server's `{"error": ...}` as one line, with the exit code its status means."""
    import json

    try:
        message = str(json.loads(error.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        message = str(error.reason)
    status = error.code
    code = {400: 2, 401: EXIT_NOPERM, 403: EXIT_NOPERM, 413: 2}.get(status, 1)
    return CtlError(f"the supervisor answered {status}: {sanitize(message, 300)}", code)


def read_events(lines: Any) -> Iterator[tuple[str, str]]:
    """Parse a text/event-stream: each event's name (default "message") and joined data lines."""
    name, data = "", list[str]()
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name or "message", "\n".join(data)
            name, data = "", list[str]()
        elif line.startswith(":"):
            continue  # a comment: the server's keep-alive
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    if data:
        yield name or "message", "\n".join(data)


def parse_json(body: bytes) -> Any:
    """`body` parsed as JSON, or a CtlError (exit 1) saying the server is not a supervisor."""
    import json

    try:
        return json.loads(body)
    except ValueError:
        raise CtlError(
            "the server's answer is not JSON: is that a fisk-sm supervisor?", 1
        ) from None

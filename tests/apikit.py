"""Raw requests to a live control API (`http.client`), every header the test's to choose.

A browser's attack is in its headers (`Host` after DNS rebinding, `Origin`, `Sec-Fetch-Site`,
`Content-Type`): `send` sets exactly those given, and `Answer` keeps the status, the headers and
the body as they came.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

from ctlkit import DEADLINE, Supervisor

__all__ = ["JSON", "Answer", "send"]

JSON = {"Content-Type": "application/json"}


class Answer:
    """A raw answer: status, headers (lower-case names) and body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def error(self) -> str:
        """The one-line `{"error": ...}` message."""
        value = json.loads(self.body)
        assert isinstance(value, dict) and set(value) == {"error"}, self.body
        message = str(value["error"])
        assert "\n" not in message
        return message

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:200]!r})"


def send(
    sup: Supervisor,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    *,
    host: str | None = None,
    token: bool = True,
    read: bool = True,
) -> Answer:
    """One request with exactly these headers (`Host` the URL's unless `host`), the token added
    when the supervisor has one (and `token`); a dict or list `body` is sent as JSON text."""
    parts = urlsplit(sup.url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=DEADLINE)
    given = {"Host": host if host is not None else parts.netloc, **(headers or {})}
    if sup.token and token:
        given["Authorization"] = f"Bearer {sup.token}"
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    try:
        chunked = data is not None and not isinstance(data, bytes)
        connection.request(method, path, body=data, headers=given, encode_chunked=chunked)
        response = connection.getresponse()
        got = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, got, response.read() if read else b"")
    finally:
        connection.close()

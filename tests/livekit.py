"""A live control API for the tests that throw everything at it (schemathesis, hypothesis).

`live(root)` starts a real `fisk-sm supervise` (ctlkit's, with its gated `deploy` tool) against
a fake Messages API that answers any conversation: its first turn calls `deploy` (so the run
parks for an approval), every later turn answers text. `runs_of` lists the runs the supervisor
knows; `error_of` checks an error body is the API's one-line `{"error": ...}`. `raw` sends one
request over http.client exactly as given: the method, the path, the headers (Host included)
and the bytes, nothing added but Content-Length.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ctlkit import Supervisor

from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.testing.conversations import turn_of

__all__ = ["Answer", "error_of", "live", "raw", "responder", "runs_of"]

#: (status, headers with lower-case names, body bytes)
Answer = tuple[int, dict[str, str], bytes]


def responder(body: dict[str, Any]) -> Reply:
    """Any conversation: deploy first (the run parks at the approval desk), then a text."""
    if turn_of(body) == 0:
        return Reply.tool_use("deploy", {"target": "anywhere"})
    return Reply.text("done")


@contextmanager
def live(root: Path, token: str | None = None) -> Iterator[tuple[Supervisor, FakeMessagesAPI]]:
    """A real supervise process and the fake API it talks to (both stopped at the end)."""
    root.mkdir(parents=True, exist_ok=True)
    with (
        FakeMessagesAPI(responder=responder) as api,
        Supervisor(root, api, token=token) as sup,
    ):
        yield sup, api


def runs_of(sup: Supervisor) -> list[dict[str, Any]]:
    """Every run the supervisor lists (over the API, with its token)."""
    status, body = sup.api("GET", "/api/runs")
    assert status == 200, (status, body)
    runs: list[dict[str, Any]] = body["runs"]
    return runs


def error_of(data: bytes) -> str:
    """The message of a one-line JSON error body (fails the test if it is not one)."""
    assert b"\n" not in data, data[:300]
    value = json.loads(data)
    assert isinstance(value, dict) and set(value) == {"error"}, value
    message = value["error"]
    assert isinstance(message, str) and message and "\n" not in message, value
    return message


def raw(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    read: bool = True,
) -> Answer:
    """One request on a fresh connection (Host: the URL's unless given); the answer, its body
    unread if not `read` (an event stream)."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    given = {"Host": where.netloc, **(headers or {})}
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in given.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        data = response.read() if read else b""
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        connection.close()

"""A typed client of `fisk-sm supervise`'s control API: `Client` (sync) and `AsyncClient`.

Runs, approvals and events are typed records; refusals are typed errors with the exit code
`fisk-sm ctl` uses; the URL and token are found as `ctl` finds them; `events()` reconnects after
a dropped connection with the last event id it read. Importing this package is cheap: httpx2
is imported when the first client is made.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from fisk_sm.client.aio import AsyncClient
    from fisk_sm.client.errors import (
        BadAnswer,
        BadRequest,
        ClientError,
        Conflict,
        NotFound,
        StreamLost,
        Unauthorized,
        Unavailable,
        WrongHost,
    )
    from fisk_sm.client.locate import default_token, default_url
    from fisk_sm.client.records import Approval, Entry, EventsGap, Run, StreamEvent, Tokens
    from fisk_sm.client.sync import Client

_EXPORTS = {
    "AsyncClient": "fisk_sm.client.aio",
    "BadAnswer": "fisk_sm.client.errors",
    "BadRequest": "fisk_sm.client.errors",
    "ClientError": "fisk_sm.client.errors",
    "Conflict": "fisk_sm.client.errors",
    "NotFound": "fisk_sm.client.errors",
    "StreamLost": "fisk_sm.client.errors",
    "Unauthorized": "fisk_sm.client.errors",
    "Unavailable": "fisk_sm.client.errors",
    "WrongHost": "fisk_sm.client.errors",
    "default_token": "fisk_sm.client.locate",
    "default_url": "fisk_sm.client.locate",
    "Approval": "fisk_sm.client.records",
    "Entry": "fisk_sm.client.records",
    "EventsGap": "fisk_sm.client.records",
    "Run": "fisk_sm.client.records",
    "StreamEvent": "fisk_sm.client.records",
    "Tokens": "fisk_sm.client.records",
    "Client": "fisk_sm.client.sync",
}
__all__ = [
    "Approval",
    "AsyncClient",
    "BadAnswer",
    "BadRequest",
    "Client",
    "ClientError",
    "Conflict",
    "Entry",
    "EventsGap",
    "NotFound",
    "Run",
    "StreamEvent",
    "StreamLost",
    "Tokens",
    "Unauthorized",
    "Unavailable",
    "WrongHost",
    "default_token",
    "default_url",
]
__getattr__, __dir__ = exports(__name__, _EXPORTS)

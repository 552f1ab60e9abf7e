"""SDK clients shared by the runs of an event loop: one per (base URL, API key).

Building an `anthropic.AsyncAnthropic` takes about 60 ms (its SSL context), the first one also
imports the SDK (1 to 2 s), and each holds a connection pool: a supervisor's hundreds of runs
must not each make one on the event loop. So a model `acquire`s its client when it is built (never
inside a run's step), every run on the loop with the same base URL and key shares it, and the
client is closed when its last user `release`s it. `warm_up` builds the shared client (and
imports the SDK) in a worker thread beforehand, so that not even the first run blocks the loop;
`start_session` and `resume_session` call it.

The sharing is per event loop because a pooled connection cannot move from one loop to another.
A model built while no loop is running (a debugger's `SyncRun`, a script that builds its run
before `asyncio.run`) gets a client of its own. The clients are built on aiohttp
(`fisk_sm.model.transport`), whose session holds its loop: the clients of a loop closed without
releasing them are closed when a client is next taken on another loop, not kept forever.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

import attrs

from fisk_sm.config.agent import LLMConfig
from fisk_sm.model.transport import close_soon, new_client

if TYPE_CHECKING:  # the SDK takes a second or two to import: `warm_up` does it off the loop
    import asyncio

    import anthropic

__all__ = ["ClientKey", "ClientShare", "acquire", "client_key", "warm_up"]

#: (base URL or None for the SDK's default, API key).
ClientKey = tuple[str | None, str]
#: A model's own request options: (timeout in seconds, max retries).
Options = tuple[float, int]


def client_key(base_url: str | None, api_key: str | None) -> ClientKey:
    """The key of the client a model of `base_url` and `api_key` uses (the SDK's env defaults
    resolved, so that a changed environment never reuses a client made for the old one)."""
    url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
    # "unset": building a run needs no key; the API refuses the call if it needs one.
    return url, api_key or os.environ.get("ANTHROPIC_API_KEY") or "unset"


def _new_client(key: ClientKey) -> anthropic.AsyncAnthropic:
    base_url, api_key = key
    return new_client(base_url, api_key)


def _with(client: anthropic.AsyncAnthropic, options: Options) -> anthropic.AsyncAnthropic:
    """A view of `client` with `options`, on its connection pool (closing it closes the pool)."""
    timeout, max_retries = options
    return client.with_options(timeout=timeout, max_retries=max_retries)


#: A client and its view, as a warm-up builds them.
_Built = tuple["anthropic.AsyncAnthropic", "anthropic.AsyncAnthropic"]


@attrs.define(eq=False)
class _Entry:
    client: anthropic.AsyncAnthropic
    users: int = 0
    # One view per distinct options: the first copy of a client runs the SDK's slow protocol
    # checks (~0.4 ms), so runs of one config share their view too.
    views: dict[Options, anthropic.AsyncAnthropic] = attrs.Factory(dict)

    def view(self, options: Options) -> anthropic.AsyncAnthropic:
        found = self.views.get(options)
        if found is None:
            found = self.views[options] = _with(self.client, options)
        return found


@attrs.define(eq=False)
class _LoopClients:
    entries: dict[ClientKey, _Entry] = attrs.Factory(dict)
    warming: dict[tuple[ClientKey, Options], asyncio.Future[_Built]] = attrs.Factory(dict)


# A loop that is gone takes its clients with it.
_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = (
    weakref.WeakKeyDictionary()
)


def _clients_of(loop: asyncio.AbstractEventLoop) -> _LoopClients:
    """`loop`'s clients. Those of closed loops are dropped and closed: an aiohttp session
    holds its loop, so the weak mapping alone would never let them go."""
    for closed in [other for other in _BY_LOOP if other.is_closed()]:
        close_soon(entry.client for entry in _BY_LOOP.pop(closed).entries.values())
    return _BY_LOOP.setdefault(loop, _LoopClients())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@attrs.define(eq=False)
class ClientShare:
    """One model's hold on a client (`client`: its view with the model's options);
    `release()` lets go of it (idempotent)."""

    client: anthropic.AsyncAnthropic
    _key: ClientKey
    _entry: _Entry | None = None  # None: a client of its own
    _clients: _LoopClients | None = None
    _released: bool = False

    async def release(self) -> None:
        """Drop this hold; the client is closed once nobody else holds it."""
        if self._released:
            return
        self._released = True
        entry, clients = self._entry, self._clients
        if entry is None or clients is None:
            await self.client.close()
            return
        entry.users -= 1
        if entry.users == 0:
            if clients.entries.get(self._key) is entry:
                del clients.entries[self._key]
            await entry.client.close()


def acquire(key: ClientKey, options: Options) -> ClientShare:
    """A hold on the running loop's client for `key`, seen with `options` (built now if
    `warm_up` did not). With no loop running, a client of its own: see the module docstring."""
    loop = _running_loop()
    if loop is None:
        return ClientShare(_with(_new_client(key), options), key)
    clients = _clients_of(loop)
    entry = clients.entries.get(key)
    if entry is None:
        entry = clients.entries[key] = _Entry(_new_client(key))
    entry.users += 1
    return ClientShare(entry.view(options), key, entry, clients)


def _build(key: ClientKey, options: Options, client: anthropic.AsyncAnthropic | None) -> _Built:
    client = client or _new_client(key)
    return client, _with(client, options)


async def warm_up(llm: LLMConfig, api_key: str | None = None, max_retries: int = 2) -> None:
    """Build this loop's shared client for `llm` and its view (importing the SDK) in a worker
    thread. Concurrent calls for one key share one build; what is already there is kept."""
    import asyncio

    key = client_key(llm.base_url, api_key)
    options = (llm.budget.call_timeout, max_retries)
    clients = _clients_of(asyncio.get_running_loop())
    entry = clients.entries.get(key)
    if entry is not None and options in entry.views:
        return
    pending = clients.warming.get((key, options))
    if pending is None:
        base = entry.client if entry is not None else None
        pending = asyncio.ensure_future(asyncio.to_thread(_build, key, options, base))
        clients.warming[key, options] = pending

        def built(future: asyncio.Future[_Built]) -> None:
            del clients.warming[key, options]
            if future.cancelled() or future.exception() is not None:
                return
            client, view = future.result()
            kept = clients.entries.setdefault(key, _Entry(client))
            if kept.client is client:  # else a racing build won: its own view comes later
                kept.views.setdefault(options, view)

        pending.add_done_callback(built)
    await asyncio.shield(pending)

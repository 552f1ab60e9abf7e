"""The supervisor's event hub: every run's typed events, fanned out to the stream's subscribers.

Each run's sink (`RunSink`) keeps what the run JSON shows live (the states entered) and hands
every event to the hub: the JSON Lines adapter's fields, with `"type"` the event's class name.
A subscriber (one `GET /api/events`) gets a bounded queue: a slow reader never blocks the runs;
it misses events instead, and is told how many before the next one it gets (an `EventsDropped`
note).

Every event gets an id, `<boot>-<seq>`: `boot` a random hex token of this hub (so an id of
another process is never taken for ours), `seq` counting from 1 over every run. The hub keeps
the last `buffer` events, so that a reader that lost its connection can resubscribe `after` the
last id it got and miss nothing; if what it missed is no longer held (or the id is another
boot's) its stream starts with an `EventsGap` note instead: reload the listing.

Only what is watched is paid for. An event is held as it came (a typed event, a run's
`RunRow`), not encoded: its JSON is built once, when a subscriber wants it (the same text for
every subscriber) or a resume replays it. With no events held (`--event-buffer 0`) an event
nobody subscribes to is only numbered, and before anyone subscribed not even that (nobody has
an id of this hub): a run's sink then asks the loop to build no events but the states entered.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fisk_sm.events.adapters import event_fields
from fisk_sm.events.types import Event, StateEntered
from fisk_sm.supervisor.interface import DROPPED, GAP, Subscription, parse_event_id

__all__ = [
    "BUFFER",
    "DROPPED",
    "GAP",
    "EventHub",
    "Held",
    "RunSink",
    "Subscriber",
    "event_json",
    "parse_event_id",
]

QUEUE_SIZE = 1000
#: How many of the last events the hub keeps for readers that reconnect.
BUFFER = 4096

#: An event as a subscriber gets it: (seq, name, JSON text).
Item = tuple[int, str, str]
#: An event's JSON object, or what builds it when it is first read, or its JSON text already
#: encoded (by a worker process: sent as is).
Data = dict[str, Any] | Callable[[], dict[str, Any]] | str


def event_json(event: Event) -> dict[str, Any]:
    """The JSON object of a typed event: `{"type": ClassName, "run_id": ..., ...fields}`."""
    return {"type": type(event).__name__, **event_fields(event)}


_ENCODER = json.JSONEncoder(default=str)  # json.dumps(data, default=str), built once


def encode(data: dict[str, Any]) -> str:
    """An event's JSON text."""
    return _ENCODER.encode(data)


class Held:
    """One published event: numbered, its JSON built at most once, when first read."""

    __slots__ = ("_data", "_item", "name", "run_id", "seq")

    def __init__(self, seq: int, name: str, run_id: str, data: Data) -> None:
        self.seq, self.name, self.run_id = seq, name, run_id
        self._data: Data | None = data
        self._item: Item | None = None

    def item(self) -> Item:
        """The event as subscribers get it, encoded on the first call (the same text after)."""
        if self._item is None:
            data = self._data
            assert data is not None
            if not isinstance(data, str):  # else encoded already (by a worker)
                data = encode(data() if callable(data) else data)
            self._item = (self.seq, self.name, data)
            self._data = None
        return self._item


class Subscriber:
    """One reader of the stream: a bounded queue, optionally of one run's events, after
    `replay` (the held events it missed, or a gap note)."""

    def __init__(
        self,
        run_id: str | None,
        size: int = QUEUE_SIZE,
        replay: list[Item] | None = None,
        *,
        boot: str = "",
    ) -> None:
        self.run_id = run_id
        self.boot = boot  # the hub's: an event's id is `<boot>-<seq>`
        self.queue: asyncio.Queue[Item | None] = asyncio.Queue(size)
        self.dropped = 0
        self.replay = replay or []

    def wants(self, run_id: str) -> bool:
        """Whether this subscriber reads `run_id`'s events."""
        return self.run_id in (None, run_id)

    def offer(self, run_id: str, item: Item) -> None:
        """Queue `item` unless it is another run's or the queue is full (then count it)."""
        if not self.wants(run_id):
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1

    def close(self) -> None:
        """End the stream (after what is queued)."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            self.queue.get_nowait()  # one event fewer, but the end gets through
            self.dropped += 1
            self.queue.put_nowait(None)

    async def items(self) -> AsyncIterator[Item]:
        """The replayed items, then the queued ones as they come (none twice), a drop note
        first when some were missed."""
        last = 0
        for item in self.replay:
            last = item[0]
            yield item
        self.replay = []
        while True:
            queued = await self.queue.get()
            if queued is None:
                return
            item = queued
            if item[0] <= last:  # replayed already (the queue was filled while replaying)
                continue
            if self.dropped:
                note = {"type": DROPPED, "run_id": self.run_id, "dropped": self.dropped}
                self.dropped = 0
                # the note's id: resuming from it goes on with this item (the drop is told)
                yield item[0] - 1, DROPPED, json.dumps(note)
            yield item

    async def events(self) -> AsyncIterator[tuple[str, str, str]]:
        """`items` with each event's id (`interface.Subscription`)."""
        async for seq, name, data in self.items():
            yield f"{self.boot}-{seq}", name, data


class EventHub:
    """Fans every published event out to the subscribers, and holds the last `buffer`."""

    def __init__(self, buffer: int = BUFFER) -> None:
        if buffer < 0:
            raise ValueError(f"buffer must be at least 0, not {buffer}")
        self.subscribers: set[Subscriber] = set()
        self.boot = secrets.token_hex(8)
        self.seq = 0
        self.held: deque[Held] = deque(maxlen=buffer)
        self.listened = False  # whether any reader has subscribed (and so knows `boot`)

    @property
    def numbering(self) -> bool:
        """Whether events are numbered: they are held, or someone subscribed (knows `boot`)."""
        return self.listened or bool(self.held.maxlen)

    def watches(self, run_id: str) -> bool:
        """Whether an event of `run_id` published now may be read: it is held (a resume may
        replay it), or a subscriber wants it. Else `publish` only numbers it (`skip`)."""
        if self.held.maxlen:
            return True
        return any(subscriber.wants(run_id) for subscriber in self.subscribers)

    def resize(self, buffer: int) -> None:
        """Hold the last `buffer` events from now on (the newest of those held stay)."""
        if buffer < 0:
            raise ValueError(f"buffer must be at least 0, not {buffer}")
        self.held = deque(self.held, maxlen=buffer)

    def event_id(self, seq: int) -> str:
        """The id of this hub's event `seq`."""
        return f"{self.boot}-{seq}"

    def subscribe(self, run_id: str | None = None, after: str | None = None) -> Subscriber:
        """A new subscriber (of one run, or of all); with `after` (a parsed-valid event id),
        first the held events after it, or a gap note if some are no longer held."""
        replay: list[Item] = []
        if after is not None:
            replay = self._replay(run_id, after)
        subscriber = Subscriber(run_id, replay=replay, boot=self.boot)
        self.listened = True
        self.subscribers.add(subscriber)  # no await since the replay: nothing slips between
        return subscriber

    def _replay(self, run_id: str | None, after: str) -> list[Item]:
        parsed = parse_event_id(after)
        if parsed is None:
            raise ValueError(f"not an event id: {after!r}")
        boot, seq = parsed
        oldest = self.held[0].seq if self.held else self.seq + 1
        if boot != self.boot:
            reason = "the id is of another supervisor process (it restarted): reload"
        elif seq > self.seq:
            reason = "the id is not one this supervisor gave: reload"
        elif seq + 1 < oldest:
            reason = f"{oldest - seq - 1} event(s) after it are no longer held: reload"
        else:
            return [e.item() for e in self.held if e.seq > seq and _wanted(run_id, e.run_id)]
        return self._gap(after, reason)

    def _gap(self, after: str, reason: str) -> list[Item]:
        """The gap note a reader resuming after `after` gets instead of the events."""
        note = {"type": GAP, "last_event_id": after, "reason": reason}
        return [(self.seq, GAP, json.dumps(note))]

    def unsubscribe(self, subscriber: Subscription) -> None:
        """Stop feeding `subscriber` (one of this hub's)."""
        if isinstance(subscriber, Subscriber):
            self.subscribers.discard(subscriber)

    def publish(self, name: str, run_id: str, data: Data) -> None:
        """Number one event, hold it, and send it to every subscriber that wants it: `data`
        (or what the callable builds, once) is encoded once, when a subscriber wants it or a
        resume replays it. Unwatched, only numbered (`skip`)."""
        held = self.held
        if not (held.maxlen or self.watches(run_id)):
            self.skip()
            return
        self.seq += 1
        event = Held(self.seq, name, run_id, data)
        if held.maxlen:
            held.append(event)
        if self.subscribers:
            for subscriber in tuple(self.subscribers):
                if subscriber.wants(run_id):
                    subscriber.offer(run_id, event.item())

    def skip(self) -> None:
        """An event that nobody may read (`watches` is false): numbered if `numbering` (a
        resume must see the hole), else not even that."""
        if self.numbering:
            self.seq += 1

    def close(self) -> None:
        """End every stream."""
        for subscriber in tuple(self.subscribers):
            subscriber.close()
        self.subscribers.clear()


def _wanted(run_id: str | None, of: str) -> bool:
    return run_id in (None, of)


class RunSink:
    """A run's event sink: notes the states it enters, publishes each event to the hub, and
    calls `changed(run_id)` on the events that change its row (a state entered)."""

    def __init__(self, run_id: str, hub: EventHub, changed: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.hub = hub
        self.changed = changed
        self.states: list[str] = []

    def wants(self, kind: type[Event]) -> bool:
        """The states entered always (the run's path, its row); the rest while the hub numbers
        events (`EventHub.numbering`): else nobody could ever read them."""
        return self.hub.numbering or issubclass(kind, StateEntered)

    def emit(self, event: Event) -> None:
        """Note `event`, and publish it (its JSON built only when read)."""
        self.hub.publish(type(event).__name__, event.run_id, partial(event_json, event))
        if isinstance(event, StateEntered):
            self.states.append(event.state)
            self.changed(event.run_id)

"""The supervisor's event hub: every run's typed events, fanned out to the stream's subscribers.

Each run's sink (`RunSink`) keeps what the run JSON shows live (the states entered) and hands
every event to the hub as `(name, JSON text)`: the JSON Lines adapter's fields, with `"type"`
the event's class name. A subscriber (one `GET /api/events`) gets a bounded queue: a slow
reader never blocks the runs; it misses events instead, and is told how many before the next
one it gets (an `EventsDropped` note).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fisk_sm.events.adapters import event_fields
from fisk_sm.events.types import Event, StateEntered

__all__ = ["DROPPED", "EventHub", "RunSink", "Subscriber", "event_json"]

#: The note a subscriber gets after it missed events.
DROPPED = "EventsDropped"
QUEUE_SIZE = 1000

Item = tuple[str, str]


def event_json(event: Event) -> dict[str, Any]:
    """The JSON object of a typed event: `{"type": ClassName, "run_id": ..., ...fields}`."""
    return {"type": type(event).__name__, **event_fields(event)}


class Subscriber:
    """One reader of the stream: a bounded queue, optionally of one run's events."""

    def __init__(self, run_id: str | None, size: int = QUEUE_SIZE) -> None:
        self.run_id = run_id
        self.queue: asyncio.Queue[Item | None] = asyncio.Queue(size)
        self.dropped = 0

    def offer(self, run_id: str, item: Item) -> None:
        """Queue `item` unless it is another run's or the queue is full (then count it)."""
        if self.run_id not in (None, run_id):
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
        """The queued items as they come, a drop note first when some were missed."""
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if self.dropped:
                note = {"type": DROPPED, "run_id": self.run_id, "dropped": self.dropped}
                self.dropped = 0
                yield DROPPED, json.dumps(note)
            yield item


class EventHub:
    """Fans every published event out to the subscribers."""

    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()

    def subscribe(self, run_id: str | None = None) -> Subscriber:
        """A new subscriber (of one run, or of all)."""
        subscriber = Subscriber(run_id)
        self.subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop feeding `subscriber`."""
        self.subscribers.discard(subscriber)

    def publish(self, name: str, run_id: str, data: dict[str, Any]) -> None:
        """Send one event to every subscriber that wants it (encoded once)."""
        if not self.subscribers:
            return
        item = (name, json.dumps(data, default=str))
        for subscriber in tuple(self.subscribers):
            subscriber.offer(run_id, item)

    def close(self) -> None:
        """End every stream."""
        for subscriber in tuple(self.subscribers):
            subscriber.close()
        self.subscribers.clear()


class RunSink:
    """A run's event sink: notes the states it enters, publishes each event to the hub, and
    calls `changed(run_id)` on the events that change its row (a state entered)."""

    def __init__(self, run_id: str, hub: EventHub, changed: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.hub = hub
        self.changed = changed
        self.states: list[str] = []

    def emit(self, event: Event) -> None:
        """Note and publish `event`."""
        if isinstance(event, StateEntered):
            self.states.append(event.state)
        self.hub.publish(type(event).__name__, event.run_id, event_json(event))
        if isinstance(event, StateEntered):
            self.changed(event.run_id)

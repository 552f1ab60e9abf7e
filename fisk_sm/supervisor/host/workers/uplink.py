"""The event stream across the pipe: a worker's `UplinkHub`, the front's `FrontHub`.

Only what is watched crosses. The front's hub says which events it wants (`Watch`: all of
them once a reader subscribed while events are held, or while one reads every run; else the
runs its readers follow), and sends that to every worker whenever it changes. A worker's
`UplinkHub` then encodes a watched event once, in the worker, and sends the events of one loop
tick in one `Events` note; an unwatched event is not even built (the runs' sinks ask the hub).
The front numbers each event in the order it arrives (`<boot>-<seq>`, the front's ids whatever
worker sent it, across a worker's death too), holds it for readers that reconnect and fans it
out, as a lone supervisor's hub does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fisk_sm.supervisor.host.workers.frames import Events, Watch
from fisk_sm.supervisor.interface import Subscription, parse_event_id
from fisk_sm.supervisor.view.hub import BUFFER, Data, EventHub, Subscriber, encode

__all__ = ["FrontHub", "UplinkHub"]


class UplinkHub(EventHub):
    """A worker's hub: the watched events, encoded, sent up in one `Events` note per tick."""

    def __init__(self, send: Callable[[Events], None]) -> None:
        super().__init__(buffer=0)
        self.send = send
        self.watch = Watch()  # nothing, until the front says
        self._batch: list[tuple[str, str, str]] = []

    @property
    def numbering(self) -> bool:
        """Whether the front wants any event (else the runs build none but their states)."""
        return self.watch.all or bool(self.watch.runs)

    def watches(self, run_id: str) -> bool:
        """Whether the front wants `run_id`'s events."""
        return self.watch.all or run_id in self.watch.runs

    def publish(self, name: str, run_id: str, data: Data) -> None:
        """Encode a watched event now and queue it for this tick's `Events` note."""
        if not self.watches(run_id):
            return
        if not self._batch:
            asyncio.get_running_loop().call_soon(self.flush)
        text = data if isinstance(data, str) else encode(data() if callable(data) else data)
        self._batch.append((run_id, name, text))

    def skip(self) -> None:
        """An unwatched event: the front numbers only what it gets."""

    def flush(self) -> None:
        """Send the queued events up (one note)."""
        batch, self._batch = self._batch, []
        if batch:
            self.send(Events(tuple(batch)))


class FrontHub(EventHub):
    """The front's hub: numbers and fans out the workers' events; tells `on_watch` (which
    sends it to every worker) what it wants whenever that changes."""

    def __init__(self, buffer: int = BUFFER, on_watch: Callable[[Watch], None] | None = None):
        super().__init__(buffer)
        self.on_watch = on_watch
        self.wanted = Watch()
        #: The seq (never given to an event) where the workers were told to send every event:
        #: a resume from an id before it would miss what they did not send: a gap note.
        self.whole_after = 0
        self._whole = False  # whether every event crosses since `whole_after`

    def want(self) -> Watch:
        """What the readers may read: every event once one subscribed while events are held
        (a resume may replay any), or while one reads every run; else their runs'."""
        subscribers = self.subscribers
        if (self.listened and self.held.maxlen) or any(s.run_id is None for s in subscribers):
            return Watch(all=True)
        return Watch(runs=frozenset(s.run_id for s in subscribers if s.run_id is not None))

    def _wants_changed(self) -> None:
        wanted = self.want()
        if wanted != self.wanted:
            if wanted.all:
                self._hole()
            else:
                self._whole = False
            self.wanted = wanted
            if self.on_watch is not None:
                self.on_watch(wanted)

    def resize(self, buffer: int) -> None:
        """Hold the last `buffer` events (and tell the workers if that changes what crosses)."""
        super().resize(buffer)
        self._wants_changed()

    def _hole(self) -> None:
        """Every event is sent up from now on: a seq no event gets marks where (once)."""
        if not self._whole:
            self._whole = True
            self.seq += 1
            self.whole_after = self.seq

    def subscribe(self, run_id: str | None = None, after: str | None = None) -> Subscriber:
        """A new reader (see `EventHub.subscribe`); the workers are told what it wants. A
        reader that makes every event cross gets ids from after the hole (`_hole`)."""
        if not self.wanted.all and (self.held.maxlen or run_id is None):
            self._hole()
        subscriber = super().subscribe(run_id, after)
        self._wants_changed()
        return subscriber

    def unsubscribe(self, subscriber: Subscription) -> None:
        """A reader gone; the workers are told if less crosses now."""
        super().unsubscribe(subscriber)
        self._wants_changed()

    def _replay(self, run_id: str | None, after: str) -> list[tuple[int, str, str]]:
        """`EventHub._replay`, and a gap note for an id from before every event was sent up
        (a lone supervisor holds every event; the workers send only what someone watched)."""
        parsed = parse_event_id(after)
        if parsed is not None and parsed[0] == self.boot and parsed[1] < self.whole_after:
            return self._gap(
                after, "events from before anyone read the stream were not kept: reload"
            )
        return super()._replay(run_id, after)

    def take(self, events: Events) -> None:
        """A worker's events, numbered in the order they came."""
        for run_id, name, text in events.items:
            self.publish(name, run_id, text)  # encoded by the worker: held and sent as it is

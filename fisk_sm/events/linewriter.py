"""Text lines written to their streams by one background thread, never on the event loop.

Writing to a file, or to a pipe that a slow reader drains, can block for as long as the disk or
the reader takes; on a supervisor's event loop that would stall every run. So an event sink
queues its line with `put` and returns; one daemon thread writes the lines in the order they were
queued and flushes each stream it wrote to at the end of each batch, so a reader sees every event
within one batch. `drain()` waits until every line queued before it is written and flushed; the
lines still queued when the interpreter exits are drained too.

A stream whose write or flush fails keeps its first error on its `Lane`, and its later lines are
dropped (the stream's state is unknown); the sink reports the error when it is closed.
"""

from __future__ import annotations

import atexit
import threading
from typing import TextIO

import attrs

from fisk_sm.events.threads import Batches, PerProcess

__all__ = ["Lane", "LineWriter", "shared_line_writer"]


@attrs.define(eq=False)
class Lane:
    """One stream's lane through the writer, with its first error."""

    stream: TextIO
    error: Exception | None = None


def _flush(lanes: dict[Lane, None]) -> None:
    for lane in lanes:
        try:
            lane.stream.flush()
        except (OSError, ValueError) as exc:  # a full disk, a gone reader; a closed stream
            lane.error = lane.error or exc
    lanes.clear()


class LineWriter:
    """A daemon thread writing queued lines; see the module docstring."""

    def __init__(self) -> None:
        self._batches: Batches[tuple[Lane, str] | threading.Event] = Batches()
        self._thread: threading.Thread | None = None

    def put(self, lane: Lane, text: str) -> None:
        """Queue `text` for `lane`'s stream; returns at once."""
        with self._batches.cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="fisk-lines", daemon=True)
                self._thread.start()
                atexit.register(self.drain, 5.0)  # daemon threads die at exit: finish first
            self._batches.put_locked((lane, text))

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every line queued so far is written and flushed; False on a timeout."""
        written = threading.Event()
        with self._batches.cond:
            if self._thread is None:
                return True
            self._batches.put_locked(written)
        return written.wait(timeout)

    def _serve(self) -> None:
        while True:
            batch = self._batches.take()
            touched: dict[Lane, None] = {}  # an ordered set
            for item in batch:
                if isinstance(item, threading.Event):
                    _flush(touched)
                    item.set()
                    continue
                lane, text = item
                if lane.error is not None:
                    continue
                try:
                    lane.stream.write(text)
                except (OSError, ValueError) as exc:  # as in `_flush`; the sink reports it
                    lane.error = exc
                else:
                    touched[lane] = None
            _flush(touched)


_SHARED = PerProcess(LineWriter)


def shared_line_writer() -> LineWriter:
    """The process's writer (its thread starts with the first write)."""
    return _SHARED.get()

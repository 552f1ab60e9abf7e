"""How the loop's output reaches the screen: its typed events and its streamed text, as
Textual messages posted to the app (the same sinks the line UI is, no hook of its own).

`TuiEvents` is an `Events` sink: each event becomes an `EventPosted` message. The model's
streamed text (`AnthropicModel(on_text=...)`) is appended to a shared `StreamBuffer`, and a
`TextStreamed` message is posted for it; such a message `can_replace` a pending one of the same
buffer, so however fast the tokens come, the app takes the text in as few messages as it has
time for (as Toolong coalesces its file updates), never one repaint per token.
"""

from __future__ import annotations

from typing import Protocol

from textual.message import Message

from fisk_sm.events.types import Event

__all__ = ["EventPosted", "Poster", "StreamBuffer", "TextStreamed", "TuiEvents"]


class Poster(Protocol):
    """What messages are posted to: the app (thread-safe: events may come from a worker)."""

    def post_message(self, message: Message) -> bool: ...


class EventPosted(Message):
    """One event of the run."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class StreamBuffer:
    """The text streamed since the app last took it."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        #: every piece ever appended, counted (for the bench and the tests)
        self.received = 0

    def take(self) -> str:
        """The text appended since the last take (and empty the buffer)."""
        text = "".join(self.pieces)
        self.pieces.clear()
        return text


class TextStreamed(Message):
    """Text has been streamed into `buffer`; a later one of the same buffer replaces it."""

    def __init__(self, buffer: StreamBuffer) -> None:
        super().__init__()
        self.buffer = buffer

    def can_replace(self, message: Message) -> bool:
        """A pending message of the same buffer says nothing this one does not."""
        return isinstance(message, TextStreamed) and message.buffer is self.buffer


class TuiEvents:
    """The loop's events and streamed text, posted to `target` (set by the app on mount;
    what comes before is held and posted then)."""

    def __init__(self) -> None:
        self.target: Poster | None = None
        self.held: list[Message] = []
        self.buffer = StreamBuffer()

    def wants(self, kind: type[Event]) -> bool:
        """Every kind: the panes show them all."""
        return True

    def attach(self, target: Poster) -> None:
        """Post to `target` from now on (what was held first)."""
        self.target = target
        held, self.held = self.held, []
        for message in held:
            target.post_message(message)

    def _post(self, message: Message) -> None:
        if self.target is None:
            self.held.append(message)
        else:
            self.target.post_message(message)

    def emit(self, event: Event) -> None:
        """Post `event`."""
        self._post(EventPosted(event))

    def on_text(self, text: str) -> None:
        """The streamed-text callback: append `text`, and say so."""
        self.buffer.pieces.append(text)
        self.buffer.received += 1
        self._post(TextStreamed(self.buffer))

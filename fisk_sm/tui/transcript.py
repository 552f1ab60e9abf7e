"""The transcript pane: the conversation, one line per message, each unfolded on demand.

Every message (a prompt, the model's text, a tool call with its arguments, a tool's result) is
one `Entry`: folded, it is one line (controls stripped, whitespace collapsed, cut with an
ellipsis at the pane's edge), so a hostile message cannot take more room than any other; Enter
(or a click) unfolds it, capped at `text.BLOCK_LINES` lines and `text.BLOCK_CHARS` characters
(the rest counted). Tool results stay folded; a completed run's answer, and each answer of a
chat, is unfolded to be read.

The model's text streams into the entry of its turn as the app takes it from the stream
buffer (coalesced, `sink.TextStreamed`); folded, the entry shows the text's tail while it
streams. The reply's `MessageReceived` then sets the entry to the text the loop kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.events import Click
from textual.widgets import Static

from fisk_sm.cli.lineui import transcript_lines
from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.tui.text import block, line

__all__ = ["Entry", "Transcript"]

#: The most entries kept (the oldest go first).
MAX_ENTRIES = 1000
#: How much of a streaming text the folded line shows (its tail).
TAIL = 400


class Entry(Static, can_focus=True):
    """One message: a label (who or what) and its text, folded to one line or unfolded."""

    DEFAULT_CSS = """
    Entry { height: auto; }
    Entry.folded { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    Entry:focus { background: $boost; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "fold", "fold/unfold")]

    def __init__(self, label: str, text: str, *, style: str = "", folded: bool = True) -> None:
        super().__init__(classes="folded" if folded else "")
        self.label, self.style = label, style
        self.pieces = [text]
        self.streaming = False

    @property
    def text(self) -> str:
        """The whole message."""
        if len(self.pieces) > 1:
            self.pieces = ["".join(self.pieces)]
        return self.pieces[0]

    @property
    def folded(self) -> bool:
        """Whether it shows as one line."""
        return self.has_class("folded")

    def on_mount(self) -> None:
        """Draw it."""
        self.show()

    def show(self) -> None:
        """Redraw (folded: one line, the tail while streaming; unfolded: the text, capped)."""
        head = Content.styled(f"{self.label} ", self.style)
        if not self.folded:
            self.update(head + Content("\n") + block(self.text))
        elif self.streaming:
            self.update(head + line("…" + self._tail(), TAIL + 1))
        else:
            self.update(head + line(self.text[: TAIL * 4], TAIL * 4))

    def _tail(self) -> str:
        tail: list[str] = []
        size = 0
        for piece in reversed(self.pieces):
            tail.append(piece)
            size += len(piece)
            if size >= TAIL:
                break
        return "".join(reversed(tail))[-TAIL:]

    def extend(self, text: str) -> None:
        """Append streamed `text`."""
        self.pieces.append(text)
        self.show()

    def set_text(self, text: str) -> None:
        """Replace the text (the reply the loop kept, once streamed)."""
        self.pieces = [text]
        self.streaming = False
        self.show()

    def action_fold(self) -> None:
        """Fold or unfold."""
        self.toggle_class("folded")
        self.show()

    def on_click(self, event: Click) -> None:
        """A click folds or unfolds too."""
        self.action_fold()


class Transcript(VerticalScroll):
    """The conversation so far."""

    def on_mount(self) -> None:
        """Name the pane."""
        self.border_title = "transcript"

    def add(self, label: str, text: str, *, style: str = "", folded: bool = True) -> Entry:
        """Append a message, keeping the view at the end if it was there."""
        entry = Entry(label, text, style=style, folded=folded)
        follow = self.scroll_offset.y >= self.max_scroll_y
        excess = len(self.children) + 1 - MAX_ENTRIES
        if excess > 0:
            for old in list(self.children)[:excess]:
                old.remove()
        self.mount(entry)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
        return entry

    @property
    def streaming(self) -> Entry | None:
        """The entry the model's text is streaming into, if any."""
        last = self.children[-1] if self.children else None
        return last if isinstance(last, Entry) and last.streaming else None

    def stream(self, text: str) -> None:
        """Streamed text of the model's current turn."""
        if not text:
            return
        entry = self.streaming
        if entry is None:
            entry = self.add("model:", "", style="bold")
            entry.streaming = True
        entry.extend(text)

    def model_text(self, text: str) -> None:
        """The model's reply (its text; the streamed entry, if any, takes it)."""
        entry = self.streaming
        if entry is not None:
            entry.set_text(text)
        elif text:
            self.add("model:", text, style="bold")

    def prompt(self, text: str) -> None:
        """What the user said."""
        self.add("you:", text, style="bold")

    def tool_call(self, name: str, arguments: Mapping[str, object]) -> None:
        """A tool call, with its arguments."""
        self.add(f"→ {line(name, 80).plain}", json.dumps(arguments, ensure_ascii=False))

    def tool_result(self, output: str, *, is_error: bool) -> None:
        """A tool's result (folded)."""
        self.add("← error:" if is_error else "←", output)

    def answer(self) -> None:
        """A run completed, or a chat's turn was answered: the answer (the last model entry)
        unfolded, capped like any unfolded message."""
        for entry in reversed(list(self.query(Entry))):
            if entry.label == "model:":
                if entry.folded:
                    entry.action_fold()
                return

    def resumed(self, messages: Iterable[JSONObject]) -> None:
        """The conversation a resumed session already had, a line per block."""
        for text in transcript_lines(messages):
            label, _, rest = text.partition(" ")
            self.add(label, rest)

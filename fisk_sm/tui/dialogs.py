"""The questions put to the operator, as modal dialogs: an approval, yes/no, a choice, a line.

Each dialog is a `ModalScreen` dismissed with its answer. What they show came from the model or
the API, so it is `Content` from `fisk_sm.tui.text`; an approval shows the call's input whole,
as indented JSON with every control and bidi character made visible (`make_visible`), in a
scrolling box: the operator sees all of it before the keypress.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static

from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import make_visible
from fisk_sm.tui.text import line, plain

__all__ = ["ApprovalDialog", "AskDialog", "ConfirmDialog", "SelectDialog", "shown_input"]

CSS = """
ModalScreen { align: center middle; }
.dialog { width: 80%; height: auto; max-height: 80%; border: thick $warning; padding: 0 1;
          background: $surface; }
.dialog .question { text-style: bold; }
.dialog .input { height: auto; max-height: 20; border: round $primary; }
.dialog .keys { color: $text-muted; }
"""


def shown_input(arguments: Mapping[str, object]) -> str:
    """A call's input as the operator sees it: indented JSON, every control made visible."""
    text = json.dumps(arguments, indent=2, ensure_ascii=False, default=str)
    return "\n".join(make_visible(part) for part in text.split("\n"))


class ApprovalDialog(ModalScreen[Approval]):
    """May this gated call run? `o` once, `a` always, `n` (or `d`, Escape) deny."""

    DEFAULT_CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "answer('once')", "once"),
        Binding("a", "answer('always')", "always"),
        Binding("n", "answer('no')", "deny"),
        Binding("d", "answer('no')", "deny", show=False),
        Binding("escape", "answer('no')", "deny", show=False),
    ]

    def __init__(
        self, tool: str, tag: str, arguments: Mapping[str, object], run_id: str = ""
    ) -> None:
        super().__init__()
        self.tool, self.tag, self.arguments, self.run_id = tool, tag, arguments, run_id

    def compose(self) -> ComposeResult:
        whose = f" (run {self.run_id})" if self.run_id else ""
        with Vertical(classes="dialog"):
            yield Static(line(f"approve {self.tool} [{self.tag}]{whose}?"), classes="question")
            with VerticalScroll(classes="input"):
                yield Static(plain(shown_input(self.arguments)), id="approval-input")
            yield Static(plain("o once · a always · n deny"), classes="keys")

    def action_answer(self, answer: str) -> None:
        """Dismiss with `answer` ("once", "always" or "no")."""
        self.dismiss(Approval(answer))


class ConfirmDialog(ModalScreen[bool]):
    """A yes/no question: `y` yes, `n` (or Escape) no."""

    DEFAULT_CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no", show=False),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(line(self.question, 2000), classes="question")
            yield Static(plain("y yes · n no"), classes="keys")

    def action_answer(self, answer: bool) -> None:
        """Dismiss with `answer`."""
        self.dismiss(answer)


class SelectDialog(ModalScreen[int | None]):
    """One of several options (Enter chooses; Escape chooses none)."""

    DEFAULT_CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "none", "none")]

    def __init__(self, question: str, options: Sequence[str]) -> None:
        super().__init__()
        self.question, self.options = question, list(options)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(line(self.question, 2000), classes="question")
            yield OptionList(*(line(option, 200) for option in self.options))
            yield Static(plain("Enter chooses · Escape: none"), classes="keys")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Dismiss with the index chosen."""
        self.dismiss(event.option_index)

    def action_none(self) -> None:
        """Dismiss with no choice."""
        self.dismiss(None)


class AskDialog(ModalScreen[str | None]):
    """A line of text (Enter answers; an empty answer stands for `default`; Escape: none)."""

    DEFAULT_CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "none", "none")]

    def __init__(self, question: str, default: str | None) -> None:
        super().__init__()
        self.question, self.default = question, default

    def compose(self) -> ComposeResult:
        hint = f" [{self.default}]" if self.default else ""
        with Vertical(classes="dialog"):
            yield Static(line(f"{self.question}{hint}", 2000), classes="question")
            yield Input(id="answer")
            yield Static(plain("Enter answers · Escape: no answer"), classes="keys")

    def on_mount(self) -> None:
        """Blink off (deterministic screenshots), and the focus in the box."""
        box = self.query_one(Input)
        box.cursor_blink = False
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Dismiss with the line typed (or the default for an empty one)."""
        value = event.value.strip()
        self.dismiss(value if value or self.default is None else self.default)

    def action_none(self) -> None:
        """Dismiss with no answer."""
        self.dismiss(None)

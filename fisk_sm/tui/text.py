"""Untrusted text as Textual `Content`: never markup, no control or bidi character, bounded.

Whatever the model, a tool, a journal or the API sent passes through here before it reaches a
widget. `line` gives one line (whitespace collapsed, at most `limit` characters); `block` keeps
the lines but caps them, so a 10,000-line tool result or a 1 MB answer cannot flood a pane.
Both build `Content` from plain text: Textual markup in it (`[bold]`, `[@click=app.quit]`) is
shown as typed, never interpreted.
"""

from __future__ import annotations

from textual.content import Content

from fisk_sm.operator.sanitize import sanitize, strip_control

__all__ = ["BLOCK_CHARS", "BLOCK_LINES", "block", "line", "plain"]

#: The most lines and characters of one message a pane shows (the rest is counted, not drawn).
BLOCK_LINES = 200
BLOCK_CHARS = 20_000


def plain(text: str, style: str = "") -> Content:
    """`text` (already safe: built by fisk-sm itself) as content, styled as a whole."""
    return Content.styled(text, style) if style else Content(text)


def line(text: str, limit: int = 500, style: str = "") -> Content:
    """Untrusted `text` as one line: controls stripped, whitespace collapsed, cut at `limit`."""
    return plain(sanitize(text, limit), style)


def capped(text: str, lines: int = BLOCK_LINES, chars: int = BLOCK_CHARS) -> str:
    """Untrusted `text` with controls stripped, at most `lines` lines and `chars` characters;
    what is cut is counted on a last line of its own."""
    head = text[:chars]
    kept = head.split("\n", lines)
    if len(kept) > lines:
        kept.pop()
    shown = "\n".join(kept)
    if len(shown) == len(text):
        return strip_control(shown)
    rest = text[len(shown) :].removeprefix("\n")
    more = rest.count("\n") + (0 if rest.endswith("\n") else 1)
    note = f"… {len(rest):,} more characters ({more:,} more line{'s' * (more != 1)}) not shown"
    return strip_control(shown.rstrip("\n")) + "\n" + note


def block(text: str, lines: int = BLOCK_LINES, chars: int = BLOCK_CHARS) -> Content:
    """Untrusted `text` as lines of content, capped (`capped`)."""
    return Content(capped(text, lines, chars))

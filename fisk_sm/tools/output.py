"""Capping what a tool returns before the journal and the model see it.

Text over a limit keeps its first and last halves around a marker that says how many bytes were
left out: the start of an output usually says what ran, its end how it ended. Exec tools keep
their head and tail while the output streams in (`fisk_sm.tools.process`); every tool's result
is capped again on its way out of dispatch (`fisk_sm.tools.base.ToolBox.invoke`), so a new kind
of tool is covered too. Images are never cut (half a PNG is no image): one over its limit makes
the result an `is_error` naming the limit. The limits and their defaults are in
`fisk_sm.config.limits`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fisk_sm.config.limits import MAX_OUTPUT

__all__ = ["HEAD_BYTES", "TAIL_BYTES", "cap_blocks", "cap_text", "head_and_tail", "image_problem"]

#: The halves exec's capture keeps while the output streams in.
HEAD_BYTES = TAIL_BYTES = MAX_OUTPUT // 2


def _marker(cut: int, total: int) -> str:
    return f"\n...[output truncated: {cut} of {total} bytes left out]...\n"


def head_and_tail(head: bytes | bytearray, tail: bytes | bytearray, total: int) -> tuple[str, bool]:
    """The text of an output of `total` bytes of which `head` and `tail` were kept, and whether
    anything between them was left out (then a marker saying how much stands between them).

    A character split at either cut becomes U+FFFD."""
    text = [bytes(b).decode("utf-8", errors="replace") for b in (head, tail)]
    cut = total - len(head) - len(tail)
    if cut > 0:
        return text[0] + _marker(cut, total) + text[1], True
    return text[0] + text[1], False


def cap_text(text: str, limit: int) -> tuple[str, bool]:
    """`text` kept to `limit` bytes of UTF-8 (head and tail, see `head_and_tail`), and whether
    it was cut."""
    if len(text) * 4 <= limit:  # no str of this length can encode to more
        return text, False
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit:
        return text, False
    half = limit // 2
    return head_and_tail(data[:half], data[len(data) - (limit - half) :], len(data))


def image_problem(block: Mapping[str, Any], limit: int) -> str | None:
    """Why an image block is refused (its base64 data is over `limit` bytes), or None."""
    source = block.get("source")
    data = source.get("data") if isinstance(source, Mapping) else None
    if isinstance(data, str) and len(data) > limit:
        return (
            f"an image of {len(data)} bytes (base64), over the limit of {limit} bytes (max_image)"
        )
    return None


def cap_blocks(
    blocks: Sequence[Mapping[str, Any]], limit: int
) -> tuple[tuple[dict[str, Any], ...], bool]:
    """Content blocks whose text is kept to `limit` bytes in all, and whether any was cut.

    Within the limit they are left as they are; over it, the text blocks become one capped text
    block in the place of the first, and the images keep their order."""
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    if sum(len(t.encode("utf-8", errors="surrogatepass")) for t in texts) <= limit:
        return tuple(dict(b) for b in blocks), False
    capped, _ = cap_text("\n".join(texts), limit)
    kept: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") != "text":
            kept.append(dict(block))
        elif texts:
            kept.append({"type": "text", "text": capped})
            texts = []
    return tuple(kept), True

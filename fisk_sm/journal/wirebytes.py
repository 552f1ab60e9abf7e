"""A checkpoint's messages, read from the journal's bytes: decoded, or sent as those bytes.

A checkpoint (`fisk_sm.journal.checkpoint`) says where each message of the conversation lies in
the journal: the records it is made of, and in each record's line the span of the JSON value
the message takes from it (`value_span`): the `content` of an assistant or a user record's
`message`, or a tool result's `result`. `Loader.load` decodes a message from its lines, as the
fold would have built it; `Loader.pieces` gives the message's JSON as the very bytes the journal
holds, with no decoding at all, when every part of it has a span. A resumed run's next request
splices those bytes into its body (`ModelRequest.body`), so that a resume decodes none of the
history it sends.

A span is kept only when the bytes mean exactly what the decoded message sends: they are, byte
for byte, msgspec's encoding of the value the record holds (as the fold read it), found where
the line's key says; JSON values delimit themselves, so those bytes decode to that very value.
A line written otherwise (an escape where the journal's encoder writes the character, a space
after a colon) or holding what msgspec does not write back as read (a lone surrogate's escape,
which a resume sends as U+FFFD; NaN) has none, and is left to the decoder
(`fisk_sm.journal.decode._loads`).
"""

from __future__ import annotations

import array
from typing import cast

import msgspec

from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.journal.decode import _loads
from fisk_sm.journal.records import Assistant, Record, ToolResult, User
from fisk_sm.model.blocks import Block, Message, Pieces, TextBlock, block_of, message_of

__all__ = [
    "MESSAGE",
    "MIXED",
    "ONE",
    "PART",
    "PROMPT",
    "RESULT",
    "RESULTS",
    "Loader",
    "value_span",
]

#: A message's part: the line's `message` (an assistant or a user record), its `result` (a tool
#: result), or the prompt (the meta's).
MESSAGE, RESULT, PROMPT = 0, 1, 2
#: How a message is read from its parts: one record's message, a turn's results, or any other
#: mix (a user message merged from several records, the prompt among them).
ONE, RESULTS, MIXED = 0, 1, 2
#: The integers of one part in a checkpoint's table: the seq of its record, the start and end
#: of its line, its field (MESSAGE, RESULT, PROMPT), and the span of its value (0, 0: none).
PART = 6
#: Where the span of its value starts in a part (its end is the next integer).
_SPAN = 4
_FIELDS = ("message", "result")


_encode = msgspec.json.Encoder().encode
#: Stands for a message with no content: it encodes to nothing any line holds.
_NOTHING = object()
#: Where each field's value is looked for: after the first of these keys, the last one's value.
_KEYS = ((b'"message":', b'"content":'), (b'"result":',))
_NONE = (0, 0)


def value_span(data: bytes, start: int, end: int, record: Record) -> tuple[int, int]:
    """The span of the value a message takes from `record`, on the line `data[start:end]` (an
    assistant or a user record's message's content, a tool result's result), or (0, 0) if it
    has none that can be sent as it is (see the module)."""
    value: object
    if isinstance(record, ToolResult):
        value, keys = record.result, _KEYS[RESULT]
    elif isinstance(record, Assistant | User):
        value, keys = record.message.get("content", _NOTHING), _KEYS[MESSAGE]
    else:
        return _NONE
    at = start
    for key in keys:
        at = data.find(key, at, end)
        if at < 0:
            return _NONE
        at += len(key)
    try:
        encoded = _encode(value)
    except (TypeError, ValueError):  # (no JSON of it: not a value any line holds)
        return _NONE
    last = at + len(encoded)
    if last > end or not data.startswith(encoded, at):  # spaces, escapes, another key first
        return _NONE
    return at, last


#: What goes around the one value of a message of one part, by its table head and role.
_FIXES = {
    (4 + ONE, "user"): (b'{"role":"user","content":', b"}"),
    (4 + ONE, "assistant"): (b'{"role":"assistant","content":', b"}"),
    (4 + RESULTS, "user"): (b'{"role":"user","content":[', b"]}"),
}


class Loader:
    """Reads a checkpoint's messages from the journal's bytes, by where each one's entry is in
    the checkpoint's table (see the module)."""

    __slots__ = ("data", "prompt", "table", "view")

    def __init__(self, data: bytes, table: array.array[int], prompt: str) -> None:
        self.data, self.table, self.prompt = data, table, prompt
        self.view = memoryview(data)

    def pieces(self, item: object, role: str) -> Pieces | None:
        """The JSON of a message (of `role`) in pieces of the journal's bytes (views, no copy),
        by where its entry is in the table; None when a part of it has no span, or it is a
        mix (`load` reads it)."""
        table, position = self.table, cast(int, item)  # a position, as `restore` gives it
        fix = _FIXES.get((table[position], role))
        if fix is not None:  # one part: most messages
            first = position + 1 + _SPAN
            end = table[first + 1]
            return (fix[0], self.view[table[first] : end], fix[1]) if end else None
        data = self.view
        head = table[position]
        first = position + 1 + _SPAN
        last = first + PART * (head >> 2)
        starts, ends = table[first:last:PART], table[first + 1 : last : PART]
        if head & 3 != RESULTS or not all(ends):
            return None
        pieces: list[bytes | memoryview] = [b'{"role":"user","content":[']
        for start, end in zip(starts, ends, strict=True):
            pieces += (data[start:end], b",")
        pieces[-1] = b"]}"
        return tuple(pieces)

    def load(self, item: object) -> JSONObject:
        """The wire form of a message: its pieces (`pieces`) decoded, or read from the lines of
        the entry at that position of the table."""
        if type(item) is tuple:
            wire: JSONObject = _loads(b"".join(item))
            return wire
        assert isinstance(item, int)  # a position of the table, as `restore` gives it
        data, table, position = self.data, self.table, item
        head = table[position]
        first = position + 1
        parts = [table[at : at + PART] for at in range(first, first + PART * (head >> 2), PART)]
        how = head & 3
        if how == ONE:
            start, end = parts[0][1:3]
            message = _loads(data[start:end])["message"]
            return {"role": message["role"], "content": message["content"]}
        if how == RESULTS:
            return {"role": "user", "content": [_loads(data[p[1] : p[2]])["result"] for p in parts]}
        blocks: list[Block] = []  # a user message merged from several records (`merge_user`)
        for _, start, end, field, *_ in parts:
            if field == PROMPT:
                blocks.append(TextBlock(self.prompt, None))
                continue
            value = _loads(data[start:end])[_FIELDS[field]]
            blocks.extend(message_of(value).blocks() if field == MESSAGE else (block_of(value),))
        return Message("user", tuple(blocks)).to_json()

"""Conversation messages and their content blocks, as frozen records.

A `Message` is a role and its content: a string, or a tuple of blocks. The blocks fisk-sm reads
have a record each (`TextBlock`, `ToolUseBlock`, `ServerToolUseBlock`, `ToolResultBlock`,
`ThinkingBlock`, `RedactedThinkingBlock`); any other type is an `OtherBlock`, which keeps its
JSON object whole.

Byte-exact. What the model sent must go back exactly as it came, because a thinking block's
signature covers it, and the journal must hold the same bytes it always has. So a block read
from JSON (`block_of`: a reply, a journal line) keeps that JSON object as its `source`, and
`to_json()` gives back that very object: unknown keys and the key order survive, whatever the
record's own fields are. Only a block built here (a tool result, a prompt's text) is written
from its fields, in the order the Messages API documents. A malformed known block (a tool_use
with no id) is an `OtherBlock`: kept, never read. bench/messages.py measured this against
`msgspec.Struct` (which drops unknown keys unless told otherwise); see its docstring.

Records are frozen, and `source` must never be mutated: `to_json()` hands it out, so whoever
changes a block for the wire (`cache_control`) copies it first.

A resumed conversation's history is made of messages whose wire form is read on first use
(`fisk_sm.model.later`), and which until then give their JSON as the journal's own bytes
(`Message.raw`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeAlias

import attrs

from fisk_sm.config.jsontypes import JSON, JSONObject

__all__ = [
    "Block",
    "Message",
    "OtherBlock",
    "Pieces",
    "RedactedThinkingBlock",
    "ServerToolUseBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "block_of",
    "blocks_json",
    "message_of",
]


@attrs.frozen
class TextBlock:
    """Text from the model or the user."""

    text: str
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "text"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled (its source, verbatim, if it was read from JSON)."""
        return self.source if self.source is not None else {"type": "text", "text": self.text}


@attrs.frozen
class ToolUseBlock:
    """A call of one of the run's tools: its id, the tool's name and its JSON input."""

    id: str
    name: str
    input: JSONObject
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "tool_use"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled (its source, verbatim, if it was read from JSON)."""
        if self.source is not None:
            return self.source
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.input}


@attrs.frozen
class ServerToolUseBlock:
    """A call of a tool the API runs itself (web search, ...): fisk-sm never runs it."""

    id: str
    name: str
    input: JSONObject
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "server_tool_use"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled (its source, verbatim, if it was read from JSON)."""
        if self.source is not None:
            return self.source
        return {"type": "server_tool_use", "id": self.id, "name": self.name, "input": self.input}


@attrs.frozen
class ToolResultBlock:
    """A tool's answer to one call: text, or content blocks (open JSON: images, ...)."""

    tool_use_id: str
    #: Text, or the content blocks as sent (open JSON: the API's text and image blocks).
    content: str | tuple[JSON, ...]
    is_error: bool = False
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "tool_result"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled; `is_error` is written only when true."""
        if self.source is not None:
            return self.source
        content = self.content if isinstance(self.content, str) else list(self.content)
        out: JSONObject = {"type": "tool_result", "tool_use_id": self.tool_use_id}
        out["content"] = content
        if self.is_error:
            out["is_error"] = True
        return out

    def text(self) -> str:
        """The result's text: the string, or its text blocks joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            str(b.get("text", ""))
            for b in self.content
            if isinstance(b, dict) and b.get("type") == "text"
        )


@attrs.frozen
class ThinkingBlock:
    """The model's thinking, and the signature that must come back with it unchanged."""

    thinking: str
    signature: str
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "thinking"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled (its source, verbatim, if it was read from JSON)."""
        if self.source is not None:
            return self.source
        return {"type": "thinking", "thinking": self.thinking, "signature": self.signature}


@attrs.frozen
class RedactedThinkingBlock:
    """Thinking the API sends only encrypted (`data`), to be sent back as it came."""

    data: str
    source: JSONObject | None = attrs.field(default=None, eq=False, repr=False)

    type = "redacted_thinking"

    def to_json(self) -> JSONObject:
        """The block as sent and journaled (its source, verbatim, if it was read from JSON)."""
        return self.source if self.source is not None else {"type": self.type, "data": self.data}


@attrs.frozen
class OtherBlock:
    """A block of a type fisk-sm does not read (or a malformed known one): kept whole."""

    source: JSONObject

    @property
    def type(self) -> str:
        """The block's `type`, or "" when it has none."""
        kind = self.source.get("type")
        return kind if isinstance(kind, str) else ""

    def to_json(self) -> JSONObject:
        """The block exactly as it was read."""
        return self.source


Block: TypeAlias = (
    TextBlock
    | ToolUseBlock
    | ServerToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | OtherBlock
)


def _str(d: Mapping[str, JSON], key: str) -> str | None:
    value = d.get(key)
    return value if type(value) is str else None


# A call's input may be absent or null in a journal (a reply never lacks it: the model adapter
# checks): it reads as no arguments, as it always has; the block still goes back as it came.
def _tool_use(d: JSONObject) -> Block:
    use_id, name, arguments = d.get("id"), d.get("name"), d.get("input") or {}
    if type(use_id) is not str or type(name) is not str or type(arguments) is not dict:
        return OtherBlock(d)
    return ToolUseBlock(use_id, name, arguments, d)


def _server_tool_use(d: JSONObject) -> Block:
    use_id, name, arguments = d.get("id"), d.get("name"), d.get("input") or {}
    if type(use_id) is not str or type(name) is not str or type(arguments) is not dict:
        return OtherBlock(d)
    return ServerToolUseBlock(use_id, name, arguments, d)


def _text(d: JSONObject) -> Block:
    text = d.get("text")
    return TextBlock(text, d) if type(text) is str else OtherBlock(d)


def _result(d: JSONObject) -> Block:
    use_id, content, is_error = _str(d, "tool_use_id"), d.get("content", ""), d.get("is_error")
    if use_id is None or not isinstance(content, str | list) or type(is_error) not in _BOOL:
        return OtherBlock(d)
    return ToolResultBlock(
        use_id, content if isinstance(content, str) else tuple(content), bool(is_error), d
    )


_BOOL = (bool, type(None))


def _thinking(d: JSONObject) -> Block:
    thinking, signature = _str(d, "thinking"), _str(d, "signature")
    if thinking is None or signature is None:
        return OtherBlock(d)
    return ThinkingBlock(thinking, signature, d)


def _redacted(d: JSONObject) -> Block:
    data = _str(d, "data")
    return OtherBlock(d) if data is None else RedactedThinkingBlock(data, d)


_READERS = {
    "text": _text,
    "tool_use": _tool_use,
    "server_tool_use": _server_tool_use,
    "tool_result": _result,
    "thinking": _thinking,
    "redacted_thinking": _redacted,
}


def block_of(d: JSONObject) -> Block:
    """The record of one block read from JSON; it keeps `d` and gives it back as `to_json()`."""
    kind = d.get("type")
    reader = _READERS.get(kind) if isinstance(kind, str) else None
    return OtherBlock(d) if reader is None else reader(d)


def blocks_json(blocks: Iterable[Block]) -> list[JSONObject]:
    """The wire form of `blocks`."""
    return [b.to_json() for b in blocks]


#: A message's JSON in pieces to be joined (`Message.raw`).
Pieces: TypeAlias = tuple[bytes | memoryview, ...]


@attrs.frozen
class Message:
    """One message of the conversation: a role ("user", "assistant") and its content."""

    role: str
    content: str | tuple[Block, ...]

    def raw(self) -> Pieces | None:
        """The message's JSON already encoded, in pieces to be joined (for a resumed
        conversation, views of the journal's own bytes: `fisk_sm.model.later`), the same JSON as
        `to_json()`; None: encode that."""
        return None

    def to_json(self) -> JSONObject:
        """The message as sent and journaled: `role`, then `content`."""
        content = self.content
        if isinstance(content, str):
            return {"role": self.role, "content": content}
        return {"role": self.role, "content": [b.to_json() for b in content]}

    def blocks(self) -> tuple[Block, ...]:
        """The content as blocks (a string is one text block)."""
        content = self.content
        return (TextBlock(content, None),) if isinstance(content, str) else content


#: The block types every reply is checked for (`fisk_sm.model.reply`): one of these that does
#: not read is not a message fisk-sm wrote, and `message_of` refuses it.
_CHECKED = frozenset({"text", "tool_use", "server_tool_use"})


def message_of(d: Mapping[str, JSON]) -> Message:
    """The record of a message read from JSON (`role`, `content`); raises ValueError naming the
    field that is not what a message holds (a tool_use with no id, say: no reply passes the
    model adapter's check with one, so a journal holding one was not written by a run)."""
    role, content = d.get("role"), d.get("content")
    if type(role) is not str:
        raise ValueError("message.role: expected a string")
    if isinstance(content, str):
        return Message(role, content)
    if not isinstance(content, list):
        raise ValueError("message.content: expected a string or a list")
    blocks: list[Block] = []
    for i, item in enumerate(content):
        if not isinstance(item, dict):
            raise ValueError("message.content: expected a list of objects")
        block = block_of(item)
        if isinstance(block, OtherBlock) and block.type in _CHECKED:
            raise ValueError(f"message.content[{i}]: a malformed {block.type} block")
        blocks.append(block)
    return Message(role, tuple(blocks))

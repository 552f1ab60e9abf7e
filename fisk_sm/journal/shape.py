"""`check_shape`: what the readers of a journal may take for granted about a decoded record.

`decode` gives each field its type (a `message` is a dict), but says nothing of what is inside
the conversation: a message's role and content, a block's type, a tool call's id. Everything
that reads a journal (the fold, `session show`, the transcript, the report, the path replay, a
resumed run) indexes into those, so a journal that the adapter never wrote (edited, foreign,
fuzzed) must be refused here, with one line naming the field, rather than crash a reader later
with a KeyError. The rules are what an Anthropic message always satisfies, and what the model
adapter validates before anything is journaled.

Nesting is bounded too: a value nested deeper than `MAX_DEPTH` is refused, since re-encoding it
(a fork, the report, a resumed request) would overflow the interpreter's recursion limit.
"""

from __future__ import annotations

from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.journal.records import ApprovalRequested, Assistant, Meta, Record, ToolResult, User

__all__ = ["MAX_DEPTH", "check_depth", "check_shape"]

#: The deepest nesting of lists and objects a journal line may hold.
MAX_DEPTH = 256


def check_depth(line: bytes) -> None:
    """Raise ValueError if the JSON text `line` nests lists and objects beyond `MAX_DEPTH`.

    Counting brackets is cheap and bounds the depth from above, so the exact scan (which skips
    strings) runs only for the rare line with that many brackets.
    """
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return
    depth, in_string, escaped = 0, False, False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def check_shape(record: Record) -> None:
    """Raise ValueError naming the field if `record`'s content is not what readers expect."""
    if isinstance(record, Assistant | User):
        _message(record.message, "message", blocks_only=isinstance(record, Assistant))
    elif isinstance(record, ToolResult):
        _block(record.result, "result")
        if not isinstance(record.result.get("tool_use_id"), str):
            raise ValueError("result.tool_use_id: not a string")
    elif isinstance(record, Meta | ApprovalRequested):
        pass  # typed all the way down by decode; the fingerprint and input are free-form


def _message(message: JSONObject, where: str, *, blocks_only: bool) -> None:
    """A user message's content may be a string; a model's is always a list of blocks."""
    if not isinstance(message.get("role"), str):
        raise ValueError(f"{where}.role: not a string")
    content = message.get("content")
    if isinstance(content, str) and not blocks_only:
        return
    if not isinstance(content, list):
        what = "a list of blocks" if blocks_only else "a string nor a list of blocks"
        raise ValueError(f"{where}.content: {'not' if blocks_only else 'neither'} {what}")
    for n, block in enumerate(content):
        _block(block, f"{where}.content[{n}]")


def _block(block: object, where: str) -> None:
    if not isinstance(block, dict):
        raise ValueError(f"{where}: not an object")
    kind = block.get("type", "")
    if not isinstance(kind, str):
        raise ValueError(f"{where}.type: not a string")
    if kind == "text" and not isinstance(block.get("text", ""), str):
        raise ValueError(f"{where}.text: not a string")
    if kind == "tool_use":
        for name in ("id", "name"):
            if not isinstance(block.get(name), str):
                raise ValueError(f"{where}.{name}: not a string")
        if not isinstance(block.get("input"), dict):
            raise ValueError(f"{where}.input: not an object")
    if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
        raise ValueError(f"{where}.tool_use_id: not a string")

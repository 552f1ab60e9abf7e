"""What the control API shows of a run: the facts of its row (`interface.RunRow`), the
transcript's tail.

Every string here is data (a model's text, a tool's output): the JSON carries it as is, and
whoever shows it (the dashboard, `fisk-sm ctl`) escapes or sanitizes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from fisk_sm.client.records import Approval, Entry, Tokens
from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage
from fisk_sm.journal.snapshot import PendingApproval, Snapshot
from fisk_sm.model.blocks import Message

__all__ = ["TRANSCRIPT_TAIL", "Folded", "approval_of", "tokens_of", "transcript"]

TRANSCRIPT_TAIL = 50


@attrs.frozen
class Folded:
    """What a run's journal fold gives its row: folded once per snapshot (a `Tracked` keeps it
    beside the snapshot it came from, and replaces both together), not on every listing."""

    state: str
    status: str  # the journal's: "open", or the reason of its terminal record
    iteration: int
    usage: Usage
    approval: PendingApproval | None
    outcome: str | None
    answer: str  # the final answer's text ("" unless the journal ends completed)

    @classmethod
    def of(cls, snapshot: Snapshot) -> Folded:
        """The row's facts of `snapshot`."""
        completed = snapshot.state == States.COMPLETED
        return cls(
            state=snapshot.state,
            status=snapshot.status,
            iteration=snapshot.iteration,
            usage=snapshot.usage,
            approval=snapshot.approval,
            outcome=snapshot.outcome,
            answer=snapshot.data().answer() if completed else "",
        )


def tokens_of(usage: Usage) -> Tokens:
    """A run's tokens by tier, and their total, as a row shows them."""
    u = usage
    return Tokens(
        u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_create_tokens, u.total
    )


def approval_of(approval: PendingApproval | None) -> Approval | None:
    """The API's `Approval` of a run's pending approval (`RunData.approval`)."""
    if approval is None:
        return None
    a = approval
    return Approval(a.run_id, a.tool_use_id, a.name, a.input, a.tag)


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _entries(message: dict[str, Any]) -> list[Entry]:
    role = "assistant" if message.get("role") == "assistant" else "user"
    content = message.get("content")
    if isinstance(content, str):
        return [Entry(role, "text", content)]
    entries: list[Entry] = []
    for block in content if isinstance(content, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            entries.append(Entry(role, "text", str(block.get("text", ""))))
        elif kind == "thinking":
            entries.append(Entry(role, "thinking", str(block.get("thinking", ""))))
        elif kind == "tool_use":
            text = json.dumps(block.get("input", {}), ensure_ascii=False, default=str)
            entries.append(Entry(role, "tool_use", text, name=str(block.get("name", ""))))
        elif kind == "tool_result":
            text = _result_text(block.get("content"))
            is_error = bool(block.get("is_error", False))
            entries.append(Entry(role, "tool_result", text, is_error=is_error))
    return entries


def transcript(messages: Sequence[Message], tail: int = TRANSCRIPT_TAIL) -> tuple[Entry, ...]:
    """The conversation as transcript entries, the last `tail` of them."""
    entries = [entry for message in messages for entry in _entries(message.to_json())]
    return tuple(entries[-tail:])

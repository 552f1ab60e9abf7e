"""What the control API shows of a run: the `Run` JSON, the transcript's tail and the path.

Every string here is data (a model's text, a tool's output): the JSON carries it as is, and
whoever shows it (the dashboard, `fisk-sm ctl`) escapes or sanitizes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs

from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage
from fisk_sm.journal.snapshot import PendingApproval, Snapshot
from fisk_sm.model.blocks import Message

__all__ = [
    "STATUSES",
    "TRANSCRIPT_TAIL",
    "Folded",
    "RunRow",
    "approval_json",
    "transcript",
    "usage_json",
]

STATUSES = (
    "queued",
    "running",
    "parked",
    "waiting",
    "suspended",
    "completed",
    "failed",
    "budget_exhausted",
    "iterations_exhausted",
    "aborted",
)
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


def usage_json(usage: Usage) -> dict[str, int]:
    """A run's tokens by tier, and their total."""
    return {
        "input": usage.input_tokens,
        "output": usage.output_tokens,
        "cache_read": usage.cache_read_tokens,
        "cache_creation": usage.cache_create_tokens,
        "total": usage.total,
    }


def approval_json(approval: PendingApproval | None) -> dict[str, Any] | None:
    """The API's `Approval` from a run's pending approval (`RunData.approval`)."""
    if approval is None:
        return None
    return {
        "run_id": approval.run_id,
        "tool_use_id": approval.tool_use_id,
        "tool": approval.name,
        "input": approval.input,
        "tag": approval.tag,
    }


class RunRow(NamedTuple):
    """What the API's `Run` object shows of a run, taken at `at` (`Tracked.row`): plain values,
    cheap to take; the JSON is built from them only when someone reads it (`to_json`)."""

    run_id: str
    name: str
    state: str
    status: str
    iteration: int
    usage: Usage
    created: float
    approval: PendingApproval | None
    outcome: str | None
    answer: str
    owner: str | None  # a cluster's: the supervisor that drives the run; None: not in one
    at: float  # when the row was taken (`age_seconds` is its age then)

    def to_json(self) -> dict[str, Any]:
        """The API's `Run` object (with `owner` in a cluster)."""
        shown = {
            "run_id": self.run_id,
            "name": self.name,
            "state": self.state,
            "status": self.status,
            "iteration": self.iteration,
            "tokens": usage_json(self.usage),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "age_seconds": round(max(0.0, self.at - self.created), 3),
            "approval": approval_json(self.approval),
            "outcome": self.outcome,
            "answer": self.answer,
        }
        if self.owner is not None:
            shown["owner"] = self.owner
        return shown

    def event_json(self, kind: str) -> dict[str, Any]:
        """The row as the stream's event `kind` (`RunSubmitted`, `RunUpdated`, `RunParked`)."""
        return {"type": kind, **self.to_json()}


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _entries(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = "assistant" if message.get("role") == "assistant" else "user"
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "kind": "text", "text": content}]
    entries: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            entries.append({"role": role, "kind": "text", "text": str(block.get("text", ""))})
        elif kind == "thinking":
            text = str(block.get("thinking", ""))
            entries.append({"role": role, "kind": "thinking", "text": text})
        elif kind == "tool_use":
            text = json.dumps(block.get("input", {}), ensure_ascii=False, default=str)
            name = str(block.get("name", ""))
            entries.append({"role": role, "kind": "tool_use", "text": text, "name": name})
        elif kind == "tool_result":
            entry = {"role": role, "kind": "tool_result"}
            entry["text"] = _result_text(block.get("content"))
            entries.append({**entry, "is_error": bool(block.get("is_error", False))})
    return entries


def transcript(messages: Sequence[Message], tail: int = TRANSCRIPT_TAIL) -> list[Any]:
    """The conversation as `Entry` objects, the last `tail` of them."""
    entries = [entry for message in messages for entry in _entries(message.to_json())]
    return entries[-tail:]

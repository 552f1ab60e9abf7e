"""A run's resumable data, and the frozen snapshot taken of it.

`RunData` is the part of a run that survives a suspend: the conversation, the iteration, the
token usage by tier and the pending tool batch. Everything else (client, tools, journal, events)
is infrastructure, rebuilt from config on every start. `RunData` is mutated in place by the phase
actions, which keeps a step O(1); `Snapshot` is its frozen, JSON-ready copy.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Message", "RunData", "Snapshot", "Usage", "tool_uses"]

Message = dict[str, Any]


@attrs.frozen
class Usage:
    """Tokens by tier. The run budget counts all four."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_create_tokens: int = 0

    @property
    def total(self) -> int:
        """All four tiers summed: the figure checked against `max_tokens`."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_create_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_create_tokens + other.cache_create_tokens,
        )

    @classmethod
    def from_api(cls, usage: dict[str, Any] | None) -> Usage:
        """Read the `usage` object of a Messages API reply (missing tiers count 0)."""
        u = usage or {}
        return cls(
            int(u.get("input_tokens") or 0),
            int(u.get("output_tokens") or 0),
            int(u.get("cache_read_input_tokens") or 0),
            int(u.get("cache_creation_input_tokens") or 0),
        )


def tool_uses(message: Message | None) -> list[Message]:
    """The tool_use blocks of an assistant message, in content order."""
    if not message:
        return []
    return [b for b in message.get("content", ()) if b.get("type") == "tool_use"]


@attrs.define
class RunData:
    """The resumable data of one run, mutated in place by the phase actions."""

    run_id: str
    prompt: str
    messages: list[Message] = attrs.Factory(list)
    iteration: int = 0
    usage: Usage = Usage()
    last_usage: Usage = Usage()
    llm_calls: int = 0
    tool_calls: int = 0
    turn: Message | None = None
    stop_reason: str | None = None
    pending: list[Message] = attrs.Factory(list)
    results: list[Message] = attrs.Factory(list)
    error: str | None = None

    @classmethod
    def begin(cls, run_id: str, prompt: str) -> RunData:
        """A fresh run whose conversation is the prompt alone."""
        return cls(run_id, prompt, [{"role": "user", "content": prompt}])

    def answer(self) -> str:
        """The text of the latest assistant turn (the final answer once completed)."""
        if not self.turn:
            return ""
        return "".join(b.get("text", "") for b in self.turn["content"] if b.get("type") == "text")


@attrs.frozen
class Snapshot:
    """A frozen copy of a run: its state plus its resumable data."""

    state: str
    run_id: str
    prompt: str
    messages: tuple[Message, ...]
    iteration: int
    usage: Usage
    last_usage: Usage
    llm_calls: int
    tool_calls: int
    turn: Message | None
    stop_reason: str | None
    pending: tuple[Message, ...]
    results: tuple[Message, ...]
    error: str | None

    @classmethod
    def of(cls, state: str, data: RunData) -> Snapshot:
        """Copy `data` (containers become tuples, so later steps cannot change it)."""
        return cls(
            state=state,
            run_id=data.run_id,
            prompt=data.prompt,
            messages=tuple(data.messages),
            iteration=data.iteration,
            usage=data.usage,
            last_usage=data.last_usage,
            llm_calls=data.llm_calls,
            tool_calls=data.tool_calls,
            turn=data.turn,
            stop_reason=data.stop_reason,
            pending=tuple(data.pending),
            results=tuple(data.results),
            error=data.error,
        )

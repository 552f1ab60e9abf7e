"""`Usage`: a model call's tokens by tier, carried as one value by events, records and snapshots.

It lives in this bottom layer because events carry it and the journal (above) records it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["Usage"]


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
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_create_tokens=self.cache_create_tokens + other.cache_create_tokens,
        )

    @classmethod
    def from_api(cls, usage: Mapping[str, int | None] | None) -> Usage:
        """Read the `usage` object of a Messages API reply (missing tiers count 0)."""
        u = usage or {}
        return cls(
            input_tokens=int(u.get("input_tokens") or 0),
            output_tokens=int(u.get("output_tokens") or 0),
            cache_read_tokens=int(u.get("cache_read_input_tokens") or 0),
            cache_create_tokens=int(u.get("cache_creation_input_tokens") or 0),
        )

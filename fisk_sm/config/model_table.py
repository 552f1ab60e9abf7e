"""Which extended thinking each model takes, by model-name prefix (the longest prefix wins).

A model takes thinking in one of three forms (`Support`):

- ``adaptive``: ``{"type": "adaptive"}``: the model decides how much to think (Claude Opus 4.6,
  Sonnet 4.6);
- ``budget``: ``{"type": "enabled", "budget_tokens": N}``: a fixed budget, at least 1024 tokens
  (Claude Opus 4/4.1/4.5, Sonnet 4/4.5, Haiku 4.5, Sonnet 3.7); these refuse ``adaptive``;
- ``none``: no extended thinking at all (Claude 3 and 3.5).

`llm.thinking` unset is off, for every model (as before this table: today's sessions keep their
fingerprint and their cost). Thinking turned on without a form (``on``, or the old
``{enabled: true}``) takes the model's row: adaptive, or its default budget; a ``none`` model
refuses it as a config error. ``adaptive`` or ``{budget_tokens: N}`` in the config override the
table. A model not in the table takes ``adaptive`` (what ``enabled: true`` always sent).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import attrs

__all__ = ["DEFAULT_BUDGET", "MIN_BUDGET", "MODEL_TABLE", "ModelThinking", "Support", "lookup"]

#: A model's form of extended thinking.
Support: TypeAlias = Literal["adaptive", "budget", "none"]
#: The smallest `budget_tokens` the Messages API takes.
MIN_BUDGET = 1024
#: The budget a ``budget`` model thinks with when the config turns thinking on without one.
DEFAULT_BUDGET = 8192


@attrs.frozen
class ModelThinking:
    """One row: the models whose name starts with `prefix`, and the thinking they take."""

    prefix: str
    support: Support
    #: For a ``budget`` model: the budget used when the config gives none.
    budget_tokens: int = DEFAULT_BUDGET


#: The table (longest matching prefix wins: ``claude-sonnet-4-6`` before ``claude-sonnet-4-``).
MODEL_TABLE: tuple[ModelThinking, ...] = (
    ModelThinking("claude-opus-4-6", "adaptive"),
    ModelThinking("claude-sonnet-4-6", "adaptive"),
    ModelThinking("claude-opus-4-", "budget"),  # 4, 4.1, 4.5
    ModelThinking("claude-sonnet-4-", "budget"),  # 4, 4.5
    ModelThinking("claude-haiku-4-", "budget"),  # 4.5
    ModelThinking("claude-3-7-sonnet", "budget"),
    ModelThinking("claude-3-", "none"),  # 3 and 3.5: no extended thinking
)
#: A model in no row: thinking on means adaptive, as it always did.
_UNKNOWN = ModelThinking("", "adaptive")


def lookup(model: str) -> ModelThinking:
    """The row for `model`: its longest matching prefix, else adaptive."""
    rows = [row for row in MODEL_TABLE if model.startswith(row.prefix)]
    return max(rows, key=lambda row: len(row.prefix), default=_UNKNOWN)

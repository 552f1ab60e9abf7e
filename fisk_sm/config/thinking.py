"""`llm.thinking`: its forms in YAML, and the thinking a model is sent (with the model table).

The YAML forms are ``off``, ``on``, ``adaptive``, ``{budget_tokens: N}`` and the old
``{enabled: true|false}`` (``true`` means on, as ``on``). "On" takes the model's form from
`fisk_sm.config.model_table`; ``adaptive`` and ``{budget_tokens: N}`` override it. Unset is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from fisk_sm.config.errors import ConfigError, show
from fisk_sm.config.model_table import MIN_BUDGET, lookup
from fisk_sm.config.structure import Problem

if TYPE_CHECKING:
    import cattrs

__all__ = ["Thinking", "resolve_thinking", "structure_thinking", "thinking_problem"]

#: The forms of thinking a config may ask for: "auto" is the model table's form.
_MODES = ("auto", "adaptive", "budget")


@attrs.frozen
class Thinking:
    """`llm.thinking`: off, or on in a form (see the module)."""

    enabled: bool = False
    #: The form when on: "auto" (the model table's), "adaptive" or "budget".
    mode: str = attrs.field(default="auto", validator=attrs.validators.in_(_MODES))
    #: For "budget": the thinking budget in tokens (at least `MIN_BUDGET`).
    budget_tokens: int = 0

    @property
    def label(self) -> str:
        """The setting in one word, as the fingerprint records it: "off", "adaptive",
        "budget_tokens=N" (or "on" while the form is still the model table's)."""
        if not self.enabled:
            return "off"
        if self.mode == "budget":
            return f"budget_tokens={self.budget_tokens}"
        return "adaptive" if self.mode == "adaptive" else "on"


def resolve_thinking(model: str, thinking: Thinking) -> Thinking:
    """The thinking `model` is sent: `thinking` as given, or "on" in the model table's form."""
    if not thinking.enabled or thinking.mode != "auto":
        return thinking
    row = lookup(model)
    if row.support == "budget":
        return Thinking(True, "budget", row.budget_tokens)
    return Thinking(True, "adaptive") if row.support == "adaptive" else Thinking()


def thinking_problem(model: str, max_output_tokens: int, thinking: Thinking) -> str | None:
    """What is wrong with `thinking` for `model` and the output cap, or None."""
    if thinking.enabled and thinking.mode == "auto" and lookup(model).support == "none":
        return f"model {model} has no extended thinking (model table): set it to off"
    resolved = resolve_thinking(model, thinking)
    if resolved.mode == "budget" and 0 < max_output_tokens <= resolved.budget_tokens:
        return (
            f"budget_tokens {resolved.budget_tokens} needs llm.budget.max_output_tokens above"
            f" it, got {max_output_tokens}"
        )
    return None


def structure_thinking(_conv: cattrs.Converter, value: object) -> Thinking:
    """`llm.thinking` from YAML, in any of its forms (YAML reads a bare ``off``/``on`` as a
    boolean); a bad value raises one problem naming the field."""
    if value is False or value == "off":
        return Thinking()
    if value is True or value == "on":
        return Thinking(True)
    if value == "adaptive":
        return Thinking(True, "adaptive")
    if not isinstance(value, Mapping):
        raise Problem(f"expected off, on, adaptive or {{budget_tokens: N}}, got {show(value)}")
    for key in value:
        if key not in ("enabled", "budget_tokens"):
            raise ConfigError("", str(key), "unknown key")
    enabled = value.get("enabled", "budget_tokens" in value)  # the old `{}` was off
    if not isinstance(enabled, bool):
        raise ConfigError("", "enabled", f"expected a boolean, got {show(enabled)}")
    if "budget_tokens" not in value:
        return Thinking(enabled)
    budget = value["budget_tokens"]
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_BUDGET:
        problem = f"expected an integer of at least {MIN_BUDGET}, got {show(budget)}"
        raise ConfigError("", "budget_tokens", problem)
    return Thinking(True, "budget", budget) if enabled else Thinking()

"""The resume fingerprint and the resume gate (what may change between a run and its resume).

The fingerprint covers what would make a resumed run a different run: the provider, the model,
the system prompt, the tool set, the thinking mode and the two budgets that bound the run. It
leaves out what may safely change: `call_timeout`, `max_output_tokens` and the resume reminder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fisk_sm.loop.harness import Harness

if TYPE_CHECKING:
    from fisk_sm.config.jsontypes import JSONObject

__all__ = ["ResumeRefused", "check_resume", "fingerprint"]


class ResumeRefused(Exception):
    """A session cannot be resumed; the message says why, and what to do."""


def digest(value: object) -> str:
    import hashlib  # here: only a run's creation or resume needs it

    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(harness: Harness) -> JSONObject:
    """The fingerprint of a run built on `harness` (before any resume reminder is added)."""
    llm = harness.config.llm
    return {
        "provider": llm.provider,
        "model": llm.model,
        "system_hash": digest(list(harness.system)),
        "tools_hash": digest(list(harness.tool_definitions)),
        # "off" and "adaptive" as before the model table (today's sessions keep resuming);
        # a budget as "budget_tokens=N".
        "thinking": llm.resolved_thinking.label,
        "max_tokens": llm.budget.max_tokens,
        "max_iterations": llm.budget.max_iterations,
    }


def _schemas_upgraded(saved: Mapping[str, object], harness: Harness) -> str | None:
    """The tools whose schemas the mapping before pydantic made otherwise, comma-separated, if
    the saved tool digest is what it made of today's tools (the same tools, only their schemas
    mapped anew: `fisk_sm.tools.schema_legacy`); else None."""
    # here: only a resume whose tool digest differs needs the old mapping
    from fisk_sm.tools.schema_legacy import legacy_definitions

    legacy = legacy_definitions(harness.tools.tools.values())
    try:
        if legacy is None or saved.get("tools_hash") != digest(legacy):
            return None
    except (TypeError, ValueError):  # a default the old digest could not have written
        return None
    now = harness.tools.definitions
    return ", ".join(new["name"] for old, new in zip(legacy, now, strict=True) if old != new)


def _changes(
    saved: Mapping[str, object], current: Mapping[str, object], harness: Harness | None
) -> list[str]:
    lines = []
    if saved.get("model") != current["model"]:
        lines.append(f"model: {saved.get('model')} -> {current['model']}")
    if saved.get("system_hash") != current["system_hash"]:
        lines.append("system prompt: changed")
    if saved.get("tools_hash") != current["tools_hash"]:
        upgraded = None if harness is None else _schemas_upgraded(saved, harness)
        if upgraded is not None and harness is not None:
            note = "schema upgraded since the session was saved (same tool); the new one is sent"
            harness.warnings = (*harness.warnings, ("tool_schemas_upgraded", upgraded, note))
        else:
            lines.append("tool set: changed")
    for key, label in (
        ("thinking", "thinking"),
        ("max_tokens", "max_tokens"),
        ("max_iterations", "max_iterations"),
    ):
        if saved.get(key) != current[key]:
            lines.append(f"{label}: {saved.get(key)} -> {current[key]}")
    return lines


def check_resume(
    run_id: str,
    saved: Mapping[str, object],
    current: Mapping[str, object],
    *,
    completed: bool,
    force: bool = False,
    harness: Harness | None = None,
) -> None:
    """Refuse a resume as the reference does: completed, provider change, then drift.

    Given the `harness` the run resumes on, a tool digest saved before the pydantic schema
    mapping is no drift when the tools are the same (their schemas only mapped anew): the run
    resumes with a `tool_schemas_upgraded` warning and sends today's schemas."""
    if completed:
        raise ResumeRefused(f'session "{run_id}" has already completed and cannot be resumed')
    if saved.get("provider") != current["provider"]:
        raise ResumeRefused(
            f'cannot resume "{run_id}": it was started with provider "{saved.get("provider")}"'
            f' but the current configuration uses "{current["provider"]}"; a run cannot change'
            " provider, and --force does not apply"
        )
    changes = _changes(saved, current, harness)
    if changes and not force:
        raise ResumeRefused(
            "\n".join(
                [
                    f'cannot resume "{run_id}", the configuration changed since it was saved:',
                    *(f"  {line}" for line in changes),
                    "re-run against the original configuration, or pass --force to continue"
                    " with the current one",
                ]
            )
        )

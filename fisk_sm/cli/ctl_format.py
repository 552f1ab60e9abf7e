"""How `fisk-sm ctl` shows the control API's JSON to a person.

Everything here came from the server, and through it from a model or a journal, so every string
goes through the sanitizer: one-line cells through `sanitize`, the transcript's text through
`strip_control`. No value may carry a control sequence to the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from fisk_sm.operator.sanitize import sanitize, strip_control

# json is imported where a value needs it, typing never at run time: `ctl --help` imports this
# module and needs neither.
#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["age", "approvals_table", "event_line", "run_line", "runs_table", "show_run"]

#: Event fields too big for one line (a resumed run's whole conversation).
_BULKY = {"messages", "transcript", "path"}
#: The fields of a `Run` an event line shows (RunUpdated, RunSubmitted, RunParked carry a Run).
_RUN_FIELDS = ("name", "status", "state", "iteration", "tokens", "approval", "outcome")


def _text(value: Any, limit: int = 60) -> str:
    """`value` as one safe line: strings as they are, anything else as compact JSON."""
    if value is None:
        return "-"
    if not isinstance(value, str):
        import json

        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return sanitize(value, limit) or "-"


def age(seconds: Any) -> str:
    """`seconds` as 42s, 5m, 3h or 2d."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _tokens(run: Mapping[str, Any]) -> str:
    tokens = run.get("tokens")
    return _text(tokens.get("total") if isinstance(tokens, Mapping) else None)


def _approval_tool(run: Mapping[str, Any]) -> str:
    approval = run.get("approval")
    return _text(approval.get("tool"), 30) if isinstance(approval, Mapping) else "-"


def _table(header: Sequence[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(header), *rows]
    ]
    return "\n".join(lines)


def runs_table(runs: Sequence[Any]) -> str:
    """`ctl ls`: one row per run."""
    rows = [
        [
            _text(r.get("run_id"), 40),
            _text(r.get("name"), 24),
            _text(r.get("status"), 20),
            _text(r.get("state"), 20),
            _text(r.get("iteration")),
            _tokens(r),
            age(r.get("age_seconds")),
            _approval_tool(r),
        ]
        for r in runs
        if isinstance(r, Mapping)
    ]
    if not rows:
        return "no runs"
    header = ["RUN", "NAME", "STATUS", "STATE", "ITER", "TOKENS", "AGE", "APPROVAL"]
    return _table(header, rows)


def approvals_table(approvals: Sequence[Any]) -> str:
    """`ctl approvals`: one row per pending tool call."""
    rows = [
        [
            _text(a.get("run_id"), 40),
            _text(a.get("tool_use_id"), 40),
            _text(a.get("tool"), 30),
            _text(a.get("tag"), 20),
            _text(a.get("input"), 80),
        ]
        for a in approvals
        if isinstance(a, Mapping)
    ]
    if not rows:
        return "no pending approvals"
    return _table(["RUN", "TOOL_USE_ID", "TOOL", "TAG", "INPUT"], rows)


def run_line(run: Mapping[str, Any], verb: str) -> str:
    """One line after an action: `RUN: VERB; status STATUS (state STATE)`."""
    return (
        f"{_text(run.get('run_id'), 40)}: {verb}; status {_text(run.get('status'))}"
        f" (state {_text(run.get('state'))})"
    )


def _approval(approval: Any) -> str:
    if not isinstance(approval, Mapping):
        return "-"
    return (
        f"{_text(approval.get('tool'), 40)} ({_text(approval.get('tool_use_id'), 40)},"
        f" tag {_text(approval.get('tag'), 30)}) input {_text(approval.get('input'), 200)}"
    )


def _entry(entry: Mapping[str, Any]) -> str:
    """One transcript entry: a heading line, then its text indented."""
    head = f"{_text(entry.get('role'), 12)} {_text(entry.get('kind'), 12)}"
    if entry.get("name"):
        head += f" {_text(entry.get('name'), 40)}"
    if entry.get("is_error"):
        head += " (error)"
    text = strip_control(str(entry.get("text") or "")).rstrip()
    body = "\n".join("    " + line for line in text.splitlines())
    return f"  {head}" + (f"\n{body}" if body else "")


def show_run(run: Mapping[str, Any]) -> str:
    """`ctl show`: the run's fields, its path and the transcript's tail."""
    tokens = run.get("tokens") if isinstance(run.get("tokens"), Mapping) else {}
    assert isinstance(tokens, Mapping)
    tiers = ", ".join(
        f"{label} {_text(tokens.get(key))}"
        for key, label in (
            ("input", "input"),
            ("output", "output"),
            ("cache_read", "cache read"),
            ("cache_creation", "cache write"),
        )
    )
    path = run.get("path")
    lines = [
        f"run        {_text(run.get('run_id'), 80)}",
        f"name       {_text(run.get('name'), 80)}",
        f"status     {_text(run.get('status'))}",
        f"state      {_text(run.get('state'))}",
        f"iteration  {_text(run.get('iteration'))}",
        f"tokens     {_text(tokens.get('total'))} ({tiers})",
        f"age        {age(run.get('age_seconds'))}",
        f"approval   {_approval(run.get('approval'))}",
        f"outcome    {_text(run.get('outcome'), 200)}",
    ]
    if isinstance(path, list) and path:
        lines.append("path       " + " > ".join(_text(s, 30) for s in path))
    answer = strip_control(str(run.get("answer") or "")).rstrip()
    if answer:
        lines.append("answer     " + "\n           ".join(answer.splitlines()))
    transcript = [e for e in run.get("transcript") or [] if isinstance(e, Mapping)]
    if transcript:
        lines.append(f"transcript (last {len(transcript)}):")
        lines.extend(_entry(e) for e in transcript)
    return "\n".join(lines)


def event_line(name: str, fields: Mapping[str, Any], now: float | None = None) -> str:
    """`HH:MM:SS RUN EventType key=value...` for one event of the stream."""
    stamp = time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))
    kind = _text(fields.get("type") or name, 40)
    parts = [stamp, _text(fields.get("run_id"), 40), kind]
    keys = (
        [k for k in _RUN_FIELDS if k in fields]
        if kind in ("RunUpdated", "RunSubmitted", "RunParked")
        else [k for k in fields if k not in ("type", "run_id", *_BULKY)]
    )
    for key in keys:
        value = fields[key]
        if value is None or value == "":
            continue
        if key == "tokens" and isinstance(value, Mapping):
            value = value.get("total")
        if key == "usage" and isinstance(value, Mapping):  # a Usage: its total, as in `ls`
            key, value = "tokens", sum(v for v in value.values() if isinstance(v, int))
        if isinstance(value, float):
            value = round(value, 3)
        if key == "approval" and isinstance(value, Mapping):
            value = value.get("tool")
        shown = _text(value, 80)
        if " " in shown or not shown:
            import json

            shown = json.dumps(shown, ensure_ascii=False)
        parts.append(f"{_text(key, 30)}={shown}")
    return " ".join(parts)

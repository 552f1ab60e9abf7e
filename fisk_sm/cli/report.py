"""`fisk-sm report ID -o report.html`: one self-contained HTML page about a session.

The page needs no network and runs no script: the machine with the session's path marked on
its shipped SVG (`fisk_sm.machine.diagram.path_drawing`: no Graphviz needed), shown at its own
size in a scrolling box, with a "fit to width" switch that is a CSS checkbox; the approvals
(tool, input, tag, answer); a timeline of the model calls (tokens) and tools (names, outcome);
the transitions the run took (`fisk_sm.machine.path.session_path`, derived from the journal);
and the transcript, with thinking, tool calls and tool results folded in `<details>`.
Everything read from the journal is HTML-escaped.

A journal written since the timings were recorded holds each model call's latency, each
tool's duration and who answered each approval and when; an older one holds none of them, and
the page says "not journaled" where a reader would look for them, rather than guess. The page
holds the conversation, so its file is written 0600, an existing file tightened to it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from fisk_sm.cli.session import record_line, session_records
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
)
from fisk_sm.machine.diagram import path_drawing
from fisk_sm.machine.path import SessionPath, session_path
from fisk_sm.machine.table import load_table

__all__ = ["add_report_parser", "cmd_report", "report_html"]

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#111}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}th{background:#f6f6f6}.num{text-align:right}
.diagram{overflow:auto;max-height:85vh;border:1px solid #ddd}.diagram svg{display:block}
#fit:checked~.diagram svg{width:100%;height:auto}.note{color:#92400e}.unknown{color:#777}
pre{white-space:pre-wrap;background:#f7f7f7;
padding:.5em;margin:.25em 0;border-radius:4px}.turn{margin:.6em 0;padding:.4em .8em;
border-left:4px solid #ccc}.assistant{border-color:#1d4ed8}.user{border-color:#15803d}
.terminal{border-color:#b45309}.error{color:#b91c1c}summary{cursor:pointer;color:#333}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 1em}dt{color:#555}
"""


def add_report_parser(sub: Any) -> None:
    """Register `report` on the command line's subparsers."""
    report = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a session",
        description="Write one HTML page (no network, no script) about session ID: the"
        " machine with its path, a timeline of its transitions with tokens, and the"
        " transcript with thinking, tool calls and results folded.",
    )
    report.add_argument("id")
    report.add_argument("-o", "--output", type=Path, help="write to this file (else stdout)")
    report.add_argument("--state-dir", type=Path, help="the sessions directory")
    report.add_argument("-c", "--config", type=Path, help="take the directory from agent.yaml")


def cmd_report(args: argparse.Namespace) -> int:
    """`fisk-sm report ID`."""
    records = session_records(args.state_dir, args.config, args.id)
    page = report_html(records, session_path(records))
    if args.output:
        write_private(args.output, page)
    else:
        sys.stdout.write(page)
    return 0


def write_private(where: Path, text: str) -> None:
    """Write `text` to `where` readable by its owner only: created 0600 whatever the umask,
    and an existing file tightened to 0600 before a byte is written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    fd = os.open(where, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def report_html(records: Sequence[Record], path: SessionPath) -> str:
    """The whole page for the session journaled in `records`, whose path is `path`."""
    snap = fold(records)
    u = snap.usage
    facts = {
        "session": snap.run_id,
        "status": snap.status + (f" ({snap.outcome})" if snap.outcome else ""),
        "model": str(snap.fingerprint.get("model", "")),
        "created": snap.created,
        "now in": path.current,
        "model calls": str(snap.llm_calls),
        "tool calls": str(snap.tool_calls),
        "tokens": f"in {u.input_tokens}, out {u.output_tokens}, cache read"
        f" {u.cache_read_tokens}, cache create {u.cache_create_tokens}",
        "records": str(snap.seq),
    }
    summary = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts.items())
    title = escape(f"fisk-sm session {snap.run_id}")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{title}</h1><dl>{summary}</dl>\n"
        f"<h2>Path</h2>{_path_view(path)}\n"
        f"<h2>Approvals</h2>{_approvals(records)}\n"
        f"<h2>Model calls and tools</h2>{_calls(records)}\n"
        f"<h2>Timeline</h2>{_timeline(records, path)}\n"
        f"<h2>Transcript</h2>{_transcript(records)}\n"
        "</body></html>\n"
    )


def _path_view(path: SessionPath) -> str:
    """The path on the machine, at its own size in a scrolling box (readable), with a CSS-only
    switch to fit it to the page width; or the mermaid text and why."""
    drawing = path_drawing(load_table(), [path])
    note = f"<p class='note'>{escape(drawing.note)}</p>" if drawing.note else ""
    if drawing.kind != "svg":
        return f"{note}<pre class='mermaid-text'>{escape(drawing.text)}</pre>"
    text = drawing.text
    element = text[text.index("<svg") :]  # the XML prolog and doctype dropped
    toggle = "<input type='checkbox' id='fit'><label for='fit'> fit to the page width</label>"
    return f"{note}{toggle}<div class='diagram'>{element}</div>"


_UNKNOWN = "<td class='unknown'>not journaled</td>"


def _known(value: str | None, css: str) -> str:
    """A cell holding `value`, or the "not journaled" cell when the journal has none."""
    return _UNKNOWN if value is None else f"<td class='{css}'>{escape(value)}</td>"


def _ms(value: int | None) -> str | None:
    """A journaled wall time in milliseconds, for reading (None stays None)."""
    if value is None:
        return None
    return f"{value} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _who(answer: ApprovalAnswered | None) -> str | None:
    """Who answered an approval and when, as far as the journal says (None: it says neither)."""
    if answer is None or (answer.by is None and answer.at is None):
        return None
    return f"{answer.by or 'nobody'} at {answer.at}" if answer.at else answer.by


def _tool_names(records: Sequence[Record]) -> dict[str, str]:
    """tool_use_id -> tool name, from the journaled turns and tool intents."""
    names: dict[str, str] = {}
    for r in records:
        if isinstance(r, Assistant):
            names.update((str(b.get("id")), str(b.get("name"))) for b in _tool_blocks(r))
        elif isinstance(r, ToolStarted):
            names[r.tool_use_id] = r.name
    return names


def _approvals(records: Sequence[Record]) -> str:
    """Each call put to the operator: the tool, its input and tag, and the answer."""
    answers = {r.tool_use_id: r for r in records if isinstance(r, ApprovalAnswered)}
    rows = []
    for r in records:
        if not isinstance(r, ApprovalRequested):
            continue
        got = answers.get(r.tool_use_id)
        answer = "pending (never answered)" if got is None else got.answer
        if got is not None and got.reason:
            answer += f" ({got.reason})"
        answered = "" if got is None else f"seq {got.seq}"
        rows.append(
            f"<tr class='approval'><td class='tool'>{escape(r.name)}</td>"
            f"<td>{escape(r.tool_use_id)}</td><td>{_pre(r.input)}</td><td>{escape(r.tag)}</td>"
            f"<td class='answer'>{escape(answer)}</td><td class='num'>seq {r.seq}</td>"
            f"<td class='num'>{escape(answered)}</td>{_known(_who(got), 'who')}</tr>"
        )
    if not rows:
        return "<p>No call was put to the operator.</p>"
    head = (
        "<tr><th>tool</th><th>call</th><th>input</th><th>tag</th><th>answer</th>"
        "<th>asked</th><th>answered</th><th>who, at what time</th></tr>"
    )
    why = ""
    if any(got.by is None and got.at is None for got in answers.values()):
        why = (
            "<p class='unknown'>This journal was written before who answered and when were"
            " recorded: it holds each answer and where it falls among the records (its seq).</p>"
        )
    return f"<table class='approvals'>{head}{''.join(rows)}</table>{why}"


def _calls(records: Sequence[Record]) -> str:
    """The model calls (stop reason, tools asked for, tokens) and the tools (name, outcome), in
    journal order, with each call's latency and each tool's duration where the journal has
    them (an older journal has none, and the page says so)."""
    names = _tool_names(records)
    started = {r.tool_use_id: r.seq for r in records if isinstance(r, ToolStarted)}
    rows = []
    for r in records:
        if isinstance(r, Assistant):
            t = r.usage
            asked = [names.get(str(b.get("id")), "?") for b in _tool_blocks(r)]
            tokens = (
                f"in {t.input_tokens} out {t.output_tokens}"
                f" cache {t.cache_read_tokens}/{t.cache_create_tokens}"
            )
            what = f"model call {r.iteration} ({r.stop_reason or 'no stop reason'})"
            detail = "asks for " + ", ".join(asked) if asked else "no tool"
            rows.append((r.seq, "model", what, detail, tokens, _ms(r.latency_ms)))
        elif isinstance(r, ToolResult):
            name = names.get(r.tool_use_id, "?")
            begun = started.get(r.tool_use_id)
            span = f"seq {begun}–{r.seq}" if begun is not None else "not started (refused)"
            outcome = "error" if r.is_error else "ok"
            # a refused call never ran: it has no duration to journal, old journal or new
            took = _ms(r.duration_ms) if begun is not None else "did not run"
            rows.append((r.seq, "tool", name, f"{r.kind}, {outcome}, {span}", "", took))
    if not rows:
        return "<p>No model call was journaled.</p>"
    body = "".join(
        f"<tr class='{kind}'><td class='num'>{seq}</td><td class='name'>{escape(what)}</td>"
        f"<td>{escape(detail)}</td><td>{escape(tokens)}</td>{_known(took, 'took')}</tr>"
        for seq, kind, what, detail, tokens, took in rows
    )
    head = (
        "<tr><th>seq</th><th>model call or tool</th><th>detail</th><th>tokens</th>"
        "<th>latency or duration</th></tr>"
    )
    why = ""
    if not any(took for *_, took in rows):
        why = (
            "<p class='unknown'>This journal was written before timings were recorded: it"
            " holds the order of the calls and tools, so no latency or duration is shown.</p>"
        )
    return f"<table class='timeline'>{head}{body}</table>{why}"


def _tool_blocks(r: Assistant) -> list[dict[str, Any]]:
    content = r.message.get("content")
    blocks = content if isinstance(content, list) else []
    return [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]


def _timeline(records: Sequence[Record], path: SessionPath) -> str:
    """One row per state entered, with the tool whose record the step read, if any."""
    turns = {r.seq: r for r in records if isinstance(r, Assistant)}
    names = _tool_names(records)
    calls = (ToolStarted, ToolResult, ApprovalRequested, ApprovalAnswered)
    tool_at = {r.seq: names.get(r.tool_use_id, "?") for r in records if isinstance(r, calls)}
    rows = []
    for n, step in enumerate(path.steps, 1):
        via = "start" if step.trigger is None else step.trigger
        tokens = ""
        turn = turns.get(step.seq)
        if turn is not None and step.source == "journal":  # the turn just journaled
            t = turn.usage
            tokens = (
                f"in {t.input_tokens} out {t.output_tokens}"
                f" cache {t.cache_read_tokens}/{t.cache_create_tokens}"
            )
        cells = (
            f"<td class='num'>{n}</td><td class='num'>{step.seq}</td>"
            f"<td class='num'>{step.iteration}</td><td>{escape(step.source or '')}</td>"
            f"<td>{escape(via)}</td><td>{escape(step.guard or '')}</td>"
            f"<td><b>{escape(step.destination)}</b></td>"
            f"<td class='tool'>{escape(tool_at.get(step.seq, ''))}</td><td>{escape(tokens)}</td>"
        )
        rows.append(f"<tr>{cells}</tr>")
    head = (
        "<tr><th>#</th><th>seq</th><th>iteration</th><th>from</th><th>trigger</th>"
        "<th>guard</th><th>to</th><th>tool</th><th>tokens of the turn</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _pre(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return f"<pre>{escape(text)}</pre>"


def _fold(summary: str, body: str, css: str = "") -> str:
    cls = f" class='{css}'" if css else ""
    return f"<details><summary{cls}>{escape(summary)}</summary>{body}</details>"


def _block(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return f"<p>{escape(str(block.get('text', '')))}</p>"
    if kind in ("thinking", "redacted_thinking"):
        return _fold(str(kind), _pre(block.get("thinking") or block.get("data") or ""))
    if kind == "tool_use":
        name = f"tool call {block.get('name')} ({block.get('id')})"
        return _fold(name, _pre(block.get("input", {})))
    if kind == "tool_result":
        error = bool(block.get("is_error"))
        summary = f"result of {block.get('tool_use_id')}{' (error)' if error else ''}"
        return _fold(summary, _pre(block.get("content", "")), "error" if error else "")
    return _fold(str(kind), _pre(block))


def _content(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return f"<p>{escape(content)}</p>"
    return "".join(_block(b) for b in content if isinstance(b, dict))


def _transcript(records: Sequence[Record]) -> str:
    parts = []
    for r in records:
        head = f"<small>seq {r.seq}: {escape(record_line(r))}</small>"
        if isinstance(r, Meta):
            parts.append(f"<div class='turn user'>{head}<p>{escape(r.prompt)}</p></div>")
        elif isinstance(r, Assistant):
            parts.append(f"<div class='turn assistant'>{head}{_content(r.message)}</div>")
        elif isinstance(r, ToolResult):
            parts.append(f"<div class='turn user'>{head}{_block(r.result)}</div>")
        elif isinstance(r, User):
            parts.append(f"<div class='turn user'>{head}{_content(r.message)}</div>")
        elif isinstance(r, Terminal):
            parts.append(f"<div class='turn terminal'>{head}</div>")
        else:
            parts.append(f"<div class='turn'>{head}</div>")
    return "\n".join(parts)

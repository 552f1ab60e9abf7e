"""`fisk-sm report ID -o report.html`: one self-contained HTML page about a session.

The page needs no network and runs no script: the machine with the session's path as inline
SVG (`fisk_sm.machine.diagram`), a timeline of the transitions it took with the tokens of each
model turn (`fisk_sm.machine.path.session_path`, derived from the journal), and the transcript,
with thinking, tool calls and tool results folded in `<details>`. Everything read from the
journal is HTML-escaped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from fisk_sm.cli.session import record_line, session_records
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import Assistant, Meta, Record, Terminal, ToolResult, User
from fisk_sm.machine.diagram import svg
from fisk_sm.machine.path import SessionPath, session_path
from fisk_sm.machine.table import load_table

__all__ = ["add_report_parser", "cmd_report", "report_html"]

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#111}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}th{background:#f6f6f6}.num{text-align:right}
.diagram svg{max-width:100%;height:auto}pre{white-space:pre-wrap;background:#f7f7f7;
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
        args.output.write_text(page, encoding="utf-8")
    else:
        sys.stdout.write(page)
    return 0


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
        f"<h2>Path</h2><div class='diagram'>{_inline_svg(path)}</div>\n"
        f"<h2>Timeline</h2>{_timeline(records, path)}\n"
        f"<h2>Transcript</h2>{_transcript(records)}\n"
        "</body></html>\n"
    )


def _inline_svg(path: SessionPath) -> str:
    """The diagram as an `<svg>` element (Graphviz's XML prolog and doctype dropped)."""
    text = svg(load_table(), [path])
    return text[text.index("<svg") :] if "<svg" in text else escape(text)


def _timeline(records: Sequence[Record], path: SessionPath) -> str:
    turns = {r.seq: r for r in records if isinstance(r, Assistant)}
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
            f"<td><b>{escape(step.destination)}</b></td><td>{escape(tokens)}</td>"
        )
        rows.append(f"<tr>{cells}</tr>")
    head = (
        "<tr><th>#</th><th>seq</th><th>iteration</th><th>from</th><th>trigger</th>"
        "<th>guard</th><th>to</th><th>tokens of the turn</th></tr>"
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

"""`fisk-sm diagram --session ID`: a session's path drawn on the machine, from its journal alone.

The sessions are run in process with no `--events` file and no recorder: the path comes from
the journal. The mermaid text and the SVG (read with xml.etree) are checked for the visited
states, the counts on the fired exits and the marked terminal state.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import make_config

from fisk_sm import tool
from fisk_sm.cli.main import main
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import start_session
from fisk_sm.testing import FakeMessagesAPI, Reply

SVG = "{http://www.w3.org/2000/svg}"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


async def make_session(api: FakeMessagesAPI, store: FileStore, run_id: str, *replies: Reply) -> str:
    """Run a session of `replies` to its end; returns the state it ended in."""
    api.add(*replies)
    run = await start_session(
        make_config(api), "add", store, RunOptions(tools=[add]), run_id=run_id
    )
    async with run:
        return await run.run()


TWO_TOOL_TURNS = (
    Reply.tool_use("add", {"a": 1, "b": 2}),
    Reply.tool_use("add", {"a": 3, "b": 4}),
    Reply.text("10"),
)


@pytest.fixture
async def two_turns(api: FakeMessagesAPI, tmp_path: Path) -> Path:
    assert await make_session(api, FileStore(tmp_path), "two", *TWO_TOOL_TURNS) == "completed"
    return tmp_path


def diagram(state_dir: Path, out: Path, fmt: str, *ids: str) -> str:
    """`fisk-sm diagram --session ... -o out`, returning the file's text."""
    argv = ["diagram", "--format", fmt, "-o", str(out), "--state-dir", str(state_dir)]
    argv += ["--session", ids[0]] + (["--compare", ids[1]] if len(ids) > 1 else [])
    assert main(argv) == 0
    return out.read_text(encoding="utf-8")


def mermaid_parts(text: str) -> tuple[dict[str, str], dict[tuple[str, str], str], set[str]]:
    """(state -> note, (source, dest) -> edge label, names in `class ... current`)."""
    notes, edges, current = {}, {}, set()
    for line in text.splitlines()[1:]:
        line = line.strip()
        if m := re.fullmatch(r"(\w+) --> (\w+) : (.+)", line):
            edges[m[1], m[2]] = m[3]
        elif m := re.fullmatch(r"(\w+) : (.+)", line):
            notes[m[1]] = m[2]
        elif m := re.fullmatch(r"class ([\w,]+) current", line):
            current |= set(m[1].split(","))
    return notes, edges, current


def test_mermaid_shows_the_path_of_two_tool_turns(two_turns: Path) -> None:
    notes, edges, current = mermaid_parts(diagram(two_turns, two_turns / "d.mmd", "mermaid", "two"))
    assert notes["execute"] == "×2"
    assert notes["call"] == "×3"
    assert notes["completed"] == "×1 (end)"
    assert current == {"completed"}
    assert "budget_exhausted" not in notes and "suspended" not in notes
    assert edges["budget_check", "gate"] == "2. accounted [tools_pending] ×2"
    assert edges["gate", "execute"] == "2. gated [else] ×2"
    assert edges["execute", "feed_back"] == "2. tool_done [else] ×2"
    assert edges["execute", "gate"] == "1. tool_done [tools_pending]"  # never fired
    assert edges["gate", "awaiting_approval"] == "1. gated [approval_pending]"  # nothing gated
    assert edges["decide", "completed"] == "3. decided [turn_is_final] ×1"


def svg_nodes(text: str) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """(state -> (class, text), edge id -> (class, label text)) from Graphviz's SVG."""
    root = ET.fromstring(text)
    nodes, edges = {}, {}
    for group in root.iter(f"{SVG}g"):
        classes = group.get("class", "")
        words = " ".join((t.text or "").strip() for t in group.iter(f"{SVG}text"))
        if classes.startswith("node") and (group.get("id") or "").startswith("state_"):
            nodes[group.get("id", "")[len("state_") :]] = (classes, words)
        elif classes.startswith("edge") and "__" in (group.get("id") or ""):
            edges[group.get("id", "")] = (classes, words)
    return nodes, edges


def test_svg_shows_the_path_of_two_tool_turns(two_turns: Path) -> None:
    nodes, edges = svg_nodes(diagram(two_turns, two_turns / "d.svg", "svg", "two"))
    assert nodes["execute"] == ("node visited", "execute ×2")
    assert nodes["completed"] == ("node visited current", "completed ×1 (end)")
    assert nodes["failed"][0] == "node unvisited"
    assert edges["budget_check__accounted__gate"] == (
        "edge fired",
        "2. accounted [tools_pending] ×2",
    )
    assert edges["execute__tool_done__gate"][0] == "edge unfired"


async def test_two_sessions_compared(api: FakeMessagesAPI, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert await make_session(api, store, "two", *TWO_TOOL_TURNS) == "completed"
    over = Reply.tool_use("add", {"a": 1, "b": 2}, input_tokens=10**9)
    assert await make_session(api, store, "broke", over) == "budget_exhausted"
    text = diagram(tmp_path, tmp_path / "c.mmd", "mermaid", "two", "broke")
    notes, edges, current = mermaid_parts(text)
    assert notes["execute"] == "2/0 A only"
    assert notes["budget_exhausted"] == "0/1 (B end) B only"
    assert notes["completed"] == "1/0 (A end) A only"
    assert notes["call"] == "3/1"
    assert edges["budget_check", "gate"] == "2. accounted [tools_pending] 2/0"
    assert current == {"completed", "budget_exhausted"}
    assert "note left of suspend_check : A = two (now completed), B = broke" in text
    assert "class gate,execute,feed_back,completed only_a" in text
    nodes, _ = svg_nodes(diagram(tmp_path, tmp_path / "c.svg", "svg", "two", "broke"))
    assert nodes["budget_exhausted"][0] == "node only_b current"


def test_png_and_dot_are_drawn(two_turns: Path) -> None:
    out = two_turns / "d.png"
    assert main(["diagram", "--session", "two", "--state-dir", str(two_turns), "--format",
                 "png", "-o", str(out)]) == 0  # fmt: skip
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    text = diagram(two_turns, two_turns / "d.dot", "dot", "two")
    assert 'class="visited current"' in text


def test_compare_needs_a_session(tmp_path: Path) -> None:
    assert main(["diagram", "--compare", "x", "--state-dir", str(tmp_path)]) == 2


def test_an_unknown_session_is_bad_input(tmp_path: Path) -> None:
    assert main(["diagram", "--session", "nope", "--state-dir", str(tmp_path)]) == 2


def test_session_show_lists_the_records_with_their_seq(
    two_turns: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (here, beside the session it reads: `fork --at SEQ` takes these numbers)
    assert main(["session", "show", "two", "--state-dir", str(two_turns)]) == 0
    out = capsys.readouterr().out
    listing = out[out.index("records (seq):\n") :].splitlines()[1:9]
    assert [line.split(maxsplit=2)[:2] for line in listing] == [
        ["1", "meta"], ["2", "assistant"], ["3", "tool_started"], ["4", "tool_result"],
        ["5", "assistant"], ["6", "tool_started"], ["7", "tool_result"], ["8", "assistant"],
    ]  # fmt: skip
    assert listing[1].startswith("  2 assistant (tool_use: add)")
    assert listing[2].startswith("  3 tool_started add (toolu_")
    assert out.splitlines()[-1] == "  9 terminal completed"


async def test_report_is_one_self_contained_page(api: FakeMessagesAPI, tmp_path: Path) -> None:
    thinking = {"type": "thinking", "thinking": "add <b>first</b>", "signature": "sig"}
    first = Reply.tool_use("add", {"a": 1, "b": 2})
    first = Reply(content=(thinking, *first.content), stop_reason="tool_use", input_tokens=42)
    store = FileStore(tmp_path)
    assert await make_session(api, store, "rep", first, Reply.text("<script>3</script>")) == (
        "completed"
    )
    out = tmp_path / "report.html"
    assert main(["report", "rep", "--state-dir", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for outside in ("<script", "<link", " src=", "href=", "@import", "url("):
        assert outside not in page.lower(), outside
    assert "&lt;script&gt;3&lt;/script&gt;" in page  # the journal's text is escaped
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    nodes, _ = svg_nodes(svg)
    assert nodes["execute"] == ("node visited", "execute ×1")
    details = re.findall(r"<details><summary[^>]*>([^<]*)</summary>", page)
    assert details[0] == "thinking"
    assert "<summary>thinking</summary><pre>add &lt;b&gt;first&lt;/b&gt;</pre>" in page
    assert details[1].startswith("tool call add (") and details[2].startswith("result of ")
    timeline = page[page.index("<h2>Timeline</h2>") : page.index("<h2>Transcript</h2>")]
    assert timeline.count("<tr>") == 1 + 13  # the header, then one row per state entered
    assert "in 42 out 5 cache 0/0" in timeline

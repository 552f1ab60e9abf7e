"""The journal's optional timings and approvers: `Assistant.latency_ms` (the model call's wall
time), `ToolResult.duration_ms` (the tool's, start to result) and `ApprovalAnswered.by`/`.at`
(who answered, and when, UTC).

A new run writes them; a record without them is the line it always was (each is written only
when it has a value), so a journal written before them reads, re-encodes and reports as before.
`encode` and `decode` are held to the cattrs converter for the new fields as
tests/test_journal_decode.py holds them for the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import make_config
from test_journal_decode import outcome, reference, reference_encode, variants

from fisk_sm import RunOptions, start_session, tool
from fisk_sm.cli.report import report_html
from fisk_sm.cli.step_prompter import StepPrompter
from fisk_sm.events.usage import Usage
from fisk_sm.journal.decode import decode
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Record,
    ToolResult,
    ToolStarted,
    encode,
)
from fisk_sm.machine.path import session_path
from fisk_sm.operator.prompter import (
    Approval,
    NoOperator,
    PromptError,
    ScriptedPrompter,
    TerminalPrompter,
)
from fisk_sm.supervisor.host.desk import ApprovalDesk, DeskPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply

COMPAT = Path(__file__).parent / "fixtures" / "compat"
OLD_JOURNALS = sorted(COMPAT.glob("*/sessions/*.json"))
AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
MESSAGE = {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}
TIMED: list[Record] = [
    Assistant(2, 1, MESSAGE, "end_turn", Usage(1, 2, 3, 4), latency_ms=1234),
    Assistant(2, 1, MESSAGE, None, latency_ms=0),
    ToolResult(4, "toolu_1", {"content": "x"}, duration_ms=56),
    ToolResult(4, "toolu_1", {"content": []}, is_error=True, kind="exec", duration_ms=7),
    ApprovalAnswered(6, "toolu_2", "once", by="terminal", at="2026-01-01T00:00:00Z"),
    ApprovalAnswered(6, "toolu_2", "no", "the prompt failed", at="2026-01-01T00:00:00Z"),
]


@tool(tags=["ai:confirm"])
def wipe(path: str) -> str:
    """Wipe a path (pretend).

    Args:
        path: what to wipe
    """
    return f"wiped {path}"


async def journal_of(api: FakeMessagesAPI, tmp_path: Path, prompter: object) -> list[dict]:
    """Run `wipe` (gated) then answer, under `prompter`; the journal's records as JSON."""
    api.add(Reply.tool_use("wipe", {"path": "/a"}, id="t1"), Reply.text("done"))
    options = RunOptions(tools=[wipe], prompter=prompter)  # type: ignore[arg-type]
    run = await start_session(make_config(api), "wipe /a", FileStore(tmp_path), options, run_id="r")
    try:
        assert await run.run() == "completed"
    finally:
        await run.aclose()
    raw = (tmp_path / "r.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in raw.splitlines()]


async def test_a_new_run_journals_latency_duration_and_who_answered_when(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    lines = await journal_of(api, tmp_path, ScriptedPrompter(approvals=[Approval.ONCE]))
    turns = [line for line in lines if line["type"] == "assistant"]
    assert len(turns) == 2
    for turn in turns:
        assert type(turn["latency_ms"]) is int and turn["latency_ms"] >= 0
        assert list(turn)[-2:] == ["latency_ms", "type"]  # after the token tiers
    (result,) = [line for line in lines if line["type"] == "tool_result"]
    assert type(result["duration_ms"]) is int and result["duration_ms"] >= 0
    (answer,) = [line for line in lines if line["type"] == "approval_answered"]
    assert answer["by"] == "script" and AT.fullmatch(answer["at"]), answer
    assert answer["answer"] == "once"


async def test_a_failed_prompt_has_a_time_but_no_approver(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    prompter = ScriptedPrompter(approvals=[PromptError("the terminal went away")])
    lines = await journal_of(api, tmp_path, prompter)
    (answer,) = [line for line in lines if line["type"] == "approval_answered"]
    assert answer["answer"] == "no" and answer["reason"]
    assert "by" not in answer and AT.fullmatch(answer["at"]), answer
    # the denied call never ran: its result has no duration
    (result,) = [line for line in lines if line["type"] == "tool_result"]
    assert "duration_ms" not in result and "ToolStarted" not in json.dumps(lines)


def test_each_prompter_says_who_it_stands_for() -> None:
    desk = DeskPrompter(ApprovalDesk(), "r")
    stepper = StepPrompter(NoOperator(), object())  # type: ignore[arg-type]
    names = [p.name for p in (TerminalPrompter(), ScriptedPrompter(), desk, stepper)]
    assert names == ["terminal", "script", "supervisor", "stepper"]


@pytest.mark.parametrize("record", TIMED, ids=lambda r: type(r).__name__)
def test_a_timed_record_round_trips_as_through_the_converter(record: Record) -> None:
    line = encode(record)
    assert line == reference_encode(record)
    assert decode(line) == record == reference(line)


def test_records_without_the_new_fields_are_written_as_they_always_were() -> None:
    plain = [
        Assistant(2, 1, MESSAGE, "end_turn", Usage(1, 2, 3, 4)),
        ToolResult(4, "toolu_1", {"content": "x"}),
        ApprovalAnswered(6, "toolu_2", "once"),
    ]
    assert [encode(r) for r in plain] == [
        '{"seq":2,"iteration":1,"message":{"role":"assistant","content":[{"type":"text",'
        '"text":"hi"}]},"stop_reason":"end_turn","input_tokens":1,"output_tokens":2,'
        '"cache_read_tokens":3,"cache_create_tokens":4,"type":"assistant"}',
        '{"seq":4,"tool_use_id":"toolu_1","result":{"content":"x"},"is_error":false,'
        '"kind":"python","type":"tool_result"}',
        '{"seq":6,"tool_use_id":"toolu_2","answer":"once","reason":null,'
        '"type":"approval_answered"}',
    ]
    added = [
        json.loads(encode(timed)).keys() - json.loads(encode(old)).keys()
        for timed, old in zip(TIMED[::2], plain, strict=True)
    ]
    assert added == [{"latency_ms"}, {"duration_ms"}, {"by", "at"}]


@pytest.mark.parametrize("line", sorted({v for r in TIMED for v in variants(r)}))
def test_odd_values_of_the_new_fields_decode_or_fail_as_through_the_converter(line: str) -> None:
    assert outcome(decode, line) == outcome(reference, line)


@pytest.mark.parametrize("where", OLD_JOURNALS, ids=lambda p: p.parts[-3])
def test_an_old_journal_reads_re_encodes_and_reports_as_before(where: Path) -> None:
    raw = where.read_bytes()
    records = [decode(line) for line in raw.splitlines()]
    again = "".join(encode(r) + "\n" for r in records).encode()
    # (a lone surrogate's escape is read as U+FFFD, so that journal re-encodes differently)
    assert again == raw or where.parts[-3] == "lone_surrogate"
    for r in records:
        assert getattr(r, "latency_ms", None) is None
        assert getattr(r, "duration_ms", None) is None
        assert getattr(r, "by", None) is None and getattr(r, "at", None) is None
    page = report_html(records, session_path(records))
    # a tool result without a tool_started did not run: it has no duration in any journal
    started = {r.tool_use_id for r in records if isinstance(r, ToolStarted)}
    ran = [r for r in records if isinstance(r, ToolResult) and r.tool_use_id in started]
    turns = [r for r in records if isinstance(r, Assistant)]
    asked = [r for r in records if isinstance(r, ApprovalRequested)]
    assert page.count("<td class='unknown'>not journaled</td>") == len(ran + turns + asked)
    if turns:
        assert "written before timings were recorded" in page
    if any(isinstance(r, ApprovalAnswered) for r in records):
        assert "written before who answered" in page
    assert len(OLD_JOURNALS) == 6

"""fold: the pure function from journal records to the resumable snapshot (REFERENCE §9, 34)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from fisk_sm.journal.decode import decode
from fisk_sm.journal.fold import FoldError, fold
from fisk_sm.journal.records import (
    FORMAT_VERSION,
    Assistant,
    Meta,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
    User,
    encode,
)
from fisk_sm.journal.snapshot import Snapshot, Usage
from fisk_sm.model.blocks import Message

TIERS = Usage(input_tokens=10, output_tokens=5, cache_read_tokens=3, cache_create_tokens=2)


def meta(version: int = FORMAT_VERSION) -> Meta:
    return Meta(
        seq=1,
        version=version,
        run_id="r1",
        created="2026-12-02T00:00:00Z",
        fingerprint={"model": "m"},
        prompt="the prompt",
    )


def use(id_: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": "t", "input": {}}


def turn(seq: int, iteration: int, *blocks: dict[str, Any], stop: str = "tool_use") -> Assistant:
    return Assistant(
        seq=seq,
        iteration=iteration,
        message={"role": "assistant", "content": list(blocks)},
        stop_reason=stop,
        usage=TIERS,
    )


def result(seq: int, id_: str) -> ToolResult:
    block = {"type": "tool_result", "tool_use_id": id_, "content": f"out {id_}"}
    return ToolResult(seq=seq, tool_use_id=id_, result=block)


def started(seq: int, id_: str) -> ToolStarted:
    return ToolStarted(seq=seq, tool_use_id=id_, name="t")


def ended(seq: int, reason: str, message: str | None = None) -> Terminal:
    return Terminal(seq=seq, reason=reason, message=message)


def test_meta_only_is_the_prompt_at_the_first_boundary() -> None:
    snap = fold([meta()])
    assert snap.messages == (Message("user", "the prompt"),)
    assert (snap.iteration, snap.state, snap.status, snap.seq) == (0, "suspend_check", "open", 1)


def test_a_fully_answered_turn_is_committed_with_one_user_message() -> None:
    snap = fold([meta(), turn(2, 1, use("a"), use("b")), result(3, "a"), result(4, "b")])
    assert [m.role for m in snap.messages] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in snap.messages[2].to_json()["content"]] == ["a", "b"]
    assert (snap.state, snap.iteration, snap.tool_calls, snap.llm_calls) == (
        "suspend_check",
        1,
        2,
        1,
    )
    assert snap.usage.total == 20 and snap.usage.cache_create_tokens == 2
    assert not snap.pending


def test_a_partly_answered_turn_resumes_in_execute_with_only_the_unanswered_calls() -> None:
    snap = fold([meta(), turn(2, 1, use("a"), use("b"), use("c")), result(3, "a"), started(4, "b")])
    assert snap.state == "execute"
    assert [p.id for p in snap.pending] == ["b", "c"]
    assert snap.answered == ("a",)
    assert snap.interrupted == ("b",)
    assert snap.messages[-1].role == "assistant"  # as in a live run after `journal`


def test_a_journaled_turn_with_nothing_started_resumes_in_decide() -> None:
    snap = fold([meta(), turn(2, 1, use("a")), ended(3, "budget_exhausted", "token budget")])
    assert snap.state == "decide"
    assert [p.id for p in snap.pending] == ["a"]
    assert snap.status == "budget_exhausted" and snap.outcome == "token budget"


def test_a_trailing_pause_turn_is_committed() -> None:
    paused = turn(2, 1, {"type": "text", "text": "..."}, stop="pause_turn")
    snap = fold([meta(), paused])
    assert snap.messages[-1].to_json() == paused.message
    assert snap.stop_reason == "pause_turn"


@pytest.mark.parametrize("version", [FORMAT_VERSION - 1, FORMAT_VERSION + 1])
def test_other_format_versions_are_refused(version: int) -> None:
    with pytest.raises(FoldError, match="version"):
        fold([meta(version)])


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([turn(1, 1)], "meta"),
        ([], "meta"),
        ([meta(), turn(2, 1, use("a")), turn(2, 2)], "seq 2 after seq 2"),
        ([meta(), meta()], "seq 1 after seq 1"),
        ([meta(), attrs.evolve(meta(), seq=2)], "second meta"),
        ([meta(), result(2, "a")], "before any assistant"),
    ],
)
def test_malformed_journals_are_refused(records: list[Record], problem: str) -> None:
    with pytest.raises(FoldError, match=problem):
        fold(records)


def test_user_records_merge_into_the_trailing_user_message_and_keep_the_iteration() -> None:
    text = {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}
    records: list[Record] = [
        meta(),
        Assistant(seq=2, iteration=1, message=text, stop_reason="end_turn"),
        User(seq=3, message={"role": "user", "content": "more"}),
        User(seq=4, message={"role": "user", "content": [{"type": "text", "text": "and more"}]}),
    ]
    snap = fold(records)
    assert snap.messages[-1].to_json() == {
        "role": "user",
        "content": [{"type": "text", "text": "more"}, {"type": "text", "text": "and more"}],
    }
    assert snap.iteration == 1 and snap.stop_reason == "end_turn"


def test_records_after_a_suspend_are_not_completed_and_the_last_terminal_wins() -> None:
    done = turn(4, 2, {"type": "text", "text": "answer"}, stop="end_turn")
    base: list[Record] = [meta(), turn(2, 1, use("a")), result(3, "a")]
    suspended = fold([*base, ended(4, "suspended")])
    assert not suspended.completed and suspended.state == "suspend_check"
    answer = Assistant(seq=5, iteration=2, message=done.message, stop_reason="end_turn")
    after = fold([*base, ended(4, "suspended"), answer])
    assert after.status == "suspended" and not after.completed and after.state == "decide"
    finished = fold([*base, done, ended(5, "completed")])
    assert finished.completed and finished.state == "completed"


def test_the_snapshot_round_trips_through_json() -> None:
    snap = fold([meta(), turn(2, 1, use("a"), use("b")), result(3, "a"), started(4, "b")])
    assert Snapshot.from_json(snap.to_json()) == snap


# An assistant turn exactly as fisk-sm wrote it before `usage` was one value and before the
# record's iteration was the call count (it was one lower: 0 for the first call).
OLD_TURN = (
    '{"seq":2,"iteration":0,"message":{"role":"assistant","content":[{"type":"text","text":"hi"}]},'
    '"stop_reason":"end_turn","input_tokens":10,"output_tokens":5,"cache_read_tokens":3,'
    '"cache_create_tokens":2,"type":"assistant"}'
)


def test_an_assistant_record_keeps_its_on_disk_layout_with_usage_as_one_value() -> None:
    record = decode(OLD_TURN)
    assert isinstance(record, Assistant)
    assert record.usage == TIERS
    assert encode(record) == OLD_TURN  # the same bytes back: tiers flat, in their old place


def test_an_assistant_record_without_tiers_reads_as_zero_usage_and_usage_is_no_disk_key() -> None:
    bare = decode('{"seq":2,"iteration":1,"message":{},"stop_reason":null,"type":"assistant"}')
    assert isinstance(bare, Assistant) and bare.usage == Usage()
    nested = '{"seq":2,"iteration":1,"message":{},"stop_reason":null,"usage":{},"type":"assistant"}'
    with pytest.raises(ValueError, match="usage"):
        decode(nested)
    with pytest.raises(ValueError, match="invalid literal"):
        decode(OLD_TURN.replace('"output_tokens":5', '"output_tokens":"five"'))


def test_old_and_new_journals_fold_to_the_same_iteration() -> None:
    old_turn = decode(OLD_TURN)
    assert isinstance(old_turn, Assistant)
    old = fold([meta(), old_turn])
    new = fold([meta(), attrs.evolve(old_turn, iteration=1)])
    assert old == new
    assert (old.iteration, old.llm_calls, old.state) == (1, 1, "decide")

"""Typed messages keep the model's blocks byte-exact: through the journal, a resume and the
request that sends them back; and the journal and the requests are the bytes they always were.

The run (tests/blockskit.py) gets a reply holding a redacted_thinking block, a thinking block
(its signature, an unknown key in the middle), a block of a type fisk-sm does not know and a
tool_use with an unknown key; it suspends after the tool turn and resumes in a new `Run` from
the file journal. tests/fixtures/blocks/ holds the journal and the request bodies the code
before typed messages wrote and sent for the same run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import attrs
import blockskit
import msgspec
import pytest

from fisk_sm.journal.decode import decode
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import Assistant, encode
from fisk_sm.journal.snapshot import PendingApproval, RunData, Snapshot, Usage
from fisk_sm.model.blocks import (
    Message,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_of,
    message_of,
)
from fisk_sm.testing import FakeMessagesAPI


def wire(block: dict[str, Any]) -> str:
    """A block's JSON text as the SDK sends it and the journal holds it (compact, UTF-8)."""
    return json.dumps(block, separators=(",", ":"), ensure_ascii=False)


def pairs(value: object) -> Any:
    """`value` through JSON with every object as its ordered (key, value) pairs."""
    return json.loads(json.dumps(value), object_pairs_hook=lambda p: p)


MODEL_BLOCKS = (blockskit.REDACTED, blockskit.THINKING, blockskit.UNKNOWN, blockskit.TOOL_USE)


def run(tmp_path: Path, *, stream: bool = False) -> tuple[FakeMessagesAPI, bytes, str]:
    with FakeMessagesAPI(blockskit.script()) as api:
        status = asyncio.run(blockskit.run_and_resume(api, tmp_path, stream=stream))
    journal = (tmp_path / f"{blockskit.RUN_ID}.json").read_bytes()
    return api, journal, status


@pytest.fixture
def ran(tmp_path: Path) -> tuple[FakeMessagesAPI, bytes, str]:
    return run(tmp_path)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_models_blocks_come_back_byte_exact_after_a_journal_round_trip_and_a_resume(
    tmp_path: Path, stream: bool
) -> None:
    api, journal, status = run(tmp_path, stream=stream)
    assert status == "completed"
    assert [r.get("stream", False) for r in api.requests] == [stream, stream]
    assert len(api.raw_requests) == 2
    sent_back = api.raw_requests[1].decode()
    for block in MODEL_BLOCKS:
        assert wire(block) in journal.decode(), block["type"]
        assert wire(block) in sent_back, block["type"]
    # the whole turn, in the order the model sent it, as one run of text
    turn = json.dumps(
        list(blockskit.script()[0].content), separators=(",", ":"), ensure_ascii=False
    )
    assert f'{{"role":"assistant","content":{turn}}}' in sent_back


def test_the_journal_is_byte_identical_to_the_one_written_before_typed_messages(
    ran: tuple[FakeMessagesAPI, bytes, str],
) -> None:
    _, journal, _ = ran
    assert blockskit.normalised(journal) == blockskit.FIXTURE.read_bytes()


def test_the_requests_are_identical_to_the_ones_sent_before_typed_messages(
    ran: tuple[FakeMessagesAPI, bytes, str],
) -> None:
    api, _, _ = ran
    assert blockskit.requests_json(api.requests) == blockskit.REQUESTS.read_text()


def test_the_fixture_journal_folds_to_typed_records_that_write_it_back() -> None:
    lines = blockskit.FIXTURE.read_bytes().splitlines()
    records = [decode(line) for line in lines]
    snapshot = fold(records[:5])  # the tool turn answered, before the suspend
    kinds = [type(b) for b in snapshot.messages[1].blocks()]
    assert kinds == [
        RedactedThinkingBlock, ThinkingBlock, OtherBlock, TextBlock, ToolUseBlock, ToolUseBlock,
    ]  # fmt: skip
    assert all(isinstance(b, ToolResultBlock) for b in snapshot.messages[2].blocks())
    for record in records:
        if isinstance(record, Assistant):
            again = Assistant(
                record.seq,
                record.iteration,
                message_of(record.message).to_json(),
                record.stop_reason,
                record.usage,
            )
            assert encode(again).encode() in lines
    assert Snapshot.from_json(snapshot.to_json()) == snapshot
    assert pairs(json.loads(Snapshot.from_json(snapshot.to_json()).to_json())) == pairs(
        json.loads(snapshot.to_json())
    )


@pytest.mark.parametrize(
    "block",
    [
        {"type": "thinking", "thinking": "t", "new_key": [1, {"b": 1, "a": 2}], "signature": "s"},
        {"citations": None, "type": "text", "text": "hi", "extra": {"z": 0, "a": 1}},
        {"type": "tool_use", "id": "t1", "caller": {"type": "direct"}, "name": "n", "input": {}},
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"q": "x"}},
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image"}], "cache": 1},
        {"type": "redacted_thinking", "data": "abc", "later": True},
        {"type": "web_search_tool_result", "tool_use_id": "s1", "content": [{"url": "u"}]},
        {"type": "future", "b": 1, "a": 2},
        {"no_type": 1},
        {"type": "thinking", "thinking": "no signature"},
    ],
)
def test_unknown_keys_and_types_survive_decode_and_encode(block: dict[str, Any]) -> None:
    message = message_of(json.loads(json.dumps({"role": "assistant", "content": [block]})))
    assert wire(message.to_json()["content"][0]) == wire(block)
    journaled = encode(Assistant(2, 1, message.to_json(), "end_turn"))
    decoded = decode(journaled)
    assert isinstance(decoded, Assistant)
    assert wire(message_of(decoded.message).to_json()["content"][0]) == wire(block)


def test_a_malformed_call_is_kept_whole_as_a_block_and_refused_in_a_message() -> None:
    malformed = {"type": "tool_use", "name": "no id", "input": {}}
    assert block_of(malformed) == OtherBlock(malformed)
    with pytest.raises(ValueError, match=r"^message\.content\[1\]: a malformed tool_use block$"):
        message_of({"role": "assistant", "content": [{"type": "text", "text": "x"}, malformed]})


def test_blocks_built_here_are_written_in_the_api_order() -> None:
    assert ToolResultBlock("t", "out").to_json() == {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": "out",
    }
    assert list(ToolResultBlock("t", ({"type": "text", "text": "x"},), True).to_json()) == [
        "type",
        "tool_use_id",
        "content",
        "is_error",
    ]
    assert Message("user", "hi").to_json() == {"role": "user", "content": "hi"}
    assert block_of({"type": "text", "text": "x"}) == TextBlock("x")


def test_msgspec_structs_would_drop_unknown_keys() -> None:
    """Why the records are attrs over the parsed objects (bench/messages.py): a msgspec.Struct
    drops a key it does not declare, so a thinking block would not go back as it came."""

    class Thinking(msgspec.Struct, tag="thinking", tag_field="type"):
        thinking: str
        signature: str

    raw = wire({"type": "thinking", "thinking": "t", "new_key": 1, "signature": "s"}).encode()
    again = msgspec.json.encode(msgspec.json.decode(raw, type=Thinking))
    assert again != raw and b"new_key" not in again
    assert wire(block_of(json.loads(raw)).to_json()).encode() == raw


def test_a_snapshot_carries_every_field_of_the_run_data_both_ways() -> None:
    """`Snapshot.of` and `Snapshot.data` name each field: one added to `RunData` and left out
    of either fails here."""
    use = ToolUseBlock("t1", "add", {"a": 1})
    values = {
        "run_id": "r", "prompt": "p", "messages": [Message("user", "p")], "iteration": 3,
        "usage": Usage(1, 2, 3, 4), "last_usage": Usage(1, 1, 0, 0), "llm_calls": 3,
        "tool_calls": 2, "turn": Message("assistant", (use,)), "stop_reason": "tool_use",
        "pending": [use], "results": [ToolResultBlock("t0", "x")], "error": "e",
        "interrupted": ["t1"], "tool_kinds": {"python": 2},
        "approval": PendingApproval("r", "t1", "add", {"a": 1}, "ai:confirm"),
        "denials": {"t2": "no"}, "allowed": ["mul"], "chat": True, "follow_ups": 1,
        "at_input": True, "input_ended": True,
    }  # fmt: skip
    assert set(values) == {f.name for f in attrs.fields(RunData)}
    data = RunData(**values)  # type: ignore[arg-type]
    snapshot = Snapshot.of("execute", data, seq=9, created="c", fingerprint={"model": "m"})
    assert snapshot.data() == data
    assert (snapshot.seq, snapshot.created, snapshot.fingerprint) == (9, "c", {"model": "m"})
    assert Snapshot.from_json(snapshot.to_json()) == snapshot

"""Typed events: one per state entry, in order; and the adapters that render them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config, make_run
from structlog.testing import capture_logs

from fisk_sm import Event, JsonLinesEvents, Recorder, Run, StructlogEvents, tool
from fisk_sm.cli.lineui import LineUI
from fisk_sm.events import (
    Fanout,
    MessageReceived,
    RunEnded,
    RunStarted,
    StateEntered,
    ToolCalled,
    ToolFinished,
    Usage,
)
from fisk_sm.events.types import wants
from fisk_sm.journal.records import Assistant
from fisk_sm.journal.snapshot import RunData
from fisk_sm.loop.harness import RunOptions
from fisk_sm.testing import FakeMessagesAPI, Reply


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text


async def test_one_state_entered_event_per_state_entry_in_order(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("echo", {"text": "hi"}), Reply.text("bye"))
    run, events, journal = make_run(api, [echo])
    entered: list[str] = []
    while not run.finished:
        before = len(events.of(StateEntered))
        step = await run.step()
        new = events.of(StateEntered)[before:]
        # the first step also reports entering the initial state
        entered += [e.state for e in new]
        assert new[-1].state == step.destination
    assert entered == [
        "suspend_check", "call", "journal", "decide", "budget_check", "gate", "execute",
        "feed_back", "suspend_check", "call", "journal", "decide", "completed",
    ]  # fmt: skip
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "RunStarted"
    assert kinds[-1] == "RunEnded"
    order = [e for e in kinds if e in ("ToolCalled", "ToolFinished", "MessageReceived")]
    assert order == ["MessageReceived", "ToolCalled", "ToolFinished", "MessageReceived"]
    ended = events.of(RunEnded)[0]
    assert (ended.state, ended.answer, ended.llm_calls, ended.tool_calls) == (
        "completed",
        "bye",
        2,
        1,
    )
    assert ended.usage == Usage(input_tokens=20, output_tokens=10)
    started = events.of(RunStarted)[0]
    assert started.tools == ("echo",) and started.model == "claude-test"
    messages = events.of(MessageReceived)
    assert [m.terminal for m in messages] == [False, True]
    assert messages[0].usage == Usage(input_tokens=10, output_tokens=5)
    # one iteration number everywhere: the model calls started when the event was made
    assert [e.iteration for e in events.of(StateEntered)] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    assert [m.iteration for m in messages] == [1, 2]
    assert [r.iteration for r in journal.records if isinstance(r, Assistant)] == [1, 2]
    assert ended.iteration == run.data.iteration == 2


class Picky:
    """A sink that reads only some kinds, and counts what it was offered."""

    def __init__(self, *kinds: type[Event]) -> None:
        self.kinds = kinds
        self.received: list[Event] = []

    def wants(self, kind: type[Event]) -> bool:
        return kind in self.kinds

    def emit(self, event: Event) -> None:
        self.received.append(event)


async def test_events_no_sink_reads_are_not_built(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    joined: list[str] = []

    def counting_init(event: StateEntered, **fields: Any) -> None:
        built.append(fields["state"])
        init(event, **fields)

    def counting_answer(data: RunData) -> str:
        joined.append(data.run_id)
        return answer(data)

    init, answer = StateEntered.__init__, RunData.answer
    monkeypatch.setattr(StateEntered, "__init__", counting_init)
    monkeypatch.setattr(RunData, "answer", counting_answer)
    api.add(Reply.tool_use("echo", {"text": "hi"}), Reply.text("bye"))
    picky = Picky(RunEnded)
    await Run.create(make_config(api), "go", RunOptions(tools=[echo], events=picky)).run()
    offered = {type(e) for e in picky.received}  # the rare events are still offered to all
    assert built == [] and StateEntered not in offered and MessageReceived not in offered
    assert RunEnded in offered
    assert len(joined) == 1  # the answer of RunEnded alone; no MessageReceived text per turn

    api.add(Reply.tool_use("echo", {"text": "hi"}), Reply.text("bye"))
    both = Fanout((Picky(RunEnded), Picky(StateEntered, MessageReceived)))
    await Run.create(make_config(api), "go", RunOptions(tools=[echo], events=both)).run()
    assert len(built) == 13 and len(joined) == 1 + 2 + 1  # a Fanout reads what any sink reads


def test_a_sink_without_wants_reads_everything_and_line_ui_reads_state_entries_only_in_trace() -> (
    None
):
    assert wants(Recorder(), StateEntered) and wants(JsonLinesEvents(io.StringIO()), StateEntered)
    assert not wants(LineUI(), StateEntered) and wants(LineUI(trace=True), StateEntered)
    assert wants(LineUI(), MessageReceived) and wants(LineUI(), RunEnded)


async def test_structlog_adapter_logs_every_event(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("echo", {"text": "x" * 5000}), Reply.text("done"))
    with capture_logs() as logs:
        run = Run.create(make_config(api), "go", RunOptions(tools=[echo], events=StructlogEvents()))
        await run.run()
    names = [entry["event"] for entry in logs]
    assert names[0] == "run_started"
    assert names.count("state_entered") == 13
    assert names[-1] == "run_ended"
    called = next(e for e in logs if e["event"] == "tool_called")
    assert called["name"] == "echo" and called["log_level"] == "info"
    finished = next(e for e in logs if e["event"] == "tool_finished")
    assert len(finished["output"]) == 2048 and finished["truncated"] is True
    assert all(e["run_id"] == run.data.run_id for e in logs)


def test_importing_fisk_sm_does_not_configure_logging() -> None:
    # structlog etiquette: the library never calls structlog.configure (checked in a fresh
    # interpreter, since capture_logs configures structlog in this one)
    code = "import fisk_sm, structlog, logging;"
    code += "print(structlog.is_configured(), logging.root.handlers)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False []"


async def test_line_ui_puts_only_the_answer_on_stdout(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("echo", {"text": "hey"}, text="let me echo"), Reply.text("the answer"))
    out, err = io.StringIO(), io.StringIO()
    run = Run.create(
        make_config(api), "go", RunOptions(tools=[echo], events=LineUI(out=out, err=err))
    )
    await run.run()
    assert out.getvalue() == "the answer\n"
    lines = err.getvalue().splitlines()
    assert '-> echo {"text": "hey"}' in lines
    assert "<- hey" in lines
    assert "model: let me echo" in lines
    assert lines[-1].startswith("claude-test · 2 llm calls · 1 tool calls · tokens in 20 out 10")


async def test_json_lines_stream_and_fanout(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.add(Reply.text("fine"))
    recorder = Recorder()
    path = tmp_path / "events.jsonl"
    with path.open("w") as stream:
        lines = JsonLinesEvents(stream)
        await Run.create(make_config(api), "go", RunOptions(events=Fanout((recorder, lines)))).run()
        await lines.aclose()  # the lines are written off the loop: wait for all of them
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == [e.kind for e in recorder]
    assert lines[-1]["state"] == "completed" and lines[-1]["answer"] == "fine"
    assert lines[-1]["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_tokens": 0,
        "cache_create_tokens": 0,
    }
    assert not recorder.of(ToolCalled) and not recorder.of(ToolFinished)


async def test_line_ui_strips_control_sequences_from_model_text(api: FakeMessagesAPI) -> None:
    evil = "\x1b]0;owned\x07\x1b[2Jhi\x9b31m"
    api.add(Reply.tool_use("echo", {"text": evil}), Reply.text("ok"))
    out, err = io.StringIO(), io.StringIO()
    run = Run.create(
        make_config(api), "go", RunOptions(tools=[echo], events=LineUI(out=out, err=err))
    )
    await run.run()
    shown = err.getvalue()
    assert "<- hi" in shown
    assert not any(c in shown for c in "\x1b\x07\x9b")

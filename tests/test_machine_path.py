"""`session_path`: a session's path derived from its journal equals what its runs reported.

Each scenario runs the real loop against the fake Messages API with a `Recorder`, then checks
that the path folded from the journal alone enters the same states, by the same transitions, at
the same iterations, as the `StateEntered` events the runs emitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config
from test_suspend_now import eventually

from fisk_sm import MemoryJournal, Recorder, Run, tool
from fisk_sm.events import StateEntered
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import Assistant, Meta, Record, Terminal, ToolResult, ToolStarted
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.diagram import render
from fisk_sm.machine.path import RESUME, PathError, SessionPath, session_path
from fisk_sm.machine.table import load_table
from fisk_sm.testing import FakeMessagesAPI, Reply

Entry = tuple[str, str | None, str | None, str | None, int]


@tool
def note(text: str) -> str:
    """Note something down.

    Args:
        text: what to note
    """
    return f"noted {text}"


def two_tools(first: str, second: str) -> Reply:
    """One turn calling `note` twice."""
    blocks = [
        {"type": "tool_use", "id": id_, "name": "note", "input": {"text": id_}}
        for id_ in (first, second)
    ]
    return Reply(content=blocks, stop_reason="tool_use")


PAUSED = Reply(content=({"type": "text", "text": "thinking..."},), stop_reason="pause_turn")


def reported(events: Recorder) -> list[Entry]:
    """What the runs reported: each StateEntered as (state, source, trigger, guard, iteration)."""
    return [(e.state, e.source, e.trigger, e.guard, e.iteration) for e in events.of(StateEntered)]


def derived(path: SessionPath) -> list[Entry]:
    """The path's steps in the same shape; a resume step is the entry a resumed run reports
    for the state it continues in, with no transition."""
    return [
        (s.destination, None, None, None, s.iteration)
        if s.trigger == RESUME
        else (s.destination, s.source, s.trigger, s.guard, s.iteration)
        for s in path.steps
    ]


async def run_once(api: FakeMessagesAPI, *replies: Reply, **budget: Any) -> tuple[Run, Recorder]:
    """One in-memory run of `replies` to its end."""
    api.add(*replies)
    events = Recorder()
    options = RunOptions(tools=[note], events=events, journal=MemoryJournal())
    run = Run.create(make_config(api, **budget), "go", options, run_id="path")
    await run.run()
    return run, events


def records_of(run: Run) -> list[Record]:
    journal = run.harness.journal
    assert isinstance(journal, MemoryJournal)
    return list(journal.records)


SCENARIOS: dict[str, tuple[tuple[Reply, ...], dict[str, int], str]] = {
    "two tool turns, then completed": (
        (two_tools("a", "b"), Reply.tool_use("note", {"text": "c"}), Reply.text("done")),
        {},
        "completed",
    ),
    "call failed after a tool turn": (
        (Reply.tool_use("note", {"text": "a"}), Reply.error(400)),
        {},
        "failed",
    ),
    "truncated turn": ((Reply.text("cut", stop_reason="max_tokens"),), {}, "failed"),
    "budget exhausted": (
        (Reply.tool_use("note", {"text": "a"}, input_tokens=200),),
        {"max_tokens": 150},
        "budget_exhausted",
    ),
    "iterations exhausted": (
        (Reply.tool_use("note", {"text": "a"}),),
        {"max_iterations": 1},
        "iterations_exhausted",
    ),
    "pause_turn": ((PAUSED, Reply.text("done")), {}, "completed"),
    "unknown tool rejected": (
        (Reply.tool_use("nope", {}), Reply.text("done")),
        {},
        "completed",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_the_path_from_the_journal_is_what_the_run_reported(
    api: FakeMessagesAPI, name: str
) -> None:
    replies, budget, end = SCENARIOS[name]
    run, events = await run_once(api, *replies, **budget)
    assert run.state == end
    path = session_path(records_of(run))
    assert derived(path) == reported(events)
    assert path.current == end
    assert path.run_id == "path"


async def test_two_tool_turns_count_execute_twice_per_batch_of_two(api: FakeMessagesAPI) -> None:
    replies, _, _ = SCENARIOS["two tool turns, then completed"]
    run, _ = await run_once(api, *replies)
    path = session_path(records_of(run))
    states = path.state_counts()
    assert (states["execute"], states["call"], states["completed"]) == (3, 3, 1)
    assert (states["gate"], states["awaiting_approval"]) == (3, 0)
    edges = path.transition_counts()
    assert edges["execute", "tool_done", "gate"] == 1
    assert edges["budget_check", "accounted", "gate"] == 2
    assert edges["gate", "gated", "execute"] == 3
    assert edges["decide", "decided", "completed"] == 1
    assert sum(edges.values()) == len(path.steps) - 1


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_prefix_stops_where_fold_resumes(api: FakeMessagesAPI, name: str) -> None:
    replies, budget, _ = SCENARIOS[name]
    run, _ = await run_once(api, *replies, **budget)
    records = records_of(run)
    whole = session_path(records).steps
    for end in range(1, len(records)):
        prefix = records[:end]
        path = session_path(prefix)
        assert path.steps == whole[: len(path.steps)], end
        if not isinstance(prefix[-1], Terminal):
            assert path.current == fold(prefix).state, end


async def session(
    api: FakeMessagesAPI,
    tmp_path: Path,
    polls: Sequence[bool],
    *replies: Reply,
) -> tuple[list[Record], Recorder]:
    """A file session suspended after `polls` boundary checks, resumed once and run to its end;
    one recorder hears both runs."""
    store, config, events = FileStore(tmp_path), make_config(api), Recorder()
    api.add(*replies)
    answers = iter(polls)
    suspend: Callable[[], bool] = lambda: next(answers, False)  # noqa: E731
    options = RunOptions(tools=[note], events=events, should_suspend=suspend)
    first = await start_session(config, "go", store, options, run_id="s")
    assert await first.run() == "suspended"
    await first.aclose()
    second = await resume_session(config, "s", store, RunOptions(tools=[note], events=events))
    assert await second.run() == "completed"
    await second.aclose()
    return store.load("s"), events


async def test_a_suspended_and_resumed_session(api: FakeMessagesAPI, tmp_path: Path) -> None:
    records, events = await session(
        api, tmp_path, [False, True], Reply.tool_use("note", {"text": "a"}), Reply.text("done")
    )
    path = session_path(records)
    assert derived(path) == reported(events)
    assert ("suspended", RESUME, "suspend_check") in path.edges
    assert path.current == "completed"
    drawn = render(load_table(), "mermaid", [path])
    assert "    suspended --> suspend_check : resume ×1\n" in drawn


async def test_a_session_suspended_after_a_paused_turn_resumes_in_decide(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    records, events = await session(api, tmp_path, [False, True], PAUSED, Reply.text("done"))
    path = session_path(records)
    assert derived(path) == reported(events)
    assert ("suspended", RESUME, "decide") in path.edges


META = Meta(seq=1, version=1, run_id="x", created="", fingerprint={}, prompt="p")
TURN = Assistant(
    seq=2,
    iteration=1,
    message={"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n"}]},
    stop_reason="tool_use",
)


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([], "does not start with a meta record"),
        ([META, ToolResult(seq=2, tool_use_id="t", result={})], "expected an assistant record"),
        ([META, TURN, Terminal(seq=3, reason="completed")], "the result of tool call t"),
        ([META, TURN, ToolResult(seq=3, tool_use_id="u", result={})], "tool call t"),
    ],
)
def test_records_that_are_no_path_are_refused(records: list[Record], message: str) -> None:
    with pytest.raises(PathError, match=message):
        session_path(records)


def test_a_tool_started_twice_was_retried_after_a_crash() -> None:
    records: list[Record] = [
        META,
        TURN,
        ToolStarted(seq=3, tool_use_id="t", name="n"),
        ToolStarted(seq=4, tool_use_id="t", name="n"),  # the process died; resumed, it retried
        ToolResult(seq=5, tool_use_id="t", result={}),
    ]
    path = session_path(records)
    assert path.edges[-5:] == (
        ("budget_check", "accounted", "gate"),
        ("gate", "gated", "execute"),
        ("execute", RESUME, "execute"),
        ("execute", "tool_done", "feed_back"),
        ("feed_back", "fed_back", "suspend_check"),
    )
    assert session_path(records[:3]).current == "execute" == fold(records[:3]).state


async def test_a_session_suspended_mid_call_resumes_at_the_boundary(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    # A suspend-now cut the call: the terminal record follows the meta (or the last turn)
    # with nothing of the call between them, and the path leaves `call` by `call_cancelled`.
    store, config, events = FileStore(tmp_path), make_config(api), Recorder()
    api.add(Reply.text("never delivered", delay=30), Reply.text("done"))
    first = await start_session(config, "go", store, RunOptions(events=events), run_id="c")
    running = asyncio.ensure_future(first.run())
    await eventually(lambda: bool(api.requests))  # in flight; its delay is never waited out
    first.request_suspend(now=True)
    assert await asyncio.wait_for(running, 60) == "suspended"
    await first.aclose()
    second = await resume_session(config, "c", store, RunOptions(events=events))
    assert await second.run() == "completed"
    await second.aclose()
    path = session_path(store.load("c"))
    assert derived(path) == reported(events)
    assert ("call", "replied", "suspended") in path.edges
    assert ("suspended", RESUME, "suspend_check") in path.edges
    assert path.steps[2].guard == "call_cancelled" and path.steps[2].iteration == 0

"""The loop's semantics, through the real anthropic SDK and a loopback fake Messages API."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_run

from fisk_sm import Step, Tool, tool
from fisk_sm.events import ToolFinished, Usage, WarningRaised
from fisk_sm.journal.records import Assistant, Terminal, ToolResult, ToolStarted
from fisk_sm.machine.evaluator import GuardCheck
from fisk_sm.testing import FakeMessagesAPI, Reply


def side_effect_tool(path: Path) -> Tool:
    @tool
    def touch(label: str) -> str:
        """Append a line to the side-effect file.

        Args:
            label: what to write
        """
        with path.open("a") as f:
            f.write(label + "\n")
        return f"wrote {label}"

    return touch


async def test_steps_visit_the_loop_states_in_order(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.add(Reply.tool_use("touch", {"label": "one"}, id="toolu_a"), Reply.text("done"))
    run, _, journal = make_run(api, [side_effect_tool(tmp_path / "fx")])
    steps: list[Step] = []
    while not run.finished:
        steps.append(await run.step())
    visited = [steps[0].source] + [s.destination for s in steps]
    assert visited == [
        "suspend_check", "call", "journal", "decide", "budget_check", "gate", "execute",
        "feed_back", "suspend_check", "call", "journal", "decide", "completed",
    ]  # fmt: skip
    assert [s.trigger for s in steps[:3]] == ["boundary", "replied", "journaled"]
    second = api.requests[1]["messages"]
    assert second[-1]["role"] == "user"
    assert second[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "wrote one"}
    ]
    assert second[-2]["content"][0]["id"] == "toolu_a"
    assert run.answer() == "done"
    assert (tmp_path / "fx").read_text() == "one\n"
    kinds = [type(r).__name__ for r in journal.records]
    assert kinds == ["Meta", "Assistant", "ToolStarted", "ToolResult", "Assistant", "Terminal"]
    assert [r.seq for r in journal.records] == [1, 2, 3, 4, 5, 6]


async def test_advance_steps_once_without_building_the_step(
    api: FakeMessagesAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`advance()` is one `step()` whose `Step` nobody reads (a supervisor's drive): the same
    states, the same journal, and no `Step` built."""
    from fisk_sm.machine.evaluator import LoopMachine

    def unread(*_: object) -> Step:
        raise AssertionError("a Step was built for advance()")

    monkeypatch.setattr(LoopMachine, "describe", unread)
    api.add(Reply.tool_use("touch", {"label": "one"}, id="toolu_a"), Reply.text("done"))
    run, _, journal = make_run(api, [side_effect_tool(tmp_path / "fx")])
    visited = [run.state]
    while not run.finished:
        await run.advance()
        visited.append(run.state)
    assert visited == [
        "suspend_check", "call", "journal", "decide", "budget_check", "gate", "execute",
        "feed_back", "suspend_check", "call", "journal", "decide", "completed",
    ]  # fmt: skip
    kinds = [type(r).__name__ for r in journal.records]
    assert kinds == ["Meta", "Assistant", "ToolStarted", "ToolResult", "Assistant", "Terminal"]
    assert run.answer() == "done"


async def test_first_request_carries_prompt_system_tools_and_output_cap(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.text("hi"))
    run, _, _ = make_run(api, [side_effect_tool(tmp_path / "fx")])
    await run.run()
    sent = api.requests[0]
    assert sent["model"] == "claude-test"
    assert sent["messages"] == [{"role": "user", "content": "do the thing"}]
    assert sent["system"] == [{"type": "text", "text": "You are a test agent."}]
    assert [t["name"] for t in sent["tools"]] == ["touch"]
    assert sent["tools"][0]["input_schema"]["required"] == ["label"]
    assert sent["max_tokens"] == 8192
    assert "thinking" not in sent


async def test_pause_turn_resends_the_assistant_turn_with_no_new_user_message(
    api: FakeMessagesAPI,
) -> None:
    paused = Reply(content=({"type": "text", "text": "thinking..."},), stop_reason="pause_turn")
    api.add(paused, Reply.text("finished"))
    run, events, _ = make_run(api)
    assert await run.run() == "completed"
    second = api.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant"]
    assert second[-1]["content"] == [{"type": "text", "text": "thinking..."}]
    assert events.states()[4:7] == ["budget_check", "suspend_check", "call"]


async def test_budget_overrun_over_all_four_tiers_stops_before_the_tool(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fx = tmp_path / "fx"
    api.add(
        Reply.tool_use(
            "touch",
            {"label": "never"},
            input_tokens=10,
            output_tokens=5,
            cache_read_input_tokens=100,
            cache_creation_input_tokens=40,
        )
    )
    run, _, journal = make_run(api, [side_effect_tool(fx)], max_tokens=150)
    assert await run.run() == "budget_exhausted"
    assert run.outcome == "token budget (150) exhausted after 1 iterations"
    assert not fx.exists()
    assert run.snapshot().usage.total == 155
    assistant = next(r for r in journal.records if isinstance(r, Assistant))
    assert assistant.usage == Usage(
        input_tokens=10, output_tokens=5, cache_read_tokens=100, cache_create_tokens=40
    )
    assert not any(isinstance(r, ToolStarted) for r in journal.records)
    assert journal.records[-1] == Terminal(seq=3, reason="budget_exhausted", message=run.outcome)


@pytest.mark.parametrize(("cache_create", "state"), [(0, "completed"), (10, "budget_exhausted")])
async def test_the_cache_create_tier_alone_can_tip_the_budget(
    api: FakeMessagesAPI, tmp_path: Path, cache_create: int, state: str
) -> None:
    # 10 + 5 + 100 = 115 stays under 120; the cache-create tier makes it 125.
    api.add(
        Reply.tool_use(
            "touch",
            {"label": "x"},
            cache_read_input_tokens=100,
            cache_creation_input_tokens=cache_create,
        ),
        Reply.text("ok", input_tokens=0, output_tokens=0),
    )
    run, _, _ = make_run(api, [side_effect_tool(tmp_path / "fx")], max_tokens=120)
    assert await run.run() == state


async def test_max_iterations_reached_after_the_last_batch_ran(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.tool_use("touch", {"label": "ran"}))
    run, _, _ = make_run(api, [side_effect_tool(tmp_path / "fx")], max_iterations=1)
    assert await run.run() == "iterations_exhausted"
    assert run.outcome == "max iterations (1) reached without a final answer"
    assert (tmp_path / "fx").read_text() == "ran\n"
    assert len(api.requests) == 1


async def test_truncated_reply_fails_without_running_tools(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.tool_use("touch", {"label": "partial"}, stop_reason="max_tokens"))
    run, _, _ = make_run(api, [side_effect_tool(tmp_path / "fx")])
    assert await run.run() == "failed"
    assert run.outcome == (
        "model reply truncated at the output token limit; the answer is incomplete"
    )
    assert not (tmp_path / "fx").exists()


async def test_terminal_refusal_fails(api: FakeMessagesAPI) -> None:
    api.add(Reply.text("I can't help with that.", stop_reason="refusal"))
    run, _, journal = make_run(api)
    assert await run.run() == "failed"
    assert run.outcome == "model refused to respond"
    assert journal.records[-1] == Terminal(
        seq=3, reason="failed", message="model refused to respond"
    )


async def test_unknown_tool_is_an_error_result_and_the_run_goes_on(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("nope", {}, id="toolu_x"), Reply.text("ok"))
    run, events, journal = make_run(api)
    assert await run.run() == "completed"
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_x",
        "content": "unknown tool 'nope'",
        "is_error": True,
    }
    assert [w.warning for w in events.of(WarningRaised)] == ["unknown_tool"]
    assert not events.of(ToolFinished)
    assert [type(r) for r in journal.records].count(ToolResult) == 1


async def test_missing_required_parameters_are_listed(api: FakeMessagesAPI) -> None:
    @tool
    def greet(name: str, greeting: str, punctuation: str = "!", loud: bool = False) -> str:
        """Greet someone."""
        raise AssertionError("must not run")

    api.add(Reply.tool_use("greet", {"loud": True}), Reply.text("ok"))
    run, events, _ = make_run(api, [greet])
    assert await run.run() == "completed"
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"] == (
        "tool 'greet' was called without required parameter(s): name, greeting."
        " required: name, greeting; optional: loud, punctuation"
    )
    assert [w.warning for w in events.of(WarningRaised)] == ["missing_required"]


async def test_a_raising_tool_is_an_error_result_and_the_run_goes_on(
    api: FakeMessagesAPI,
) -> None:
    @tool
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    api.add(Reply.tool_use("explode", {}), Reply.text("recovered"))
    run, events, _ = make_run(api, [explode])
    assert await run.run() == "completed"
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert "RuntimeError: kaboom" in result["content"]
    assert events.of(ToolFinished)[0].is_error
    assert run.answer() == "recovered"


async def test_several_tools_run_one_per_step_in_order_and_feed_back_as_one_message(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fx = tmp_path / "fx"
    blocks = tuple(
        {"type": "tool_use", "id": f"toolu_{n}", "name": "touch", "input": {"label": n}}
        for n in ("a", "b", "c")
    )
    api.add(Reply(content=blocks, stop_reason="tool_use"), Reply.text("ok"))
    run, events, _ = make_run(api, [side_effect_tool(fx)])
    await run.run()
    assert fx.read_text() == "a\nb\nc\n"
    assert events.states().count("execute") == 3
    last = api.requests[1]["messages"][-1]
    assert [b["tool_use_id"] for b in last["content"]] == ["toolu_a", "toolu_b", "toolu_c"]


async def test_a_reply_slower_than_call_timeout_fails_in_time(api: FakeMessagesAPI) -> None:
    # No reply comes for a minute (closing the fake API ends the wait): only the call's one
    # deadline, over every attempt, can end it, and the run fails with no answer.
    api.add(*[Reply.text("late", delay=60.0)] * 3)
    run, _, _ = make_run(api, call_timeout="300ms")
    assert await run.run() == "failed"
    retries = run.harness.model.max_retries  # type: ignore[attr-defined]
    assert 1 <= len(api.requests) <= retries + 1
    assert run.outcome is not None and "timed out after 0.3s" in run.outcome
    assert run.answer() == ""


async def test_overloaded_then_success_completes(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(529), Reply.text("made it"))
    run, _, _ = make_run(api)
    assert await run.run() == "completed"
    assert run.answer() == "made it"
    assert len(api.requests) == 2


async def test_a_failed_call_fails_the_run_with_the_api_message(api: FakeMessagesAPI) -> None:
    api.add(Reply.error(400))
    run, _, journal = make_run(api)
    assert await run.run() == "failed"
    assert run.outcome is not None and run.outcome.startswith("llm call: HTTP 400")
    assert [type(r).__name__ for r in journal.records] == ["Meta", "Terminal"]


async def test_suspend_request_takes_effect_at_the_next_boundary(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    api.add(Reply.tool_use("touch", {"label": "x"}), Reply.text("never asked"))
    run, _, _ = make_run(api, [side_effect_tool(tmp_path / "fx")])
    await run.run_until("execute")
    run.request_suspend()
    assert await run.run() == "suspended"
    assert (tmp_path / "fx").read_text() == "x\n"  # the tool in flight finished first
    assert len(api.requests) == 1
    assert run.outcome is None


async def test_thinking_is_sent_adaptive_with_a_larger_output_cap(api: FakeMessagesAPI) -> None:
    from fisk_sm import Run, parse_config

    api.add(Reply.text("ok"))
    config = parse_config(
        {"llm": {"model": "m", "base_url": api.base_url, "thinking": {"enabled": True}}}, env={}
    )
    await Run.create(config, "hi").run()
    assert api.requests[0]["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert api.requests[0]["max_tokens"] == 16384


async def test_step_after_the_end_is_refused(api: FakeMessagesAPI) -> None:
    from fisk_sm.loop import RunFinished

    api.add(Reply.text("ok"))
    run, _, _ = make_run(api)
    await run.run()
    with pytest.raises(RunFinished):
        await run.step()


def test_sync_facade_steps_without_an_event_loop(api: FakeMessagesAPI) -> None:
    api.add(Reply.text("sync ok"))
    run, _, _ = make_run(api)
    debugger = run.sync()
    assert debugger.step() == Step(
        "suspend_check",
        "boundary",
        "call",
        guard=None,
        tried=(
            GuardCheck("awaiting_input", "chat_turn_stopped", False),
            GuardCheck("iterations_exhausted", "iteration_cap_reached", False),
            GuardCheck("suspended", "suspend_requested", False),
        ),
    )
    assert debugger.state == "call"
    assert debugger.run() == "completed"
    last = debugger.snapshot().messages[-1].to_json()
    assert last["content"] == [{"type": "text", "text": "sync ok"}]
    debugger.close()

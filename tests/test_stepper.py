"""The stepper's library side: `run.sync()` anywhere, `run.explain()`, `run_until` stops."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import make_run

from fisk_sm import Run, Step, Tool, tool
from fisk_sm.loop.explain import ExitView, action_effects
from fisk_sm.loop.stops import Stops
from fisk_sm.machine.table import load_table
from fisk_sm.model import clients
from fisk_sm.testing import FakeMessagesAPI, Reply


def adder(calls: list[tuple[int, int]]) -> Tool:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        calls.append((a, b))
        return a + b

    return add


def two_turns(api: FakeMessagesAPI) -> None:
    api.add(
        Reply(
            content=(
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "toolu_2", "name": "mul", "input": {"a": 4}},
            ),
            stop_reason="tool_use",
        ),
        Reply.tool_use("add", {"a": 5, "b": 1}, id="toolu_3"),
        Reply.text("6"),
    )


def test_sync_steps_a_whole_run_from_inside_a_running_loop(api: FakeMessagesAPI) -> None:
    """A plain function called from a coroutine (a pdb prompt) steps the run to its end, its
    model calls made through the SDK client of the loop that makes them."""
    two_turns(api)
    calls: list[tuple[int, int]] = []
    seen: list[tuple[asyncio.AbstractEventLoop, Any]] = []
    holder: list[Run] = []

    @tool
    async def mul(a: int) -> int:
        """Double a number.

        Args:
            a: the number
        """
        seen.append((asyncio.get_running_loop(), holder[0].harness.model))
        return 2 * a

    def at_the_prompt(run: Run) -> list[Step]:
        debugger = run.sync()
        steps = []
        while not debugger.finished:
            steps.append(debugger.step())
        debugger.close()
        return steps

    async def main() -> tuple[Run, list[Step]]:
        run, _, _ = make_run(api, [adder(calls), mul])
        holder.append(run)
        await run.run_until("journal")  # one model call on this loop first
        original = run.harness.model
        steps = at_the_prompt(run)
        assert run.harness.model is original  # put back after each call
        ((loop, model),) = seen
        assert loop is not asyncio.get_running_loop()
        assert model is not original
        assert model._share._clients is clients._BY_LOOP[loop]  # the private loop's client
        await run.aclose()
        return run, steps

    run, steps = asyncio.run(main())
    assert run.state == "completed"
    assert run.answer() == "6"
    assert calls == [(2, 3), (5, 1)]
    assert len(api.requests) == 3
    assert steps[-1].destination == "completed"


def test_one_sync_facade_serves_both_without_and_inside_a_loop(api: FakeMessagesAPI) -> None:
    two_turns(api)
    calls: list[tuple[int, int]] = []
    run, _, _ = make_run(api, [adder(calls)])
    debugger = run.sync()
    assert debugger.run_until("journal") == "journal"  # no loop running: this thread

    async def main() -> str:
        state = debugger.run()  # a loop running: the helper thread, on the same private loop
        debugger.close()
        return state

    assert asyncio.run(main()) == "completed"
    assert calls == [(2, 3), (5, 1)]


def test_every_action_says_which_guards_it_decides() -> None:
    table = load_table()
    effects = action_effects(table)
    assert set(effects) == table.action_names
    assert all(decided <= table.guard_names for decided in effects.values())


async def test_explain_before_a_tool(api: FakeMessagesAPI) -> None:
    two_turns(api)
    run, _, _ = make_run(api, [adder([])])
    await run.run_until("budget_check")
    before = run.explain()
    assert before.next == "gate"
    assert [v.holds for v in before.exits] == [False, True, True]  # the else exit always holds
    await run.step()
    gate = run.explain()
    assert (gate.state, gate.action, gate.next) == ("gate", "check_gate", None)
    assert gate.exits == (
        ExitView("awaiting_approval", "approval_pending", None),  # the screening decides it
        ExitView("execute", None, True),
    )
    await run.step()
    told = run.explain()
    assert told.state == "execute"
    assert told.action == "execute_tool"
    # the tool answers exactly the first call, so what stays pending is known before it runs
    assert told.exits == (
        ExitView("gate", "tools_pending", True),
        ExitView("feed_back", None, True),
    )
    assert told.next == "gate"
    assert told.pending == (("add", {"a": 2, "b": 3}), ("mul", {"a": 4}))
    assert told.usage == run.data.usage
    text = str(told)
    assert "state: execute (iteration 1)" in text
    assert "-> gate if tools_pending: true" in text
    assert "next: gate" in text
    assert 'add {"a": 2, "b": 3}' in text
    assert "usage: input 10, output 5, cache read 0, cache create 0 (total 15)" in text


async def test_what_explain_knows_before_a_step_is_what_the_step_finds(
    api: FakeMessagesAPI,
) -> None:
    two_turns(api)
    run, _, _ = make_run(api, [adder([])], max_iterations=3)
    known = 0
    while not run.finished:
        told = run.explain()
        if run.data.iteration == 2 and run.state == "suspend_check":
            run.request_suspend()  # the boundary then decides a suspend
        step = await run.step()
        assert told.state == step.source
        if told.next is not None:
            known += 1
            assert step.destination == told.next
        taken = next(v for v in told.exits if v.dest == step.destination)
        assert taken.holds is not False
        for check in step.tried:
            view = next(v for v in told.exits if v.dest == check.dest)
            assert view.holds in (None, False)
    assert run.state == "suspended"
    assert known > 5
    assert str(run.explain()).startswith("state: suspended (iteration 2)\nthe run has ended")


async def test_run_until_stops_before_a_named_tool(api: FakeMessagesAPI) -> None:
    two_turns(api)
    calls: list[tuple[int, int]] = []
    doubled: list[int] = []

    @tool
    def mul(a: int) -> int:
        """Double a number.

        Args:
            a: the number
        """
        doubled.append(a)
        return 2 * a

    run, _, _ = make_run(api, [adder(calls), mul])
    assert await run.run_until(tool="mul") == "execute"
    assert run.data.pending[0].name == "mul"
    assert calls == [(2, 3)]  # add ran; mul has not
    assert doubled == []
    assert await run.run_until(tool=["add"]) == "execute"
    assert run.data.pending[0].input == {"a": 5, "b": 1}
    assert calls == [(2, 3)]


async def test_run_until_stops_on_reaching_an_iteration(api: FakeMessagesAPI) -> None:
    two_turns(api)
    run, _, _ = make_run(api, [adder([])])
    assert await run.run_until(iteration=2) == "journal"
    assert run.data.iteration == 2
    assert len(api.requests) == 2
    either = [{"states": ["decide"]}, {"tool": "add"}, {"iteration": 9}]
    assert await run.run_until(any_of=either) == "decide"
    assert await run.run_until(iteration=2) == "completed"  # already past it: to the end


async def test_run_to_says_why_it_stopped(api: FakeMessagesAPI) -> None:
    two_turns(api)
    run, _, _ = make_run(api, [adder([])])
    stops = Stops(any_of=(Stops.of(("feed_back",)), Stops.of(tool="add"), Stops.of(iteration=2)))
    reasons: list[Any] = []
    while not run.finished:
        reasons.append(await run.run_to(stops))
    assert reasons == [
        "tool add",
        "state feed_back",
        "iteration 2",
        "tool add",
        "state feed_back",
        None,
    ]

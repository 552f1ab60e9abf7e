"""Engine time per loop iteration: fisk-sm vs a hand-written loop vs LangGraph.

Every contender drives the same in-process fake model through N tool-use iterations (one
`tool_use` block per reply, calling a trivial async `echo` tool) and one final text reply, so
each run makes N + 1 model calls. The replies are built before the clock starts and the model
does nothing but hand the next one back, so what is timed is the loop itself:

* hand loop: a plain `while` loop doing the same work per iteration (model call, conversation
  append, in-memory journal append, tool call, tool_result block, user message, the same budget
  and iteration checks) with no state machine;
* fisk-sm: `await Run.create(...).run()`, with a `MemoryJournal` and a null event sink (one
  that says it reads nothing, so the loop builds no event); every trigger of the run is fired
  by the shared `transitions` Machine;
* LangGraph (only if `langgraph` is importable, the `bench` extra): a two-node `StateGraph`
  (`call` -> `tools` | END, `tools` -> `call`) with no checkpointer.

Per-iteration time is total / (N + 1). The engine overhead is fisk-sm minus the hand loop: all
of it goes through `transitions`. Runs are interleaved and repeated; the best of the repeats is
reported (the median alongside). `gc` stays on, but is collected before each timed run.

The share of `transitions` itself is measured apart: the shared table's Machine, with guards and
hooks that do nothing, fired around the seven states of one tool iteration.

    .venv/bin/python bench/loop_overhead.py [--iterations N] [--repeats R] [--profile]

FISK_SM_BENCH_TREE=DIR measures the `fisk_sm` of another checkout DIR with this bench code
(bench/compare_overhead.py does, to compare a revision with the working tree).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import operator
import os
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

# The tree whose fisk_sm is measured: this checkout, or another one that compare_overhead.py
# exported (the bench code stays this file, so only the engine differs between the two).
sys.path.insert(0, os.environ.get("FISK_SM_BENCH_TREE") or str(Path(__file__).resolve().parents[1]))

from fisk_sm.config.agent import AgentConfig, parse_config
from fisk_sm.config.states import States
from fisk_sm.events.types import Event
from fisk_sm.journal.base import MemoryJournal
from fisk_sm.journal.snapshot import Usage
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run, loop_machine
from fisk_sm.machine.evaluator import build_machine
from fisk_sm.machine.table import load_table
from fisk_sm.model.anthropic import ModelRequest, build_request
from fisk_sm.tools.base import Tool, tool

try:  # the optional `bench` extra
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph import END, START, StateGraph
except ImportError:
    HAVE_LANGGRAPH = False
else:
    HAVE_LANGGRAPH = True

# suspend_check, call, journal, decide, budget_check, execute, feed_back
TRANSITIONS_PER_ITERATION = 8
TRANSITIONS_FINAL = 4  # suspend_check, call, journal, decide -> completed
OVERHEAD_TARGET_US = 100.0
LANGGRAPH_TARGET_RATIO = 4.0
PROMPT = "Echo things until told to stop."


@tool
async def echo(text: str) -> str:
    """Return `text` unchanged.

    Args:
        text: what to echo.
    """
    return text


# --- the fake model ---------------------------------------------------------------------------


def script(iterations: int) -> list[dict[str, Any]]:
    """N tool-use replies then a final text reply; fresh dicts (the engine keeps them)."""
    usage = {"input_tokens": 10, "output_tokens": 5}
    replies: list[dict[str, Any]] = [
        {
            "content": [
                {
                    "type": "tool_use",
                    "id": f"toolu_{i:06d}",
                    "name": "echo",
                    "input": {"text": f"ping {i}"},
                }
            ],
            "stop_reason": "tool_use",
            "usage": dict(usage),
        }
        for i in range(iterations)
    ]
    replies.append(
        {
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "end_turn",
            "usage": dict(usage),
        }
    )
    return replies


class ScriptedModel:
    """Answers each request with the next prebuilt reply; costs next to nothing."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self._replies = replies
        self._next = 0
        self.calls = 0

    async def create(self, request: ModelRequest) -> dict[str, Any]:
        reply = self._replies[self._next]
        self._next += 1
        self.calls += 1
        return reply


class NullEvents:
    """An event sink that reads nothing, and says so: the loop builds no event it can skip."""

    def wants(self, kind: type[Event]) -> bool:
        return False

    def emit(self, event: Event) -> None:
        pass


def bench_config(iterations: int) -> AgentConfig:
    budget = {"max_iterations": iterations + 10, "max_tokens": 10**12}
    return parse_config({"llm": {"model": "m", "budget": budget}})


# --- the contenders ---------------------------------------------------------------------------


async def run_fisk(config: AgentConfig, model: ScriptedModel) -> int:
    """One fisk-sm run; returns the number of model calls."""
    run = Run.create(
        config,
        PROMPT,
        RunOptions(model=model, tools=[echo], journal=MemoryJournal(), events=NullEvents()),
    )
    state = await run.run()
    if state != States.COMPLETED or run.data.tool_calls != model.calls - 1:
        raise RuntimeError(f"fisk-sm run ended in {state!r} after {run.data.tool_calls} tools")
    return model.calls


async def _call_tool(tools: dict[str, Tool], block: dict[str, Any]) -> dict[str, Any]:
    """Dispatch one tool_use block the way a minimal hand loop would; never raises."""
    name, arguments = block["name"], block.get("input") or {}
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block["id"]}
    t = tools.get(name)
    if t is None:
        result |= {"content": f"unknown tool {name!r}", "is_error": True}
        return result
    missing = [p for p in t.required if p not in arguments]
    if missing:
        result |= {"content": f"missing {', '.join(missing)}", "is_error": True}
        return result
    try:
        value = await t.fn(**arguments)
    except Exception as exc:
        result |= {"content": f"{type(exc).__name__}: {exc}", "is_error": True}
        return result
    result["content"] = value if isinstance(value, str) else str(value)
    return result


async def run_hand(config: AgentConfig, model: ScriptedModel) -> int:
    """The same loop, hand-written: no state machine, no events, dict records."""
    llm = config.llm
    budget = llm.budget
    tools = {echo.name: echo}
    definitions = tuple(t.definition for t in tools.values())
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    journal: list[dict[str, Any]] = []
    iteration = tokens = tool_calls = 0
    outcome = "running"
    while True:
        if iteration >= budget.max_iterations:
            outcome = "iterations_exhausted"
            break
        iteration += 1
        reply = await model.create(build_request(llm, (), definitions, messages))
        tokens += Usage.from_api(reply.get("usage")).total
        turn = {"role": "assistant", "content": reply.get("content") or []}
        stop_reason = reply.get("stop_reason")
        messages.append(turn)
        journal.append({"type": "assistant", "iteration": iteration, "message": turn})
        pending = [b for b in turn["content"] if b.get("type") == "tool_use"]
        if stop_reason == "max_tokens":
            outcome = "failed"
            break
        if not pending and stop_reason != "pause_turn":
            outcome = "completed"
            break
        if budget.max_tokens > 0 and tokens >= budget.max_tokens:
            outcome = "budget_exhausted"
            break
        results = []
        for block in pending:
            tool_calls += 1
            result = await _call_tool(tools, block)
            journal.append({"type": "tool_result", "result": result})
            results.append(result)
        messages.append({"role": "user", "content": results})
    if outcome != "completed" or tool_calls != model.calls - 1:
        raise RuntimeError(f"hand loop ended {outcome!r} after {tool_calls} tools")
    return model.calls


class State(TypedDict):
    """The LangGraph state: the conversation (appended by reducer) and the loop's counters."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    pending: list[dict[str, Any]]
    iteration: int
    tokens: int
    tool_calls: int
    stop_reason: str | None


def build_langgraph(config: AgentConfig) -> Callable[[ScriptedModel], Awaitable[int]] | None:
    """The same loop as a compiled LangGraph StateGraph, or None without langgraph."""
    if not HAVE_LANGGRAPH:
        return None

    llm = config.llm
    budget = llm.budget
    tools = {echo.name: echo}
    definitions = tuple(t.definition for t in tools.values())

    async def call(state: State, config: RunnableConfig) -> dict[str, Any]:
        env = config["configurable"]
        reply = await env["model"].create(build_request(llm, (), definitions, state["messages"]))
        tokens = state["tokens"] + Usage.from_api(reply.get("usage")).total
        turn = {"role": "assistant", "content": reply.get("content") or []}
        iteration = state["iteration"] + 1
        env["journal"].append({"type": "assistant", "iteration": iteration, "message": turn})
        return {
            "messages": [turn],
            "pending": [b for b in turn["content"] if b.get("type") == "tool_use"],
            "iteration": iteration,
            "tokens": tokens,
            "stop_reason": reply.get("stop_reason"),
        }

    def route(state: State) -> str:
        if state["stop_reason"] == "max_tokens":
            return END
        if not state["pending"] and state["stop_reason"] != "pause_turn":
            return END
        if budget.max_tokens > 0 and state["tokens"] >= budget.max_tokens:
            return END
        if state["iteration"] >= budget.max_iterations:
            return END
        return "tools"

    async def run_tools(state: State, config: RunnableConfig) -> dict[str, Any]:
        journal = config["configurable"]["journal"]
        results = []
        for block in state["pending"]:
            result = await _call_tool(tools, block)
            journal.append({"type": "tool_result", "result": result})
            results.append(result)
        return {
            "messages": [{"role": "user", "content": results}],
            "pending": [],
            "tool_calls": state["tool_calls"] + len(results),
        }

    graph = StateGraph(State)
    graph.add_node("call", call)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "call")
    graph.add_conditional_edges("call", route, ["tools", END])
    graph.add_edge("tools", "call")
    compiled = graph.compile()

    async def run_graph(model: ScriptedModel) -> int:
        start = {
            "messages": [{"role": "user", "content": PROMPT}],
            "pending": [],
            "iteration": 0,
            "tokens": 0,
            "tool_calls": 0,
            "stop_reason": None,
        }
        limit = 2 * budget.max_iterations + 10
        final = await compiled.ainvoke(
            start,
            {"configurable": {"model": model, "journal": []}, "recursion_limit": limit},
        )
        if final["stop_reason"] != "end_turn" or final["tool_calls"] != model.calls - 1:
            raise RuntimeError(f"LangGraph run ended {final['stop_reason']!r}")
        return model.calls

    return run_graph


# --- timing -----------------------------------------------------------------------------------


async def timed(contender: Callable[[ScriptedModel], Awaitable[int]], iterations: int) -> float:
    """Seconds per model call for one run on a fresh model (built outside the clock)."""
    model = ScriptedModel(script(iterations))
    gc.collect()
    start = time.perf_counter()
    calls = await contender(model)
    elapsed = time.perf_counter() - start
    if calls != iterations + 1:
        raise RuntimeError(f"expected {iterations + 1} model calls, got {calls}")
    return elapsed / calls


def print_profile(profiler: cProfile.Profile, iterations: int, top: int) -> None:
    """Top entries by cumulative and by own time, paths cut to `transitions/core.py` etc."""
    prefixes = sorted(
        {str(Path(p).resolve()) + "/" for p in sys.path if p and Path(p).is_dir()},
        key=len,
        reverse=True,
    )
    for order, count in (("cumulative", top), ("tottime", 15)):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(count)
        text = out.getvalue().split("\n\n", 1)[-1].rstrip()
        for prefix in prefixes:
            text = text.replace(prefix, "")
        print(f"\n--- cProfile, one fisk-sm run of {iterations} iterations, by {order} ---")
        print(text)


async def profile_fisk(config: AgentConfig, iterations: int, top: int = 25) -> None:
    model = ScriptedModel(script(iterations))
    await run_fisk(config, ScriptedModel(script(iterations)))  # warm
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    await run_fisk(config, model)
    profiler.disable()
    print_profile(profiler, iterations, top)


class Probe:
    """A stand-in run for the Machine alone; its guards send it once around the loop."""

    state = States.SUSPEND_CHECK


def transitions_per_iteration(repeats: int, rounds: int = 2000) -> float:
    """Best seconds for the seven `transitions` fires of one tool iteration, with guards and
    hooks that do nothing (the engine's cost minus the phase actions and event hooks)."""
    table = load_table()
    guards = {name: (lambda run: False) for name in table.guard_names}
    guards["tools_pending"] = lambda run: run.state == States.BUDGET_CHECK  # execute once
    machine = build_machine(
        table, guards, {name: (lambda run, fire: None) for name in table.hook_names}
    )
    probe = Probe()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            for _ in range(TRANSITIONS_PER_ITERATION):
                machine.fire(probe)
        best = min(best, (time.perf_counter() - start) / rounds)
    if probe.state != States.SUSPEND_CHECK:
        raise RuntimeError(f"the probe ended a round in {probe.state!r}")
    return best


def us(seconds: float) -> str:
    return f"{seconds * 1e6:9.2f}"


async def main(iterations: int, repeats: int, profile: bool) -> None:
    config = bench_config(iterations)
    loop_machine()  # build the shared machine outside the clock, as a long-lived process would

    async def fisk(model: ScriptedModel) -> int:
        return await run_fisk(config, model)

    async def hand(model: ScriptedModel) -> int:
        return await run_hand(config, model)

    contenders: dict[str, Callable[[ScriptedModel], Awaitable[int]]] = {
        "hand loop": hand,
        "fisk-sm": fisk,
    }
    graph = build_langgraph(config)
    if graph is not None:
        contenders["LangGraph"] = graph

    for contender in contenders.values():  # warm up: imports, caches, first-call paths
        await timed(contender, iterations)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):  # interleaved, so drift hits every contender alike
        for name, contender in contenders.items():
            samples[name].append(await timed(contender, iterations))

    best = {name: min(s) for name, s in samples.items()}
    median = {name: statistics.median(s) for name, s in samples.items()}
    print(
        f"Python {sys.version.split()[0]}, {iterations} tool iterations + 1 final reply "
        f"= {iterations + 1} model calls per run, best of {repeats} (median alongside)\n"
    )
    print(f"{'contender':<12} {'best µs/iter':>12} {'median µs/iter':>15}")
    for name in contenders:
        print(f"{name:<12} {us(best[name]):>12} {us(median[name]):>15}")

    overhead = best["fisk-sm"] - best["hand loop"]
    transitions = TRANSITIONS_PER_ITERATION * iterations + TRANSITIONS_FINAL
    per_transition = best["fisk-sm"] * (iterations + 1) / transitions
    overhead_per_transition = overhead * (iterations + 1) / transitions
    machine_only = transitions_per_iteration(repeats)
    verdict = "ok" if overhead * 1e6 <= OVERHEAD_TARGET_US else "OVER TARGET"
    print()
    print(
        f"engine overhead through transitions:   {overhead * 1e6:8.2f} µs/iteration "
        f"(fisk-sm − hand loop; target ≤ {OVERHEAD_TARGET_US:g}: {verdict})"
    )
    print(
        f"  of which transitions itself:         {machine_only * 1e6:8.2f} µs/iteration "
        f"({TRANSITIONS_PER_ITERATION} fires, no-op guards and hooks: "
        f"{machine_only * 1e6 / TRANSITIONS_PER_ITERATION:.2f} µs per fire)"
    )
    print(f"ratio fisk-sm / hand loop:             {best['fisk-sm'] / best['hand loop']:8.2f}×")
    print(
        f"fisk-sm per transition:                {per_transition * 1e6:8.2f} µs "
        f"({TRANSITIONS_PER_ITERATION} transitions per tool iteration, {transitions} per run)"
    )
    print(f"engine overhead per transition:        {overhead_per_transition * 1e6:8.2f} µs")
    if "LangGraph" in best:
        ratio = best["LangGraph"] / best["fisk-sm"]
        verdict = "ok" if ratio >= LANGGRAPH_TARGET_RATIO else "BELOW TARGET"
        print(
            f"ratio LangGraph / fisk-sm:             {ratio:8.2f}× "
            f"(target ≥ {LANGGRAPH_TARGET_RATIO:g}×: {verdict})"
        )
        print(
            f"LangGraph − hand loop:                 {us(best['LangGraph'] - best['hand loop'])} µs"
        )
    else:
        print("LangGraph: not installed, skipped (pip install -e '.[bench]' to include it)")

    if profile:
        await profile_fisk(config, iterations)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--iterations", type=int, default=200, help="tool iterations per run (default 200)"
    )
    parser.add_argument("--repeats", type=int, default=15, help="timed runs each (default 15)")
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile one fisk-sm run, top 25 cumulative"
    )
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1:
        parser.error("--iterations and --repeats must be at least 1")
    return args


if __name__ == "__main__":
    options = parse_args()
    asyncio.run(main(options.iterations, options.repeats, options.profile))

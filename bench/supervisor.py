"""A supervisor's load: 1,000 concurrent runs on one event loop at 50 ms of API latency.

Every run makes K model calls (default 3), each answered after the latency with a cheap `tick`
tool call, and ends `iterations_exhausted` at the iteration cap. Four trials: the real SDK
against the fake Messages API (in a child process) or an in-process model (no HTTP, no SDK: the
difference is the SDK's cost), each with memory journals and with file journals (every run a
checkpointed `FileStore` session, every record durable before the run moves on). The fake API,
the ticker, the in-process model and the phases are bench/concurrency.py's.

Figures per trial, each against its baseline:

* runs/s against the latency-bound ideal: a run's K calls are sequential, so with unlimited
  concurrency N runs need K × latency at least, and the ideal is N / (K × latency) runs/s;
  targets 80% in memory and 50% with file journals;
* RSS per run: the growth of this process's resident set (VmRSS) from before the runs were made
  to after they ran, divided by N (the runs and their conversations still held);
* the worst event-loop stall: how late a ticker sleeping 1 ms woke up (target < 20 ms);
* CPU seconds per model call, and with `--profile` where the loop's time goes (cProfile of the
  run phase of each trial).

    .venv/bin/python bench/supervisor.py [--runs N] [--calls K] [--latency S] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import multiprocessing
import os
import pstats
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # concurrency

from concurrency import (
    STALL_TARGET,
    FsyncCount,
    LocalModel,
    Ticker,
    config,
    fake_api,
    script,
    stall,
    tick,
    timed,
)

from fisk_sm.events.types import Event
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run, loop_machine
from fisk_sm.loop.sessions import start_session
from fisk_sm.model.clients import warm_up

TARGETS = {"memory": 0.80, "file": 0.50}


class NoEvents:
    """An event sink that drops everything (a supervisor's own sink is not measured here)."""

    def emit(self, event: Event) -> None:
        pass

    async def aclose(self) -> None:
        pass


def rss() -> int:
    """This process's resident set size in bytes (VmRSS)."""
    with Path("/proc/self/status").open(encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def trial(args: argparse.Namespace, model: str, kind: str, root: Path) -> dict[str, Any]:
    runs, calls, latency = args.runs, args.calls, args.latency
    print(f"\n{model} model, {kind} journals: {runs} runs × {calls} calls, {latency * 1e3:g} ms")
    replies = script(runs, calls, latency) if model == "SDK" else []
    with fake_api(replies, model != "SDK") as base_url, FsyncCount() as fsyncs:
        cfg, store = config(base_url, calls), FileStore(root / f"{model}-{kind}")
        local = LocalModel(latency) if model != "SDK" else None
        options = RunOptions(model=local, tools=[tick], events=NoEvents())
        ticker = Ticker()
        ticker.start()
        if local is None:
            await timed(ticker, "warm_up", lambda: warm_up(cfg.llm))
        before = rss()

        async def start() -> list[Run]:
            if kind == "file":
                starts = [start_session(cfg, "count", store, options) for _ in range(runs)]
                return list(await asyncio.gather(*starts))
            return [Run.create(cfg, "count", options) for _ in range(runs)]

        async def run_all() -> list[str]:
            profiler = cProfile.Profile() if args.profile else None
            if profiler:
                profiler.enable()
            try:
                return list(await asyncio.gather(*(run.run() for run in created)))
            finally:
                if profiler:
                    profiler.disable()
                    print_profile(profiler)

        created, _, _ = await timed(ticker, "start", start)
        ticker.take()
        begin, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        states = await run_all()
        wall, cpu = time.perf_counter() - begin, time.process_time() - cpu
        own = time.thread_time() - own
        late = ticker.take()
        print(f"   {'run':<8} {wall * 1e3:8.1f} ms  cpu {cpu * 1e3:7.1f} ms", end="")
        print(f"   loop stall {stall(late)}")
        print(f"   cpu of the loop's thread {own * 1e3:.1f} ms, of other threads", end="")
        print(f" {(cpu - own) * 1e3:.1f} ms (journal writer, fsync pool, SDK workers)")
        grown = rss() - before
        await timed(ticker, "close", lambda: asyncio.gather(*(r.aclose() for r in created)))
        await ticker.stop()
    ended = {state: states.count(state) for state in set(states)}
    model_calls = sum(run.data.llm_calls for run in created)
    achieved, ideal = runs / wall, runs / (calls * latency)
    share = achieved / ideal
    print(f"   ended: {ended}; cpu {cpu / model_calls * 1e3:.2f} ms per model call", end="")
    print(f" ({cpu / wall:.2f} CPU-s/s)")
    print(f"   runs/s {achieved:7.1f}, ideal N/(K×latency) = {ideal:.1f}: {share:.0%}", end="")
    print(f" of the latency bound (target {TARGETS[kind]:.0%})")
    print(f"   RSS per run {grown / runs / 1024:.1f} KiB ({grown / 2**20:.1f} MiB for {runs} runs)")
    if kind == "file":
        print(
            f"   fsyncs {fsyncs.calls} ({fsyncs.calls / runs:.1f} per run, meta + directory incl.)"
        )
    worst = max(late, default=0.0)
    return {"share": share, "rss": grown / runs, "cpu": cpu / model_calls, "stall": worst}


def print_profile(profiler: cProfile.Profile) -> None:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    text = out.getvalue().split("\n\n", 1)[-1].rstrip()
    print(text.replace(str(Path(__file__).resolve().parent.parent) + "/", ""))


def isolated(args: argparse.Namespace, model: str, kind: str, root: Path) -> dict[str, Any]:
    """`trial` in a fresh child process, so that its RSS is its own."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=child_trial, args=(args, model, kind, root, theirs))
    child.start()
    try:
        results: dict[str, Any] = ours.recv()
    finally:
        child.join(60)
    return results


def child_trial(
    args: argparse.Namespace, model: str, kind: str, root: Path, conn: Connection
) -> None:
    loop_machine()
    conn.send(asyncio.run(trial(args, model, kind, root)))


def main(args: argparse.Namespace) -> None:
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; fake API in a child process;")
    print("each trial in a fresh process")
    print(f"target: worst loop stall < {STALL_TARGET * 1e3:g} ms (see each trial's run phase)")
    results = {}
    with tempfile.TemporaryDirectory(prefix="fisk-supervisor-") as tmp:
        for model in ("SDK", "in-process"):
            for kind in ("memory", "file"):
                results[model, kind] = isolated(args, model, kind, Path(tmp))
    print(f"\n{'summary':<22} {'of ideal':>8} {'target':>6} {'RSS/run':>10}", end="")
    print(f" {'worst stall':>11} {'cpu/call':>9}")
    for (model, kind), got in results.items():
        print(
            f"{model + ', ' + kind:<22} {got['share']:>8.0%} {TARGETS[kind]:>6.0%}"
            f" {got['rss'] / 1024:>6.1f} KiB {got['stall'] * 1e3:>8.1f} ms"
            f" {got['cpu'] * 1e3:>6.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="concurrent runs (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per run (default 3)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per reply")
    parser.add_argument("--profile", action="store_true", help="cProfile each run phase")
    main(parser.parse_args())

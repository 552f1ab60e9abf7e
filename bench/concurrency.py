"""Many runs on one event loop: the worst stall and the throughput of N concurrent runs.

N runs (default 200) share one event loop, the real SDK and the bundled fake Messages API, which
answers every request after `--latency` seconds (default 0.02). Every reply calls a cheap tool,
and the iteration cap ends each run after K model calls (default 3), so a run makes K calls and
K tool calls and ends `iterations_exhausted`. With file journals each run is a checkpointed
session (`start_session` on a `FileStore` in a temp dir): meta, then per iteration `assistant`,
`tool_started`, `tool_result`, then `terminal`, each durable before the run moves on. Every event
goes to one JSON Lines file as well.

The same runs are repeated with an in-process model that answers after the same latency (no
HTTP, no SDK): the difference shows what the SDK's request handling costs the loop, and the
file-vs-memory difference what the journal costs.

Figures, for each model (SDK, in-process) and journal kind (file, then memory):

* worst event-loop stall: a ticker task sleeps 1 ms in a loop and records how late it wakes
  (max and 99th percentile), over the start of the sessions, the runs, and their closing;
* throughput: model calls per second against the latency-bound ideal. A run's K calls are
  sequential and each takes at least the latency, so N runs cannot finish in less than
  K × latency: the ideal is N × K calls / (K × latency) = N / latency calls per second, and
  the ratio shown is achieved / ideal = K × latency / (wall time of the runs);
* durable records per second across all runs, and the fsyncs made (group commit: fewer
  than records, as a `retry` tool's intent is not fsynced on its own);
* CPU time of this process per model call during the runs: a loop that is busy all the time
  (ratio near 1 CPU-second per second) is bound by CPU, and its ticker is late by the time it
  takes to run one batch of ready callbacks, however little each run blocks.

The first phase, `warm_up`, is the SDK's import and its client built in a worker thread.

The fake API runs in a child process by default, so its 200 request threads do not compete with
the measured loop for the GIL (`--in-process` keeps it in this process). No assertions: the
design's targets (stall under 20 ms; 80% of the ideal in memory, 50% with file journals at
1,000 runs and 50 ms) are printed next to the figures.

    .venv/bin/python bench/concurrency.py [--runs N] [--calls K] [--latency S] [--in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fisk_sm.config.agent import AgentConfig, parse_config
from fisk_sm.events.adapters import JsonLinesEvents
from fisk_sm.journal.filestore import FileStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run, loop_machine
from fisk_sm.loop.sessions import start_session
from fisk_sm.model.clients import warm_up
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import tool

STALL_TARGET = 0.020
T = TypeVar("T")


@tool
async def tick(n: int) -> int:
    """Count one."""
    return n + 1


def script(runs: int, calls: int, latency: float) -> list[Reply]:
    """runs × calls replies, each a `tick` call answered after `latency`."""
    return [Reply.tool_use("tick", {"n": i}, delay=latency) for i in range(runs * calls)]


def serve(replies: list[Reply], conn: multiprocessing.connection.Connection) -> None:
    """The child process: serve `replies` until told to stop, with connections kept alive as
    the real API keeps them (a client pays for a TCP connection per pooled one, not per call)."""
    with FakeMessagesAPI(replies, keep_alive=True) as api:
        conn.send(api.base_url)
        conn.recv()


@contextmanager
def fake_api(replies: list[Reply], in_process: bool) -> Iterator[str]:
    """The fake API's base URL, served in this process or in a child."""
    if in_process:
        with FakeMessagesAPI(replies) as api:
            yield api.base_url
        return
    with served_in_child(serve, replies) as base_url:
        yield base_url


@contextmanager
def served_in_child(target: Callable[..., None], *args: Any) -> Iterator[str]:
    """A server run by `target(*args, conn)` in a spawned child: it sends its base URL on
    `conn`, then serves until it receives "stop" (sent when the block ends)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=target, args=(*args, theirs))
    child.start()
    try:
        yield ours.recv()
    finally:
        ours.send("stop")
        child.join(10)


class LocalModel:
    """Answers every request after `latency` with a `tick` call, in this process."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.usage = {"input_tokens": 10, "output_tokens": 5}

    async def create(self, request: object) -> dict[str, Any]:
        await asyncio.sleep(self.latency)
        use = {"type": "tool_use", "id": "toolu_local", "name": "tick", "input": {"n": 1}}
        return {"content": [use], "stop_reason": "tool_use", "usage": dict(self.usage)}


def config(base_url: str, calls: int) -> AgentConfig:
    llm = {"model": "bench", "base_url": base_url, "budget": {"max_iterations": calls}}
    return parse_config({"system_prompt": "You count.", "llm": llm}, env={})


class Ticker:
    """A task that sleeps 1 ms at a time and records how late it wakes up."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.001)
            self.late.append(loop.time() - start - 0.001)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._tick())

    def take(self) -> list[float]:
        """The lateness samples so far (the list starts over)."""
        samples, self.late = self.late, []
        return samples

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def stall(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    p99 = (
        statistics.quantiles(samples, n=100, method="inclusive")[98]
        if len(samples) > 1
        else samples[0]
    )
    return f"max {max(samples) * 1e3:6.1f} ms, p99 {p99 * 1e3:5.1f} ms ({len(samples)} ticks)"


async def timed(
    ticker: Ticker, label: str, work: Callable[[], Awaitable[T]]
) -> tuple[T, float, float]:
    """`work()`'s result, wall seconds and this process's CPU seconds; prints the phase."""
    ticker.take()
    start, cpu = time.perf_counter(), time.process_time()
    result = await work()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"   {label:<8} {wall * 1e3:8.1f} ms  cpu {cpu * 1e3:7.1f} ms", end="")
    print(f"   loop stall {stall(ticker.take())}")
    return result, wall, cpu


class FsyncCount:
    """Counts os.fsync calls (from any thread) while active."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self._real = os.fsync

    def __enter__(self) -> FsyncCount:
        def counted(fd: int) -> None:
            with self._lock:
                self.calls += 1
            self._real(fd)

        os.fsync = counted
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.fsync = self._real


async def trial(args: argparse.Namespace, model: str, kind: str, root: Path) -> None:
    runs, calls, latency = args.runs, args.calls, args.latency
    print(f"\n{model} model, {kind} journals: {runs} runs × {calls} calls,", end=" ")
    print(f"{latency * 1e3:g} ms per reply")
    replies = script(runs, calls, latency) if model == "SDK" else []
    with (
        fake_api(replies, args.in_process or model != "SDK") as base_url,
        (root / f"{model}-{kind}-events.jsonl").open("w") as stream,
        FsyncCount() as fsyncs,
    ):
        cfg, store = config(base_url, calls), FileStore(root / f"{model}-{kind}")
        events = JsonLinesEvents(stream)
        local = LocalModel(latency) if model != "SDK" else None
        options = RunOptions(model=local, tools=[tick], events=events)
        ticker = Ticker()
        ticker.start()

        async def start() -> list[Run]:
            if kind == "file":
                starts = [start_session(cfg, "count", store, options) for _ in range(runs)]
                return list(await asyncio.gather(*starts))
            return [Run.create(cfg, "count", options) for _ in range(runs)]

        async def run_all() -> list[str]:
            return list(await asyncio.gather(*(run.run() for run in created)))

        async def close() -> None:
            await asyncio.gather(*(run.aclose() for run in created))
            await events.aclose()

        if local is None:
            await timed(ticker, "warm_up", lambda: warm_up(cfg.llm))
        created, _, _ = await timed(ticker, "start", start)
        states, wall, cpu = await timed(ticker, "run", run_all)
        await timed(ticker, "close", close)
        await ticker.stop()
    ended = {state: states.count(state) for state in set(states)}
    model_calls = sum(run.data.llm_calls for run in created)
    achieved, ideal = model_calls / wall, runs / latency
    print(f"   ended: {ended}; {model_calls} model calls", end="; ")
    print(f"cpu {cpu / model_calls * 1e3:.2f} ms per call ({cpu / wall:.2f} CPU-s/s)")
    print(
        f"   throughput {achieved:6.0f} calls/s, ideal N/latency = {ideal:.0f} calls/s:"
        f" {achieved / ideal:.0%} of the latency bound"
    )
    if kind == "file":
        records = sum(run.harness.journal.last_seq for run in created)
        print(
            f"   durable records {records} ({records / wall:.0f}/s during the runs),"
            f" fsyncs {fsyncs.calls} ({fsyncs.calls / runs:.1f} per run, incl. meta + directory)"
        )


async def main(args: argparse.Namespace) -> None:
    loop_machine()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; fake API", end=" ")
    print("in this process" if args.in_process else "in a child process")
    print(f"target: worst loop stall < {STALL_TARGET * 1e3:g} ms")
    with tempfile.TemporaryDirectory(prefix="fisk-concurrency-") as tmp:
        for model in ("SDK", "in-process"):
            for kind in ("file", "memory"):
                await trial(args, model, kind, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs (default 200)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per run (default 3)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per reply")
    parser.add_argument("--in-process", action="store_true", help="serve the fake API here")
    asyncio.run(main(parser.parse_args()))

"""What a supervisor's event stream costs: CPU per run with no subscriber and with one, for
this tree and for an older one (default: commit dd8b2d4, before issue 24), in the same run.

Each process submits `--runs` runs (default 1,000) through `fisk_sm.supervisor.Supervisor`
(`submit`, all at once, concurrency = the runs), every run a durable `FileStore` session in a
temp dir, with the in-process model of bench/concurrency.py answering each of its `--calls`
model calls (default 3) after `--latency` (default 50 ms) with a cheap `tick` tool call. It
measures this process's CPU time (`time.process_time`, every thread) from the first submit to
the last run's end, divided by the runs. Three modes:

* **none**: nobody subscribes to the hub (no `GET /api/events`, no dashboard open);
* **gone**: a reader subscribed and left before the submits: it may come back with
  `Last-Event-ID`, so the hub numbers and holds every event (its last 4,096), read by nobody;
* **one**: one reader subscribes to every run's events before the submits and does what an SSE
  response does with each: the event's id (`hub.event_id`) and the `id:/event:/data:` frame.

Every process is this bench code, with the tree to measure first on `sys.path`
(`FISK_SM_BENCH_TREE`, as bench/compare_overhead.py does; the old commit is exported with
`git archive`); the sides alternate old, new, old, new (`--repeat` processes a mode and side,
default 3) and the table shows the median CPU per run, the best, the events the reader got per
run, and the ratio new/old of the medians. Nothing is asserted.

    .venv/bin/python bench/supervisor_events.py [--runs N] [--calls K] [--latency S]
        [--repeat R] [--old-commit C] [--new-tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from compare_overhead import child_report, run_sides, side_names, sides_parser  # noqa: E402

MODES = ("none", "unbuffered", "gone", "one")


async def measure(runs: int, calls: int, latency: float, mode: str, root: Path) -> dict[str, Any]:
    """Submit `runs` runs through a Supervisor and time this process's CPU until they end."""
    from concurrency import LocalModel, config, tick

    from fisk_sm.journal.filestore import FileStore
    from fisk_sm.loop.harness import RunOptions
    from fisk_sm.supervisor import Supervisor

    options = RunOptions(model=LocalModel(latency), tools=[tick])
    supervisor = Supervisor(
        config("http://127.0.0.1:9", calls), FileStore(root), concurrency=runs, options=options
    )
    await supervisor.start()
    if mode == "unbuffered":
        supervisor.hub.resize(0)  # `supervise --event-buffer 0`
    got = {"events": 0, "bytes": 0}

    async def read() -> None:  # what an SSE response does with each event
        async for seq, name, data in subscriber.items():
            frame = f"id: {supervisor.hub.event_id(seq)}\nevent: {name}\ndata: {data}\n\n"
            got["events"] += 1
            got["bytes"] += len(frame)

    reader = None
    if mode in ("gone", "one"):
        subscriber = supervisor.hub.subscribe()
        if mode == "one":
            reader = asyncio.ensure_future(read())
        else:  # it came and went: it may come back with the last id it read
            supervisor.hub.unsubscribe(subscriber)
    begin, cpu = time.perf_counter(), time.process_time()
    submitted = await asyncio.gather(*(supervisor.submit("count") for _ in range(runs)))
    await asyncio.gather(*(t.task for t in submitted if t.task is not None))
    await asyncio.sleep(0)  # the reader takes what the last runs published
    wall, cpu = time.perf_counter() - begin, time.process_time() - cpu
    statuses = sorted({t.status for t in submitted})
    await supervisor.shutdown()
    if reader is not None:
        await reader
    return {"cpu": cpu / runs, "wall": wall, "events": got["events"] / runs, "status": statuses}


def child(args: argparse.Namespace) -> None:
    """In a side's process: one measurement, printed as JSON."""
    tree = os.environ.get("FISK_SM_BENCH_TREE") or str(BENCH.parent)
    sys.path.insert(0, tree)
    import fisk_sm
    from fisk_sm.loop.run import loop_machine

    loop_machine()  # built outside the clock
    with tempfile.TemporaryDirectory(prefix="fisk-sm-events-") as tmp:
        report = asyncio.run(measure(args.runs, args.calls, args.latency, args.mode, Path(tmp)))
    report["fisk_sm"] = str(Path(fisk_sm.__file__).resolve().parent)
    print(json.dumps(report))


def side(tree: Path, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One process measuring `tree`'s fisk_sm in `mode`."""
    argv = ["--child", "--mode", mode, "--runs", str(args.runs), "--calls", str(args.calls)]
    argv += ["--latency", str(args.latency)]
    return child_report(Path(__file__), tree, argv)


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="fisk-sm-compare-") as tmp:
        trees = {"old": Path(tmp), "new": args.new_tree or BENCH.parent}
        names = side_names(args, Path(tmp))
        got: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.repeat):  # interleaved, so that drift hits both sides alike
            for mode in MODES:
                for name, tree in trees.items():
                    got.setdefault((mode, name), []).append(side(tree, args, mode))
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{args.runs} runs × {args.calls} calls, {args.latency * 1e3:g} ms latency, in-process")
    print(f"model, file journals; {args.repeat} processes a mode and side, interleaved")
    print(f"old: {names['old']}\nnew: {names['new']}\n")
    print(f"{'mode':<12} {'side':<4} {'cpu ms/run':>10} {'best':>7} {'events/run':>10}", end="")
    print(f" {'wall s':>7}  ended")
    median: dict[tuple[str, str], float] = {}
    for mode in MODES:
        for name in trees:
            reports = got[mode, name]
            cpus = [r["cpu"] * 1e3 for r in reports]
            median[mode, name] = statistics.median(cpus)
            events = statistics.median(r["events"] for r in reports)
            wall = statistics.median(r["wall"] for r in reports)
            ended = ",".join(sorted({s for r in reports for s in r["status"]}))
            print(f"{mode:<12} {name:<4} {median[mode, name]:>10.3f} {min(cpus):>7.3f}", end="")
            print(f" {events:>10.1f} {wall:>7.2f}  {ended}")
    print()
    for mode in MODES:
        ratio = median[mode, "new"] / median[mode, "old"]
        print(f"ratio new/old, cpu per run, {mode}: {ratio:.3f}")


def main() -> int:
    parser = sides_parser(__doc__, "mode")
    parser.add_argument("--mode", choices=MODES, default="none", help=argparse.SUPPRESS)
    return run_sides("supervisor_events.py", parser.parse_args(), child, compare)


if __name__ == "__main__":
    sys.exit(main())

"""CPU per model call through the whole engine, the real SDK against the loopback fake, for this
tree and for an older one (default: commit dd8b2d4, before issue 24), in the same run.

Each process starts `--runs` durable runs (default 1,000; `start_session` on a `FileStore` in a
temp dir, so every record is fsynced before the run moves on), all at once on one event loop, and
runs them: each makes `--calls` model calls (default 3), each answered after `--latency`
(default 50 ms) with a cheap `tick` tool call, and ends `iterations_exhausted` at the cap. Two
models, each in processes of its own:

* **SDK**: `AnthropicModel` on the shared SDK client (`fisk_sm.model.clients`), against
  `fisk_sm.testing.FakeMessagesAPI` in a child process of its own (its CPU is not counted; it
  closes each connection, so every call also connects);
* **in-process**: bench/concurrency.py's `LocalModel`, which answers after the same latency with
  no HTTP and no SDK.

The figure is this process's CPU time (`time.process_time`, every thread: the journal writer's and
fsync pool's too) from the first run's start to the last one's end, divided by the model calls
made. The SDK row less the in-process row is what the model call itself costs (the SDK, the
transport, reading and checking the reply); the rest is the engine and its journal.

Every process is this bench code with the tree to measure first on `sys.path`
(`FISK_SM_BENCH_TREE`; the old commit is exported with `git archive`, as
bench/supervisor_events.py does). Three sides: **old**, **new**, and, with the SDK, **create**:
this tree with every call made through `messages.create` as before (the lean call of
`fisk_sm.model.transport` turned off in that process), which tells the lean call's share from
the transport's. The sides alternate (`--repeat` processes a model and side, default 3); the
table shows the median CPU per call, the best, the wall time of the runs, the share of calls
made lean, and how the runs ended, then the ratios to old of the medians. Nothing is asserted.

    .venv/bin/python bench/model_call.py [--runs N] [--calls K] [--latency S] [--repeat R]
        [--old-commit C] [--new-tree DIR]
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

MODELS = ("SDK", "in-process")
#: The sides of each model: (name, tree, calls through `messages.create` only).
SIDES = {"SDK": ("old", "create", "new"), "in-process": ("old", "new")}


async def measure(runs: int, calls: int, latency: float, model: str, root: Path) -> dict[str, Any]:
    """Start `runs` durable sessions, run them, and time this process's CPU while they run."""
    from concurrency import LocalModel, config, fake_api, script, tick

    from fisk_sm.journal.filestore import FileStore
    from fisk_sm.loop.harness import RunOptions
    from fisk_sm.loop.sessions import start_session
    from fisk_sm.model.clients import warm_up

    sdk = model == "SDK"
    with fake_api(script(runs, calls, latency) if sdk else [], in_process=not sdk) as base_url:
        cfg, store = config(base_url, calls), FileStore(root)
        options = RunOptions(model=None if sdk else LocalModel(latency), tools=[tick])
        if sdk:
            await warm_up(cfg.llm)
        created = await asyncio.gather(
            *(start_session(cfg, "count", store, options) for _ in range(runs))
        )
        begin, cpu = time.perf_counter(), time.process_time()
        states = await asyncio.gather(*(run.run() for run in created))
        wall, cpu = time.perf_counter() - begin, time.process_time() - cpu
        made = sum(run.data.llm_calls for run in created)
        await asyncio.gather(*(run.aclose() for run in created))
    return {"cpu": cpu / max(made, 1), "wall": wall, "calls": made, "ended": sorted(set(states))}


def child(args: argparse.Namespace) -> None:
    """In a side's process: one measurement, printed as JSON."""
    tree = os.environ.get("FISK_SM_BENCH_TREE") or str(BENCH.parent)
    sys.path.insert(0, tree)
    import fisk_sm
    from fisk_sm.loop.run import loop_machine

    if args.create_only:  # every call through `messages.create`, as before the lean call
        import fisk_sm.model.anthropic as adapter

        adapter.lean_call = lambda model, thinking: False  # type: ignore[attr-defined]

    loop_machine()  # built outside the clock
    with tempfile.TemporaryDirectory(prefix="fisk-sm-model-call-") as tmp:
        report = asyncio.run(measure(args.runs, args.calls, args.latency, args.model, Path(tmp)))
    report["fisk_sm"] = str(Path(fisk_sm.__file__).resolve().parent)
    transport = sys.modules.get("fisk_sm.model.transport")  # none before issue 24
    report["lean"] = getattr(transport, "lean_calls", 0)
    print(json.dumps(report))


def side(tree: Path, args: argparse.Namespace, model: str, create: bool) -> dict[str, Any]:
    """One process measuring `tree`'s fisk_sm with `model` (`create`: no lean calls)."""
    argv = ["--child", "--model", model, "--runs", str(args.runs), "--calls", str(args.calls)]
    argv += ["--latency", str(args.latency)] + (["--create-only"] if create else [])
    return child_report(Path(__file__), tree, argv)


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="fisk-sm-compare-") as tmp:
        new_tree = args.new_tree or BENCH.parent
        trees = {"old": Path(tmp), "create": new_tree, "new": new_tree}
        names = side_names(args, Path(tmp))
        got: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.repeat):  # interleaved, so that drift hits every side alike
            for model in MODELS:
                for name in SIDES[model]:
                    report = side(trees[name], args, model, create=name == "create")
                    got.setdefault((model, name), []).append(report)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{args.runs} runs × {args.calls} calls, {args.latency * 1e3:g} ms latency, file", end="")
    print(f" journals; {args.repeat} processes a model and side, interleaved")
    print(f"old: {names['old']}\nnew: {names['new']}")
    print("create: the new tree, every call through messages.create (no lean call)\n")
    print(f"{'model':<11} {'side':<6} {'cpu ms/call':>11} {'best':>7} {'wall s':>7}", end="")
    print(f" {'lean':>5}  ended")
    median: dict[tuple[str, str], float] = {}
    for model in MODELS:
        for name in SIDES[model]:
            reports = got[model, name]
            cpus = [r["cpu"] * 1e3 for r in reports]
            median[model, name] = statistics.median(cpus)
            wall = statistics.median(r["wall"] for r in reports)
            ended = ",".join(sorted({s for r in reports for s in r["ended"]}))
            lean = sum(r["lean"] for r in reports) / max(sum(r["calls"] for r in reports), 1)
            print(f"{model:<11} {name:<6} {median[model, name]:>11.3f} {min(cpus):>7.3f}", end="")
            print(f" {wall:>7.2f} {lean:>5.0%}  {ended}")
    engine = {"old": median["in-process", "old"], "create": median["in-process", "new"]}
    engine["new"] = engine["create"]
    share = {name: median["SDK", name] - engine[name] for name in SIDES["SDK"]}
    print()
    for name in SIDES["SDK"]:
        print(f"the model call itself (SDK - in-process), {name}: {share[name]:.3f} ms")
    print()
    for name in ("create", "new"):
        ratio = median["SDK", name] / median["SDK", "old"]
        print(f"ratio {name}/old, cpu per call, SDK: {ratio:.3f}")
    ratio = median["in-process", "new"] / median["in-process", "old"]
    print(f"ratio new/old, cpu per call, in-process: {ratio:.3f}")
    if share["old"] > 0:
        for name in ("create", "new"):
            print(f"ratio {name}/old, the model call itself: {share[name] / share['old']:.3f}")


def main() -> int:
    parser = sides_parser(__doc__, "model")
    parser.add_argument("--model", choices=MODELS, default="SDK", help=argparse.SUPPRESS)
    parser.add_argument("--create-only", action="store_true", help=argparse.SUPPRESS)
    return run_sides("model_call.py", parser.parse_args(), child, compare)


if __name__ == "__main__":
    sys.exit(main())

"""The supervisor side by side: `fisk-sm supervise` as a real process, this tree against an older
one (default: commit dd8b2d4, main before issue 24), in the same run.

Each trial starts `python -m fisk_sm.cli supervise` on a fresh state directory (durable file
journals), submits `--runs` runs over HTTP (default 1,000, `--concurrency` = the runs), every run
`--calls` model calls (default 3), each answered after `--latency` (default 50 ms) with a cheap
`tick` tool call, and ends `iterations_exhausted` at the iteration cap. Two models:

* **in-process**: a model object in the supervisor's process answers (no HTTP, no SDK); it is
  put there by a `sitecustomize` module this bench writes (`HOOK`), which wraps the tree's
  `Supervisor.__init__`; it needs no hook in fisk-sm itself, and reaches worker processes too;
* **SDK**: the real anthropic SDK over loopback HTTP to the fake Messages API in a child process.

`--warm` runs (default 20) go first, unmeasured: imports, the SDK's client and the first
journals are no run's cost. Figures of a trial, measured on the supervisor's processes only
(the front and its children, the workers, from `/proc/PID/stat`), from the first submit to
the last run's end:

* runs/s: the runs over the wall time from the first submit to the last journal write (the
  newest journal mtime; the listing is polled every 2 s only to learn that all have ended);
* CPU per run and per model call: utime + stime of every supervisor process, over the window;
* the worst event-loop stall: every supervisor process runs a ticker (from `HOOK`) that sleeps
  5 ms at a time and notes each wake-up later than 5 ms, with its `time.monotonic()`; the worst
  inside the window is shown.

The sides alternate (old, new, old, new: `--repeat` trials a model and side, default 1), and the
table shows the medians and the ratios new/old. `--workers N` is passed to the new side only
(default: none given, so the CLI's default); the old tree has one process. Nothing is asserted.

    .venv/bin/python bench/supervise.py [--runs N] [--calls K] [--latency S] [--repeat R]
        [--models in-process,SDK] [--workers N] [--old-commit C] [--new-tree DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # concurrency, compare_overhead

from compare_overhead import CompareError, export, working_tree_name  # noqa: E402

MODELS = ("in-process", "SDK")
TICKS = os.sysconf("SC_CLK_TCK")
ENDED = {"completed", "failed", "budget_exhausted", "iterations_exhausted", "aborted"}

#: Loaded by every Python process of a trial (`PYTHONPATH`): with FISK_SM_BENCH_LATENCY set,
#: each Supervisor gets an in-process model; with FISK_SM_BENCH_STALLS, a stall ticker.
HOOK = """
import asyncio, os, time

def _install():
    stalls = os.environ.get("FISK_SM_BENCH_STALLS")
    latency = os.environ.get("FISK_SM_BENCH_LATENCY")
    if not stalls:
        return
    try:
        import fisk_sm
        from fisk_sm.supervisor import Supervisor
    except Exception:
        return
    with open(os.path.join(stalls, f"{os.getpid()}.where"), "w") as where:
        where.write(os.path.dirname(os.path.abspath(fisk_sm.__file__)))
    import attrs
    original = Supervisor.__init__

    class Model:
        def __init__(self, latency):
            self.latency = latency

        async def create(self, request):
            await asyncio.sleep(self.latency)
            use = {"type": "tool_use", "id": "toolu_local", "name": "tick", "input": {"n": 1}}
            usage = {"input_tokens": 10, "output_tokens": 5}
            return {"content": [use], "stop_reason": "tool_use", "usage": usage}

    async def tick(path):
        loop = asyncio.get_running_loop()
        late = []
        last = time.monotonic()
        while True:
            start = loop.time()
            await asyncio.sleep(0.005)
            behind = loop.time() - start - 0.005
            if behind > 0.005:
                late.append(f"{time.monotonic():.6f} {behind:.6f}\\n")
            if late and time.monotonic() - last > 0.5:
                with open(path, "a") as out:
                    out.write("".join(late))
                late, last = [], time.monotonic()

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if latency:
            self.options = attrs.evolve(self.options, model=Model(float(latency)))
        loop = asyncio.get_running_loop()
        path = os.path.join(stalls, f"{os.getpid()}.txt")
        self._bench_ticker = loop.create_task(tick(path))

    Supervisor.__init__ = __init__

_install()
"""

TOOLS = '''
async def tick(n: int) -> int:
    """Count one."""
    return n + 1
'''


def cpu_of(pid: int) -> float:
    """utime + stime of `pid` in seconds (0 if it is gone)."""
    return sum(times_of(pid))


def times_of(pid: int) -> tuple[float, float]:
    """utime and stime of `pid` in seconds (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def tree_of(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found, todo = [], [pid]
    while todo:
        one = todo.pop()
        found.append(one)
        for task in Path(f"/proc/{one}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


class Trial:
    """One `fisk-sm supervise` process of `tree` on a fresh state directory in `root`."""

    def __init__(
        self, tree: Path, root: Path, args: argparse.Namespace, model: str, new: bool
    ) -> None:
        self.tree, self.root, self.args, self.model, self.new = tree, root, args, model, new
        root.mkdir(parents=True)
        (root / "hook").mkdir()
        (root / "hook" / "sitecustomize.py").write_text(HOOK)
        (root / "hook" / "bench_tools.py").write_text(TOOLS)
        (root / "stalls").mkdir()

    def agent(self, base_url: str) -> Path:
        agent = self.root / "agent.yaml"
        budget = f"{{max_iterations: {self.args.calls}, call_timeout: 120}}"
        agent.write_text(
            f"system_prompt: You count.\nllm: {{model: bench, base_url: '{base_url}',"
            f" no_prompt_cache: true, budget: {budget}}}\n"
            "tools: [{python: 'bench_tools:tick'}]\n"
        )
        return agent

    def run(self, base_url: str, workers: int | None, profile: Path | None) -> dict[str, Any]:
        state = self.root / "state"
        argv = [sys.executable, "-m", "fisk_sm.cli", "supervise", "-c", str(self.agent(base_url))]
        argv += ["--listen", "127.0.0.1:0", "--state-dir", str(state)]
        argv += ["--concurrency", str(self.args.runs), "--event-buffer", "4096"]
        if workers is not None:
            argv += ["--workers", str(workers)]
        if profile is not None:  # py-spy's collapsed stacks of every supervisor process
            spy = ["py-spy", "record", "--subprocesses", "--format", "raw", "--rate", "250"]
            argv = [*spy, "-o", str(profile), "--", *argv]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        env["PYTHONPATH"] = f"{self.root / 'hook'}:{self.tree}"
        env["ANTHROPIC_API_KEY"] = "bench"
        env["FISK_SM_BENCH_STALLS"] = str(self.root / "stalls")
        if self.model == "in-process":
            env["FISK_SM_BENCH_LATENCY"] = str(self.args.latency)
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env, cwd=self.root,
        )  # fmt: skip
        assert process.stderr is not None
        lines: list[str] = []
        listening = threading.Event()

        def read() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line)
                if "listening on" in line:
                    listening.set()

        threading.Thread(target=read, daemon=True).start()
        try:
            if not listening.wait(60):
                raise CompareError(f"supervise did not start: {''.join(lines[-5:]).strip()}")
            time.sleep(0.5)  # the workers' start-up is not the runs' cost
            url = (state / "supervisor.url").read_text().strip()
            return self.measure(url, process.pid, state)
        finally:
            pids = tree_of(process.pid)  # under py-spy, the supervisor is its child
            os.kill(
                pids[1] if profile is not None and len(pids) > 1 else process.pid, signal.SIGTERM
            )
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def measure(self, url: str, pid: int, state: Path) -> dict[str, Any]:
        address = urllib.parse.urlsplit(url)
        host, port = address.hostname or "127.0.0.1", address.port or 80
        local = threading.local()

        def submit(i: int) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(host, port, timeout=60)
            body = json.dumps({"prompt": f"count {i}"})
            conn.request("POST", "/api/runs", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            if reply.status != 201:
                raise CompareError(f"POST /api/runs: {reply.status} {data[:200]!r}")

        def ended(total: int, every: float) -> dict[str, int]:
            while True:
                time.sleep(every)
                conn = http.client.HTTPConnection(host, port, timeout=60)
                conn.request("GET", "/api/runs")
                runs = json.loads(conn.getresponse().read())["runs"]
                statuses: dict[str, int] = {}
                for run in runs:
                    statuses[run["status"]] = statuses.get(run["status"], 0) + 1
                if len(runs) >= total and set(statuses) <= ENDED:
                    return statuses
                if time.monotonic() - begin > 600:
                    raise CompareError(f"runs did not end in 600 s: {statuses}")

        warm = self.args.warm
        begin = time.monotonic()
        with ThreadPoolExecutor(8) as pool:  # imports, the SDK's client, the first journals
            list(pool.map(submit, range(warm)))
        ended(warm, 0.5)
        pids = tree_of(pid)
        others = [p for p in tree_of(os.getpid())[1:] if p not in pids]  # the fake API's
        others0 = sum(cpu_of(p) for p in others)
        before = [cpu_of(p) for p in pids]
        system0 = sum(times_of(p)[1] for p in pids)
        cpu0 = sum(before)
        begin, wall0 = time.monotonic(), time.time()
        client0 = time.process_time()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(submit, range(warm, warm + self.args.runs)))
        submitted = time.monotonic() - begin
        statuses = ended(warm + self.args.runs, 2.0)
        client = time.process_time() - client0
        fake = sum(cpu_of(p) for p in others) - others0
        statuses["iterations_exhausted"] -= warm
        after = [cpu_of(p) for p in pids]
        system = sum(times_of(p)[1] for p in pids) - system0
        cpu = sum(after) - cpu0
        spent = zip(after, before, strict=True)
        shares = [round((a - b) / self.args.runs * 1e3, 2) for a, b in spent]
        last = max(p.stat().st_mtime for p in state.glob("*.json"))
        wall = last - wall0
        worst = 0.0
        for path in (self.root / "stalls").glob("*.txt"):
            for line in path.read_text().splitlines():
                at, behind = (float(x) for x in line.split())
                if begin <= at <= begin + wall + 0.1:
                    worst = max(worst, behind)
        for where in (self.root / "stalls").glob("*.where"):
            if not Path(where.read_text()).is_relative_to(self.tree.resolve()):
                raise CompareError(f"measured {where.read_text()}, not the fisk_sm of {self.tree}")
        calls = self.args.runs * self.args.calls
        return {
            "runs_s": self.args.runs / wall,
            "cpu_run": cpu / self.args.runs,
            "cpu_call": cpu / calls,
            "stall": worst,
            "processes": len(pids),
            "cpu_ms_run_by_process": shares,  # the front first
            "system_ms_run": round(system / self.args.runs * 1e3, 2),  # the kernel's share
            "client_ms_run": round(client / self.args.runs * 1e3, 2),  # this bench's submits
            "fake_ms_run": round(fake / self.args.runs * 1e3, 2),  # the fake API's (SDK)
            "submit_s": round(submitted, 3),  # the last submit's answer, from the first's start
            "statuses": statuses,
        }


def trial(
    tree: Path, args: argparse.Namespace, model: str, root: Path, new: bool
) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH))
    from concurrency import script, serve, served_in_child

    workers = args.workers if new else None
    profile = args.py_spy / f"{model}.txt" if new and args.py_spy else None
    if model == "SDK":
        replies = script(args.warm + args.runs, args.calls, args.latency)
        with served_in_child(serve, replies) as base_url:
            return Trial(tree, root, args, model, new).run(base_url, workers, profile)
    return Trial(tree, root, args, model, new).run("http://127.0.0.1:9", workers, profile)


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="fisk-sm-supervise-") as tmp:
        old_tree = Path(tmp) / "old"
        old_tree.mkdir()
        names = {"old": export(args.old_commit, old_tree)}
        names["new"] = f"the tree at {args.new_tree}" if args.new_tree else working_tree_name()
        trees = {"old": old_tree, "new": args.new_tree or BENCH.parent}
        got: dict[tuple[str, str], list[dict[str, Any]]] = {}
        count = 0
        for _ in range(args.repeat):
            for model in args.models:
                for side, tree in trees.items():
                    count += 1
                    root = Path(tmp) / f"trial-{count}"
                    one = trial(tree, args, model, root, side == "new")
                    got.setdefault((model, side), []).append(one)
                    print(f"  {model:<10} {side}: {json.dumps(one)}", file=sys.stderr)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; `fisk-sm supervise`", end="")
    print(f" processes; {args.runs} runs × {args.calls} calls, {args.latency * 1e3:g} ms latency,")
    print("file journals,", end=" ")
    print(f"submitted over HTTP; {args.repeat} trial(s) a model and side, interleaved; medians")
    print(f"old: {names['old']}\nnew: {names['new']}", end="")
    print(f" (--workers {args.workers})" if args.workers is not None else " (default workers)")
    print()
    head = f"{'model':<11} {'side':<4} {'procs':>5} {'runs/s':>8} {'cpu ms/run':>10}"
    print(f"{head} {'cpu ms/call':>11} {'worst stall':>11}  ended")
    for model in args.models:
        medians: dict[str, dict[str, float]] = {}
        for side in trees:
            reports = got[model, side]
            med = {k: statistics.median(r[k] for r in reports) for k in ("runs_s", "cpu_run")}
            med["cpu_call"] = statistics.median(r["cpu_call"] for r in reports)
            med["stall"] = max(r["stall"] for r in reports)
            medians[side] = med
            ended = ",".join(sorted({s for r in reports for s in r["statuses"]}))
            procs = max(r["processes"] for r in reports)
            print(f"{model:<11} {side:<4} {procs:>5} {med['runs_s']:>8.1f}", end="")
            print(f" {med['cpu_run'] * 1e3:>10.2f} {med['cpu_call'] * 1e3:>11.2f}", end="")
            print(f" {med['stall'] * 1e3:>8.1f} ms  {ended}")
        old, new = medians["old"], medians["new"]
        print(f"{model:<11} new/old runs/s {new['runs_s'] / old['runs_s']:.2f}×", end="")
        print(f", cpu/run {new['cpu_run'] / old['cpu_run']:.2f}×", end="")
        print(f", cpu/call {new['cpu_call'] / old['cpu_call']:.2f}×")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs a trial (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per run (default 3)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per reply")
    parser.add_argument("--repeat", type=int, default=1, help="trials a model and side")
    parser.add_argument(
        "--warm", type=int, default=20, help="runs before the measured ones (default 20)"
    )
    parser.add_argument(
        "--models",
        type=lambda s: tuple(m for m in s.split(",") if m),
        default=MODELS,
        help="in-process,SDK (default both)",
    )
    parser.add_argument("--workers", type=int, help="--workers for the new side (default: none)")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record the new side with py-spy (on PATH) into DIR/<model>.txt (figures skewed)",
    )
    parser.add_argument("--old-commit", default="dd8b2d4", help="the baseline (default dd8b2d4)")
    parser.add_argument("--new-tree", type=Path, help="measure this checkout (default: this one)")
    args = parser.parse_args()
    for model in args.models:
        if model not in MODELS:
            parser.error(f"--models: {model!r} is not one of {', '.join(MODELS)}")
    try:
        compare(args)
    except CompareError as exc:
        print(f"supervise.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

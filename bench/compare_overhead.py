"""fisk-sm's time per loop iteration, before and after: a git revision against the working tree.

    .venv/bin/python bench/compare_overhead.py 5a27dad            # 5 runs each, interleaved
    .venv/bin/python bench/compare_overhead.py REV --runs 7 --iterations 200 --repeats 15

REV is exported (`git archive`, nothing in the checkout changes) to a temporary directory. Then
the fisk-sm contender of `loop_overhead.py` runs in fresh processes, alternately against REV's
`fisk_sm` and the working tree's (old, new, old, new, ...): each process is this bench code,
loop_overhead.py of the working tree, with the other tree first on `sys.path`
(FISK_SM_BENCH_TREE), so that only the engine differs. A process warms up once, then times
`--repeats` runs of `--iterations` tool iterations and reports their median per-iteration time.
Printed for each side: the median of its processes' figures and the best single run; then the
ratio new/old of the medians, with the verdict "within 5% or faster" or not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
#: A slowdown up to this ratio (new/old, medians) still counts as "within 5%".
TOLERANCE = 1.05


class CompareError(Exception):
    """Something the comparison cannot go on without; one line for the user."""


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise CompareError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def export(rev: str, dest: Path) -> str:
    """Write the tree of `rev` into `dest`; return how to name it (short hash and subject)."""
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except CompareError:
        raise CompareError(f"{rev!r} is not a revision of {ROOT}") from None
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], stdout=subprocess.PIPE
    )
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    if archive.wait() != 0 or untar.returncode != 0:
        raise CompareError(f"could not export {rev} to {dest}")
    return git("log", "-1", "--format=%h %s", commit)[:72]


def working_tree_name() -> str:
    head = git("log", "-1", "--format=%h")
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"working tree (HEAD {head}{' + uncommitted changes' if changed else ''})"


def side_names(args: argparse.Namespace, old_tree: Path) -> dict[str, str]:
    """Export `args.old_commit` into `old_tree`; the names of the sides: old, and new (the tree
    at `args.new_tree`, else the working tree)."""
    new = f"the tree at {args.new_tree}" if args.new_tree else working_tree_name()
    return {"old": export(args.old_commit, old_tree), "new": new}


def run_side(tree: Path, iterations: int, repeats: int) -> list[float]:
    """One process timing fisk-sm against `tree`'s fisk_sm: its per-iteration samples."""
    argv = ["--child", "--iterations", str(iterations), "--repeats", str(repeats)]
    report = child_report(Path(__file__), tree, argv)
    return [float(s) for s in report["samples"]]


def child_report(script: Path, tree: Path, argv: list[str]) -> dict[str, Any]:
    """The JSON report (its last line of output) of `script argv` run against `tree`'s fisk_sm
    (`FISK_SM_BENCH_TREE`); it must name the fisk_sm it measured (`"fisk_sm"`)."""
    done = subprocess.run(
        [sys.executable, str(script.resolve()), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "FISK_SM_BENCH_TREE": str(tree)},
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CompareError(f"the bench does not run against {tree}: {last}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    measured = Path(report["fisk_sm"])
    if not measured.is_relative_to(tree.resolve()):  # an installed fisk_sm came first
        raise CompareError(f"measured {measured}, not the fisk_sm of {tree}")
    return report


def sides_parser(doc: str, unit: str) -> argparse.ArgumentParser:
    """The options of a bench that measures an old commit and this tree, `--repeat` processes a
    `unit` (a model, a mode) and side (bench/model_call.py, bench/supervisor_events.py)."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs a process (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per run (default 3)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per reply")
    parser.add_argument("--repeat", type=int, default=3, help=f"processes a {unit} and side")
    parser.add_argument("--old-commit", default="dd8b2d4", help="the baseline (default dd8b2d4)")
    parser.add_argument(
        "--new-tree", type=Path, help="measure the fisk_sm of this checkout (default: this one)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def run_sides(
    script: str,
    args: argparse.Namespace,
    child: Callable[[argparse.Namespace], None],
    compare: Callable[[argparse.Namespace], None],
) -> int:
    """A side's process (`--child`: `child`) or the comparison (`compare`); the exit status."""
    if args.child:
        child(args)
        return 0
    try:
        compare(args)
    except CompareError as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        return 1
    return 0


def compare(rev: str, runs: int, iterations: int, repeats: int) -> None:
    """Run both sides interleaved and print the figures and the verdict."""
    with tempfile.TemporaryDirectory(prefix="fisk-sm-compare-") as tmp:
        old_tree = Path(tmp)
        trees = {"old": old_tree, "new": ROOT}
        names = {"old": export(rev, old_tree), "new": working_tree_name()}
        figures: dict[str, list[float]] = {"old": [], "new": []}
        best: dict[str, float] = {}
        for _ in range(runs):  # interleaved, so that drift hits both sides alike
            for side, tree in trees.items():
                samples = run_side(tree, iterations, repeats)
                figures[side].append(statistics.median(samples))
                best[side] = min(best.get(side, float("inf")), *samples)
    median = {side: statistics.median(f) for side, f in figures.items()}
    print(
        f"fisk-sm, {iterations} tool iterations + 1 final reply per run; {runs} processes a "
        f"side, interleaved old/new,\neach the median of {repeats} timed runs after a warm-up"
    )
    print(f"old: {names['old']}\nnew: {names['new']}\n")
    print(f"{'side':<5} {'median µs/iter':>14} {'best µs/iter':>13}  each process (µs/iter)")
    for side in ("old", "new"):
        each = ", ".join(f"{f * 1e6:.2f}" for f in figures[side])
        print(f"{side:<5} {median[side] * 1e6:>14.2f} {best[side] * 1e6:>13.2f}  {each}")
    ratio = median["new"] / median["old"]
    verdict = (
        "within 5% or faster"
        if ratio <= TOLERANCE
        else f"NOT within 5%: {(ratio - 1) * 100:.1f}% slower"
    )
    print(f"\nratio new/old (medians): {ratio:.3f}× — {verdict}")


def child(iterations: int, repeats: int) -> None:
    """In a side's process: time fisk-sm with loop_overhead.py's code, print JSON."""
    import loop_overhead as lo  # puts FISK_SM_BENCH_TREE first on sys.path

    import fisk_sm

    config = lo.bench_config(iterations)
    lo.loop_machine()  # built outside the clock, as in loop_overhead.py

    async def fisk(model: lo.ScriptedModel) -> int:
        return await lo.run_fisk(config, model)

    async def sample() -> list[float]:
        await lo.timed(fisk, iterations)  # warm up
        return [await lo.timed(fisk, iterations) for _ in range(repeats)]

    samples = asyncio.run(sample())
    print(json.dumps({"fisk_sm": str(Path(fisk_sm.__file__).resolve().parent), "samples": samples}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rev", nargs="?", help="the git revision to compare with (the 'old')")
    parser.add_argument("--runs", type=int, default=5, help="processes a side (default 5)")
    parser.add_argument(
        "--iterations", type=int, default=200, help="tool iterations per run (default 200)"
    )
    parser.add_argument(
        "--repeats", type=int, default=15, help="timed runs per process (default 15)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.runs, args.iterations, args.repeats) < 1:
        parser.error("--runs, --iterations and --repeats must be at least 1")
    if not args.child and not args.rev:
        parser.error("the revision to compare with is required")
    return args


def main() -> int:
    return run_sides(
        "compare_overhead.py",
        parse_args(),
        lambda args: child(args.iterations, args.repeats),
        lambda args: compare(args.rev, args.runs, args.iterations, args.repeats),
    )


if __name__ == "__main__":
    sys.exit(main())

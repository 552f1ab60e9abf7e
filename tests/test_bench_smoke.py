"""The benchmarks still run: each script, at its smallest, exits 0 and prints its figures.

They assert nothing about timing (the machines are noisy); this only keeps them from rotting as
the code they measure changes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.bench
@pytest.mark.parametrize(
    ("script", "args", "figure"),
    [
        ("loop_overhead.py", ["--iterations", "5", "--repeats", "1"], "engine overhead"),
        ("journal.py", ["--quick"], "journal/content"),
        (  # figure 1 alone, with HEAD exported as the baseline (a child process a side)
            "journal.py",
            ["--quick", "--durable-only", "--baseline", "HEAD", "--repeats", "1"],
            "other, fisk/base",
        ),
        ("concurrency.py", ["--runs", "4", "--calls", "2", "--latency", "0.001"], "throughput"),
        ("supervisor.py", ["--runs", "3", "--calls", "2", "--latency", "0.001"], "RSS per run"),
        ("distributed.py", ["--smallest"], "throughput ratio 3/1"),
        (
            "model_transport.py",
            ["--callers", "2", "--calls", "2", "--repeats", "1", "--latency", "0.001"],
            "vs default",
        ),
        (  # HEAD exported as the baseline, one process a model and side
            "model_call.py",
            [
                "--runs",
                "3",
                "--calls",
                "1",
                "--repeat",
                "1",
                "--latency",
                "1e-3",
                "--old-commit",
                "HEAD",
            ],
            "ratio new/old, the model call itself:",
        ),
        (  # HEAD exported as the baseline, one process a mode and side
            "supervisor_events.py",
            ["--runs", "3", "--calls", "1", "--repeat", "1", "--old-commit", "HEAD"],
            "ratio new/old, cpu per run, one:",
        ),
        (  # `fisk-sm supervise` of HEAD against the working tree's, both models
            "supervise.py",
            [
                "--runs",
                "3",
                "--calls",
                "1",
                "--warm",
                "1",
                "--latency",
                "0.001",
                "--old-commit",
                "HEAD",
            ],
            "new/old runs/s",
        ),
        (  # `fisk-sm supervise --workers 2`, the writer logged from a hook, each mode once
            "fsync_wait.py",
            ["--runs", "3", "--calls", "1", "--warm", "1", "--latency", "0.001", "--repeat", "1"],
            "of it in fsync/syncfs",
        ),
        (  # HEAD exported as the baseline, one process a side, a 30-iteration session
            "resume.py",
            ["--iterations", "30", "--rounds", "1", "--repeats", "1", "--baseline", "HEAD"],
            "ms: median (best)",
        ),
        (  # the full-screen UI: a short stream and a small Operate screen, against bare Textual
            "tui.py",
            ["--smoke"],
            "target: operate median",
        ),
        (  # HEAD exported to a temporary directory against the working tree, one process each
            "compare_overhead.py",
            ["HEAD", "--runs", "1", "--iterations", "5", "--repeats", "1"],
            "ratio new/old (medians)",
        ),
    ],
)
def test_the_benchmark_runs(script: str, args: list[str], figure: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert figure in done.stdout
    if script == "supervisor.py":  # every trial ran its runs to the iteration cap
        assert done.stdout.count("ended: {'iterations_exhausted': 3}") == 4, done.stdout
    if script == "supervise.py":  # both models, every measured run at the iteration cap
        assert done.stdout.count("iterations_exhausted") == 4, done.stdout
    if script == "fsync_wait.py":  # both workers' writers logged, every mode, runs at the cap
        rows = {line[:38].strip(): line[38:].split() for line in done.stdout.splitlines()}
        assert rows["processes writing"] == ["2"] * 4, done.stdout
        assert rows["runs ended"] == ["iterations_exhausted"] * 4, done.stdout
        assert all(float(n) > 0 for n in rows["flushes a run (writer)"]), done.stdout
    if script == "compare_overhead.py":  # each side measured its own tree's fisk_sm
        assert "old: " in done.stdout and "new: working tree (HEAD " in done.stdout
    if script == "model_call.py":  # the new side's calls were lean, the create side's not
        rows = {tuple(line.split()[:2]): line.split() for line in done.stdout.splitlines()}
        assert rows["SDK", "new"][5] == "100%" and rows["SDK", "create"][5] == "0%", done.stdout
    if script == "model_transport.py":  # every transport measured on both fakes
        rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("   ")]
        assert rows.count("fisk-sm") == rows.count("aiohttp") == rows.count("httpx2") == 2
    if script == "journal.py" and "--baseline" in args:  # each side measured its own tree
        assert "fisk measures " in done.stdout and "base measures " in done.stdout
    elif script == "journal.py":  # the many-runs figure and the LangGraph baseline are there
        assert "durable records/s, 50 concurrent runs" in done.stdout
        assert "LangGraph get_state" in done.stdout

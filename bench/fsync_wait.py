"""Where a durable record's wait goes in `fisk-sm supervise --workers N`, and whether fsync bounds
the runs/s (issue 24, item 5: many runs).

Each trial is one `bench/supervise.py` trial of this tree (the in-process model, `--runs` runs ×
`--calls` calls at `--latency`, all submitted at once over HTTP, `--warm` runs first), with a
second `sitecustomize` part (`HOOK`) in every process of the trial that wraps the group-commit
writer of `fisk_sm.journal.writer` from outside (no hook in fisk-sm itself) and logs, with
`time.monotonic()` (one clock for every process):

* each append: queued (`_put`) until the writer thread takes its batch (`_take`), and its whole
  durability wait as the run sees it (`submit` until its future is done, on the loop);
* each commit (a batch, or the fast path's lone append): its appends, the time in `write(2)`, the
  time making it durable (the parallel fsyncs, the one syncfs, or the lone fsync), and how many
  flushes (`fsync`/`syncfs` calls) it made; fsyncs of other threads (the run registry, the state
  directory) are counted apart.

The hook turns off the kernel's direct fsync of an append the writer is idle for
(`fisk_sm.journal.aiosync`, a lone run's path on Linux), so that every append goes through the
writer and each mode applies to each (with 1,000 runs the writer is seldom idle anyway).

Appends of the `--warm` runs are left out (the first `--warm` journals by their first append).
A run's wall time is its journal's first append to its last append's settling; the share of
it spent waiting for durability (whole wait, and the flush part alone) is summed over runs.

Modes (`--modes`), the sides of the comparison, alternate within each repeat:

* `fsync`: fisk-sm as it is (a batch's files fsynced in parallel on the fsync helper threads);
* `none`: `os.fsync` a no-op in every process: the runs/s with no fsync at all (a trial only);
* `syncfs`: one `syncfs(2)` a batch (`GroupCommitWriter(syncfs=True)`, fisk-sm's own option,
  set by the hook);
* `segment`: a prototype of a per-worker shared segment, in the hook: every record is also
  appended to one `segment.<pid>` file of the process, and a commit fsyncs that file once
  instead of each run's file (the run files are still written, unsynced, so the journals stay
  readable; a real segment would not write them: a small overestimate).

The latency bound is runs / (calls × latency) with every run in flight at once. Medians of
`--repeat` trials; nothing is asserted.

    .venv/bin/python bench/fsync_wait.py [--runs N] [--calls K] [--latency S] [--repeat R]
        [--workers 2,0] [--modes fsync,none,syncfs,segment] [--warm W]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from compare_overhead import CompareError, working_tree_name  # noqa: E402
from supervise import Trial  # noqa: E402

MODES = ("fsync", "none", "syncfs", "segment")

#: Appended to `supervise.py`'s sitecustomize, with `_fsync_wait(MODE, OUT)` after it.
HOOK = """
import threading as _threading


def _fsync_wait(mode, out):
    import itertools, os, json, time
    try:
        from fisk_sm.journal import writer as w
    except Exception:
        return
    try:  # every append through the writer, so that each mode applies to each of them
        from fisk_sm.journal import filejournal as _fj
        _fj.DIRECT_MAX = -1
    except (ImportError, AttributeError):
        pass
    now = time.monotonic
    pid, serial = os.getpid(), itertools.count()
    keys, put_at, flushes, writes, lines = {}, {}, [], [], []
    other = []  # fsyncs off the writer's threads: (at, seconds)

    def key(channel):
        return keys.setdefault(id(channel), (next(serial), channel))[0]  # keeps it alive

    def timed_fsync(real):
        def fsync(fd):
            start = now()
            real(fd)
            end = now()
            name = _threading.current_thread().name
            if name.startswith("fisk-journal") or name.startswith("fisk-fsync"):
                flushes.append(end - start)
            else:
                other.append((end, end - start, name))
        return fsync

    if mode == "none":
        os.fsync = lambda fd: None
    os.fsync = timed_fsync(os.fsync)

    if mode == "segment":
        seg = os.open(os.path.join(out, f"segment.{pid}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        real_write = w._write

        def seg_write(channel, data):
            ok = real_write(channel, data)
            if ok:
                os.write(seg, data)
            return ok

        def seg_fsync(channel):
            try:
                os.fsync(seg)
            except OSError as exc:
                channel.failure = exc

        w._write = seg_write
        w._fsync = seg_fsync
        w.GroupCommitWriter._sync = lambda self, to_sync: to_sync and w._fsync(to_sync[0])

    if mode == "syncfs":
        init = w.GroupCommitWriter.__init__

        def __init__(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "syncfs": True})
            real = self._syncfs
            if real is not None:
                def syncfs(fd):
                    start = now()
                    got = real(fd)
                    flushes.append(now() - start)
                    return got
                self._syncfs = syncfs

        w.GroupCommitWriter.__init__ = __init__

    plain_write = w._write

    def write(channel, data):
        if not _threading.current_thread().name.startswith("fisk-journal"):
            return plain_write(channel, data)
        start = now()
        try:
            return plain_write(channel, data)
        finally:
            writes.append(now() - start)

    w._write = write

    gcw = w.GroupCommitWriter
    submit, put, take = gcw.submit, gcw._put, gcw._take

    def _submit(self, channel, data, *, sync=True, then=None):
        start, k = now(), key(channel)
        future = submit(self, channel, data, sync=sync, then=then)
        future.add_done_callback(lambda f: lines.append({"r": [k, start, now(), sync]}))
        return future

    def _put(self, item):
        put_at[id(item)] = now()
        put(self, item)

    taken = {}

    def _take(self):
        batch = take(self)
        at = now()
        taken["at"] = at
        taken["queued"] = [
            (key(i.channel), at - put_at.pop(id(i), at)) for i in batch if hasattr(i, "data")
        ]
        return batch

    def wrap_commit(real, kind):
        def commit(self, *args):
            nf, nw = len(flushes), len(writes)
            start = now()
            sync_box = []
            if kind == "batch":
                sync = self._sync

                def timed_sync(to_sync):
                    s = now()
                    sync(to_sync)
                    sync_box.append((now() - s, len(to_sync)))

                self._sync = timed_sync
            try:
                real(self, *args)
            finally:
                if kind == "batch":
                    del self._sync
                end = now()
                fl = flushes[nf:]
                durable, files = sync_box[0] if sync_box else (sum(fl), 1 if fl else 0)
                lines.append({"b": [kind, taken.get("at", start), end, taken.get("queued", []),
                                    sum(writes[nw:]), durable, len(fl), files]})
        return commit

    w.GroupCommitWriter.submit = _submit
    w.GroupCommitWriter._put = _put
    w.GroupCommitWriter._take = _take
    w.GroupCommitWriter._commit_lone = wrap_commit(w.GroupCommitWriter._commit_lone, "lone")
    w.GroupCommitWriter._commit_batch = wrap_commit(w.GroupCommitWriter._commit_batch, "batch")

    def flush():
        path = os.path.join(out, f"{pid}.jsonl")
        while True:
            time.sleep(0.3)
            got, lines[:] = lines[:], []
            got += [{"o": list(o)} for o in other]
            other[:] = []
            if got:
                with open(path, "a") as f:
                    f.write("".join(json.dumps(x) + "\\n" for x in got))

    _threading.Thread(target=flush, name="bench-fsync-log", daemon=True).start()
"""


class WaitTrial(Trial):
    """`supervise.py`'s trial with the writer's log added to its hook."""

    def __init__(self, root: Path, args: argparse.Namespace, mode: str) -> None:
        super().__init__(BENCH.parent, root, args, "in-process", new=True)
        self.out = root / "fsync"
        self.out.mkdir()
        hook = self.root / "hook" / "sitecustomize.py"
        call = f"\n_fsync_wait({mode!r}, {str(self.out)!r})\n"
        hook.write_text(hook.read_text() + HOOK + call)

    def figures(self, report: dict[str, Any], warm: int) -> dict[str, Any]:
        records, batches, other = [], [], []  # other: (at, seconds, thread)
        for path in self.out.glob("*.jsonl"):
            pid = path.stem
            for line in path.read_text().splitlines():
                item = json.loads(line)
                if "r" in item:
                    records.append((pid, *item["r"]))
                elif "b" in item:
                    batches.append((pid, *item["b"]))
                else:
                    other.append(item["o"])
        if not records:
            raise CompareError(f"the hook logged no append in {self.out} (writer internals moved?)")
        runs: dict[tuple[str, int], list[float]] = {}  # first submit, last settle, wait
        for pid, k, start, end, _sync in records:
            run = runs.setdefault((pid, k), [start, end, 0.0])
            run[0], run[1] = min(run[0], start), max(run[1], end)
            run[2] += end - start
        warm_runs = set(sorted(runs, key=lambda r: runs[r][0])[:warm])
        begin = min((runs[r][0] for r in runs if r not in warm_runs), default=0.0)
        measured = {r: v for r, v in runs.items() if r not in warm_runs}
        batches = [b for b in batches if b[2] >= begin]
        run_wall = sum(v[1] - v[0] for v in measured.values())
        queued = [q for b in batches for _k, q in b[4]]
        appends = sum(len(b[4]) for b in batches)
        # the flush part of each append's wait: its commit's durable time
        flush_wait = sum(b[6] * len(b[4]) for b in batches)
        wall = self.args.runs / report["runs_s"]
        flushes = sum(b[7] for b in batches)
        sizes = [len(b[4]) for b in batches if b[1] == "batch"]
        others = [o for o in other if o[0] >= begin]
        per_process: dict[str, int] = {}
        for b in batches:
            per_process[b[0]] = per_process.get(b[0], 0) + len(b[4])
        per_file = [b[6] / b[8] for b in batches if b[8]]
        return {
            **report,
            "processes": len({b[0] for b in batches}),
            "appends": appends,
            "queued_ms": 1e3 * statistics.median(queued) if queued else 0.0,
            "write_ms": 1e3 * statistics.median(b[5] for b in batches) if batches else 0.0,
            "durable_ms": 1e3 * statistics.median(b[6] for b in batches) if batches else 0.0,
            "per_file_ms": 1e3 * statistics.median(per_file) if per_file else 0.0,
            "wait_ms": 1e3 * statistics.median(r[3] - r[2] for r in records if r[2] >= begin),
            "lone": sum(b[1] == "lone" for b in batches),
            "batches": len(sizes),
            "batch_size": statistics.median(sizes) if sizes else 0.0,
            "batch_max": max(sizes, default=0),
            "flushes_s": flushes / wall,
            "flushes_run": flushes / max(len(measured), 1),
            "other_fsyncs_run": len(others) / max(len(measured), 1),
            "other_ms_run": 1e3 * sum(o[1] for o in others) / max(len(measured), 1),
            "other_threads": sorted({o[2] for o in others}),
            "appends_min_share": min(per_process.values(), default=0) / max(appends, 1),
            "wait_share": sum(v[2] for v in measured.values()) / run_wall,
            "flush_share": flush_wait / run_wall,
            "busy": sum(b[3] - b[2] for b in batches) / wall / max(len({b[0] for b in batches}), 1),
        }


def one(args: argparse.Namespace, root: Path, mode: str, workers: int) -> dict[str, Any]:
    trial = WaitTrial(root, args, mode)
    report = trial.run("http://127.0.0.1:9", workers, None)
    return trial.figures(report, args.warm)


ROWS = (  # (key, label, format)
    ("runs_s", "runs/s", "{:.1f}"),
    ("cpu_run", "CPU ms/run", "{:.2f}", 1e3),
    ("processes", "processes writing", "{:.0f}"),
    ("wait_ms", "append's durability wait, median ms", "{:.2f}"),
    ("queued_ms", "  queued before the writer takes it", "{:.2f}"),
    ("write_ms", "  write(2) of its commit", "{:.3f}"),
    ("durable_ms", "  fsync/syncfs of its commit", "{:.2f}"),
    ("per_file_ms", "  that over the commit's files", "{:.3f}"),
    ("batch_size", "appends a batch, median", "{:.0f}"),
    ("batch_max", "appends a batch, max", "{:.0f}"),
    ("lone", "lone commits (fast path)", "{:.0f}"),
    ("batches", "batches", "{:.0f}"),
    ("flushes_s", "flushes/s (fsync+syncfs, writer)", "{:.0f}"),
    ("flushes_run", "flushes a run (writer)", "{:.2f}"),
    ("other_fsyncs_run", "other fsyncs a run (registry, files)", "{:.2f}"),
    ("other_ms_run", "  their ms a run", "{:.2f}"),
    ("appends_min_share", "appends of the least busy process", "{:.0%}"),
    ("busy", "writer thread busy, share of wall", "{:.0%}"),
    ("wait_share", "run wall spent awaiting durability", "{:.1%}"),
    ("flush_share", "  of it in fsync/syncfs", "{:.1%}"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs a trial (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per run (default 3)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per reply")
    parser.add_argument("--repeat", type=int, default=3, help="trials a mode (default 3)")
    parser.add_argument("--warm", type=int, default=20, help="unmeasured runs first")
    parser.add_argument("--workers", default="2", help="--workers values, e.g. 2,0 (default 2)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(MODES)}")
    args = parser.parse_args()
    args.uvloop = False
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        parser.error(f"--modes: one of {', '.join(MODES)}")
    sides = [(int(n), m) for n in args.workers.split(",") for m in modes]
    got: dict[tuple[int, str], list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="fisk-sm-fsync-wait-") as tmp:
            count = 0
            for _ in range(args.repeat):
                for workers, mode in sides:
                    count += 1
                    root = Path(tmp) / f"trial-{count}"
                    figures = one(args, root, mode, workers)
                    got.setdefault((workers, mode), []).append(figures)
                    print(f"  --workers {workers} {mode}: {json.dumps(figures)}", file=sys.stderr)
    except CompareError as exc:
        print(f"fsync_wait.py: {exc}", file=sys.stderr)
        return 1
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {working_tree_name()}")
    print(
        f"`fisk-sm supervise`, in-process model: {args.runs} runs × {args.calls} calls at", end=""
    )
    print(f" {args.latency * 1e3:g} ms, all in flight; medians of {args.repeat}; {load}")
    bound = args.runs / (args.calls * args.latency)
    print(f"latency bound: {bound:,.0f} runs/s\n")
    head = [f"--workers {n} {m}" for n, m in sides]
    width = max(12, *(len(h) for h in head))
    print(f"{'':<38}" + "".join(f" {h:>{width}}" for h in head))
    for key, label, fmt, *scale in ROWS:
        cells = []
        for side in sides:
            value = statistics.median(r[key] for r in got[side]) * (scale[0] if scale else 1)
            cells.append(fmt.format(value))
        print(f"{label:<38}" + "".join(f" {c:>{width}}" for c in cells))
    ended = [",".join(sorted({s for r in got[side] for s in r["statuses"]})) for side in sides]
    print(f"{'runs ended':<38}" + "".join(f" {e:>{width}}" for e in ended))
    for workers in dict.fromkeys(n for n, _m in sides):
        if (workers, "fsync") not in got:
            continue
        base = statistics.median(r["runs_s"] for r in got[workers, "fsync"])
        ratios = [
            f"{m} {statistics.median(r['runs_s'] for r in got[workers, m]) / base:.2f}×"
            for n, m in sides
            if n == workers and m != "fsync"
        ]
        print(f"--workers {workers}: runs/s over fsync's: {', '.join(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Resume of a long session: this tree against a git revision and LangGraph's `get_state`.

    .venv/bin/python bench/resume.py              # 1,000 iterations against dd8b2d4
    .venv/bin/python bench/resume.py --iterations 200 --rounds 3 --repeats 9 --baseline HEAD

The session is the records the real loop writes for N tool iterations of ~2.2 KB of content
each, suspended before its next model call (bench/journal.py's `build_session`), made once by
this tree. LangGraph's checkpoint holds the same conversation, the messages the session folds
to (bench/journal_scale.py's `langgraph_get_state`, a `SqliteSaver` on a file and an
`InMemorySaver`); without langgraph installed its rows are skipped, saying so. Each side times
in processes of its own, interleaved round by round (old, new, LangGraph, old, ...) so that a
machine's drift hits all alike: `--baseline`'s fisk_sm (exported with `git archive`), this
tree's, and LangGraph. A fisk-sm process warms up once, then times `--repeats` samples of each
of:

* open + fold: `FileStore.open` (lock, read, parse) and `fold_journal`, what `resume_session`
  does before anything else; the state a run resumes from (LangGraph's `get_state`). In a tree
  with checkpoints (fisk_sm/journal/checkpoint.py) the session has the one its first resume
  wrote (made before the clock, by `resume_fold`), and the messages before it are not decoded;
* + wire JSON: the same, then every message's `to_json()`: the conversation as the next
  request sends it (with deferred messages, this is where their bytes are decoded);
* no checkpoint: open + fold with the checkpoint removed before each sample (outside the
  clock): the first resume of a session that never had one, or whose checkpoint does not hold
  (the same as open + fold in a tree without checkpoints);
* resume to next call: `resume_session` + `run_until("call")` on fresh objects, as
  bench/journal.py's figure 3, with an event sink that reads nothing (`NullEvents`); with
  checkpoints it decodes none of the messages before the checkpoint (their bytes are sent);
* + its request body: the same, then the body of the next request as the model's plain call
  sends it (`ModelRequest.body()`: the messages before the checkpoint spliced in as the
  journal's own bytes, never decoded; in a tree without it, `params()` JSON-encoded): the
  real cost of a resume up to its request;
* LangGraph's `get_state` + request body: the state, then its conversation JSON-encoded as the
  SDK encodes a request body (the least its next call pays: the state holds plain dicts here,
  so no LangChain message is converted); the rows with a request body are also compared with it;
* in a running loop, + its body, in it: the same two, each sample a resume on one event loop
  that keeps running (as a supervisor's does), so without the cost of a new loop and its
  worker thread (about 0.5 ms) that each `asyncio.run` above pays.

Medians over all samples of all rounds. The table gives each figure against the baseline and
against `get_state` (SqliteSaver): the issue's target is a resume at most 0.5× of it, which
is checked both for open + fold (the state, what `get_state` gives) and up to the request body
(what a resumed run needs before its next call, which `get_state` does not include). The
floor row is what any reader that checks every byte pays with these tools, for reference:
splitting the lines, msgspec's syntax check (its `Raw`) and a UTF-8 check of the non-ASCII
lines.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RUN_ID = "resume"
MODES = (
    "open + fold",
    "+ wire JSON",
    "no checkpoint",
    "resume to next call",
    "+ its request body",
    "in a running loop",
    "+ its body, in it",
)
LG_FILE, LG_MEMORY = "SqliteSaver (file)", "InMemorySaver"
#: LangGraph's rows that also encode the state's conversation as a request body.
LG_BODY = " + request body"
TARGET = 0.5  # open + fold over get_state (file)


def timed(
    work: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None
) -> list[float]:
    """Seconds of each of `repeats` calls of `work` after one to warm up; `before` runs ahead
    of each, outside the clock."""
    before()
    work()  # warm-up
    samples = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def fisk_child(state: Path, iterations: int, repeats: int) -> dict[str, Any]:
    """In a side's process (FISK_SM_BENCH_TREE first on sys.path): the samples of each mode."""
    import loop_overhead as lo  # puts FISK_SM_BENCH_TREE first on sys.path

    import fisk_sm
    from fisk_sm.journal.filestore import FileStore
    from fisk_sm.journal.parsing import fold_journal
    from fisk_sm.loop.harness import RunOptions
    from fisk_sm.loop.sessions import resume_session

    store, config = FileStore(state), lo.bench_config(iterations)
    lo.loop_machine()  # built outside the clock
    try:  # a tree with checkpoints: the one the session's first resume writes
        from fisk_sm.journal.checkpoint import checkpoint_path
        from fisk_sm.journal.parsing import resume_fold
    except ImportError:
        kept: Path | None = None
    else:
        journal = store.open(RUN_ID)
        resume_fold(journal.path, journal.records)
        journal.close_sync()
        kept = checkpoint_path(store.path(RUN_ID))
    saved = kept.read_bytes() if kept is not None and kept.exists() else b""  # (a short one: none)

    def drop() -> None:
        if kept is not None:
            kept.unlink(missing_ok=True)

    def restore() -> None:
        if kept is not None and saved:
            kept.write_bytes(saved)

    def load(wire: bool) -> None:
        journal = store.open(RUN_ID)
        try:
            snapshot = fold_journal(journal.path, journal.records)
            if wire:
                [m.to_json() for m in snapshot.messages]
        finally:
            journal.close_sync()
        if snapshot.iteration != iterations:
            raise RuntimeError(f"folded to iteration {snapshot.iteration}")

    async def resume(wire: bool) -> None:
        options = RunOptions(model=lo.ScriptedModel([]), tools=[lo.echo], events=lo.NullEvents())
        run = await resume_session(config, RUN_ID, store, options)
        state = await run.run_until("call")
        if wire:  # the body of the next request, as the model's lean call sends it
            request_body(run.harness.request(run.data.messages))
        await run.harness.journal.close()
        if state != "call" or run.data.iteration != iterations:
            raise RuntimeError(f"resume reached {state!r} at iteration {run.data.iteration}")

    samples = {
        MODES[0]: timed(lambda: load(False), repeats),
        MODES[1]: timed(lambda: load(True), repeats),
        MODES[2]: timed(lambda: load(False), repeats, drop),
    }
    restore()
    samples[MODES[3]] = timed(lambda: asyncio.run(resume(False)), repeats, restore)
    samples[MODES[4]] = timed(lambda: asyncio.run(resume(True)), repeats, restore)

    async def in_loop(wire: bool) -> list[float]:
        """`repeats` resumes on one running loop, as a supervisor resumes its runs."""
        await resume(wire)  # warm-up: the loop's worker threads are started
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            await resume(wire)
            times.append(time.perf_counter() - start)
        return times

    samples[MODES[5]] = asyncio.run(in_loop(False))
    samples[MODES[6]] = asyncio.run(in_loop(True))
    return {"fisk_sm": str(Path(fisk_sm.__file__).resolve().parent), "samples": samples}


def request_body(request: Any) -> bytes:
    """The body a plain call sends: `ModelRequest.body()`, or in a tree without it, its
    `params()` encoded as the lean call did (that tree's `transport.encode_body`)."""
    body = getattr(request, "body", None)
    if body is not None:
        data: bytes = body()
        return data
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    return encode(request.params()).encode()


def floor(path: Path, repeats: int) -> float:
    """Median seconds of the least a reader checking every byte does (see the module)."""
    import msgspec

    class Line(msgspec.Struct):
        seq: int

    decode = msgspec.json.Decoder(Line).decode
    data = path.read_bytes()

    def check() -> None:
        lines = data.split(b"\n")[:-1]
        list(map(decode, lines))
        [line.decode() for line in lines if not line.isascii()]

    return statistics.median(timed(check, repeats))


def langgraph_child(messages: Path, db: Path, repeats: int) -> dict[str, Any]:
    from journal_scale import langgraph_get_state

    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

    def body(conversation: list[dict[str, Any]]) -> bytes:
        """The least LangGraph's next call pays for its request: the SDK's JSON encoding of the
        conversation (no conversion of LangChain messages: the state holds plain dicts)."""
        return encode({"max_tokens": 1024, "messages": conversation, "model": "m"}).encode()

    report = langgraph_get_state(json.loads(messages.read_text()), db, repeats, then=body)
    return {name.replace(" + then", LG_BODY): seconds for name, seconds in report.items()}


def run_child(args: list[str], tree: Path) -> dict[str, Any]:
    env = {**os.environ, "FISK_SM_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=BENCH)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{' '.join(args[:2])} against {tree}: {last}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    measured = report.get("fisk_sm")
    if measured is not None and not Path(measured).is_relative_to(tree.resolve()):
        raise SystemExit(f"measured {measured}, not the fisk_sm of {tree}")
    return report


async def build(state: Path, iterations: int) -> Path:
    """The session, and the messages it folds to (for LangGraph's checkpoint) as JSON."""
    from journal import build_session

    from fisk_sm.journal.filestore import FileStore

    store = FileStore(state)
    path = await build_session(store, RUN_ID, iterations)
    messages = [m.to_json() for m in store.snapshot(RUN_ID).messages]
    out = state.parent / "messages.json"
    out.write_text(json.dumps(messages, ensure_ascii=False))
    return path


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.2f}"


def compare(baseline: str, iterations: int, rounds: int, repeats: int) -> None:
    from compare_overhead import export, working_tree_name

    from fisk_sm.loop.run import loop_machine

    loop_machine()
    with tempfile.TemporaryDirectory(prefix="fisk-sm-resume-") as tmp:
        old_tree, state = Path(tmp) / "old", Path(tmp) / "state" / "sessions"
        old_tree.mkdir()
        names = {"old": export(baseline, old_tree), "new": working_tree_name()}
        session = asyncio.run(build(state, iterations))
        fisk_args = ["--child", "fisk", str(state), str(iterations), str(repeats)]
        samples: dict[tuple[str, str], list[float]] = {}
        graph: dict[str, list[float]] = {}
        for n in range(rounds):  # interleaved, so that drift hits every side alike
            for side, tree in (("old", old_tree), ("new", ROOT)):
                for mode, times in run_child(fisk_args, tree)["samples"].items():
                    samples.setdefault((side, mode), []).extend(times)
            db = Path(tmp) / f"lg-{n}.db"
            messages = str(state.parent / "messages.json")
            report = run_child(["--child", "langgraph", messages, str(db), str(repeats)], ROOT)
            for name, seconds in report.items():
                graph.setdefault(name, []).append(seconds)
        base, size = floor(session, repeats), session.stat().st_size
    print(f"resume of a {iterations}-iteration session ({size / 1e6:.2f} MB), warm page cache")
    print(f"{rounds} rounds of fresh processes, interleaved; {rounds * repeats} samples a figure")
    print(f"old: {names['old']}\nnew: {names['new']}\n")
    print_table(samples, graph, base)


def print_table(
    samples: dict[tuple[str, str], list[float]], graph: dict[str, list[float]], base: float
) -> None:
    """The table: medians, then the best sample (the least disturbed by a busy machine)."""
    lg = {name: (statistics.median(times), min(times)) for name, times in graph.items()}
    file = lg.get(LG_FILE)
    print(f"{'ms: median (best)':<22}{'old':>18} {'new':>18} {'new/old':>8} {'new/get_state':>14}")
    for mode in MODES:
        (old, old_best), (new, new_best) = (
            (statistics.median(samples[side, mode]), min(samples[side, mode]))
            for side in ("old", "new")
        )
        against = f"{new / file[0]:13.2f}×" if file else "   (no langgraph)"
        print(f"{mode:<22}{ms(old)} ({ms(old_best)}) {ms(new)} ({ms(new_best)})", end="")
        print(f" {new / old:7.2f}× {against}")
    for name, (median, best) in lg.items():
        print(f"LangGraph get_state, {name:<34}{ms(median)} ({ms(best)})")
    print(f"floor: split + syntax + UTF-8 {ms(base)}", end="")
    print(f"  ({base / file[0]:.2f}× get_state)" if file else "")
    if file:
        print()
        for mode in (MODES[0], MODES[5], MODES[3], MODES[6]):
            ratio = statistics.median(samples["new", mode]) / file[0]
            best = min(samples["new", mode]) / file[1]
            verdict = "met" if ratio <= TARGET else "MISSED"
            print(f"target: {mode} ≤ {TARGET}× get_state (file): {ratio:.2f}× — {verdict}", end="")
            print(f" (best against best: {best:.2f}×)")
        body = lg.get(LG_FILE + LG_BODY)
        for mode in (MODES[4], MODES[6]) if body else ():  # each side's request built
            ratio = statistics.median(samples["new", mode]) / body[0]
            print(f"{mode} against get_state{LG_BODY} (file): {ratio:.2f}×", end="")
            print(f" (best against best: {min(samples['new', mode]) / body[1]:.2f}×)")
    else:
        print("\nLangGraph: not installed, skipped (pip install -e '.[bench]' to include it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--iterations", type=int, default=1000, help="tool iterations (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="processes a side (3)")
    parser.add_argument("--repeats", type=int, default=7, help="timed samples a process (7)")
    parser.add_argument("--baseline", default="dd8b2d4", help="the revision to compare with")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "fisk":
            report = fisk_child(Path(rest[0]), int(rest[1]), int(rest[2]))
        else:
            report = langgraph_child(Path(rest[0]), Path(rest[1]), int(rest[2]))
        print(json.dumps(report))
        return
    sys.path.insert(0, str(ROOT))
    compare(args.baseline, args.iterations, args.rounds, args.repeats)


if __name__ == "__main__":
    main()

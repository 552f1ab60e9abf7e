"""The full-screen UI's Operate mode with 1,000 runs at 50 events/s: the time from an event's
arrival until the screen shows it, against a bare Textual app in the same run.

Both apps run headless (`App.run_test`, 120×40) in this process, one after the other, on the same
feed: `--runs` runs (default 1,000), listed first, then `--rate` RunUpdated events a second
(default 50) for `--seconds` (default 10), each for a run picked at random (seeded) whose token
total grows and whose state flips, as the supervisor's stream would carry them (the Run JSON,
parsed by `StreamEvent.run()`); no HTTP.

* **operate**: `fisk_sm.tui.operate.OperateApp` reading the feed as its `Control.events()`: each
  event goes into the table's dict and marks its run dirty; the render tick (every 100 ms)
  applies the dirty rows to the DataTable (`RunsTable.flush`).
* **bare**: a `DataTable` of the same rows and columns, whose reader calls `update_cell` on the
  event's row for each event at once: the least a Textual table can do.

What is timed, per event: from the moment the app's reader gets it (the feed stamps
`perf_counter()` as it yields it) until the first frame Textual composes (`App._display` called
with an update: headless, the compositor renders the dirty widgets' lines but writes no
terminal) after the table holds the event's value (or a later one of the same run) in its
tokens cell. Each frame checks the events still waiting. An event whose run's row is off the
screen is "shown" by the next frame all the same (its row is not in it: the table repaints only
the rows in view); the figures for the rows in view at that frame are given apart. Also: the
CPU time of the process over the feed (both apps spend most of it repainting), the frames a
second, and the operate app's time to its first frame with every run listed.

    .venv/bin/python bench/tui_operate.py [--runs N] [--rate R] [--seconds S] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from textual.app import App, ComposeResult  # noqa: E402
from textual.content import Content  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from fisk_sm.client.records import EventsGap, Run, StreamEvent, run_from  # noqa: E402
from fisk_sm.tui.operate import OperateApp  # noqa: E402
from fisk_sm.tui.runs_table import COLUMNS  # noqa: E402

SIZE = (120, 40)
TARGET_MEDIAN = 0.2


def run_json(n: int) -> dict[str, Any]:
    """The API's JSON of run `n` (as RunUpdated carries it)."""
    return {
        "run_id": f"20250101T000000-{n:08x}",
        "name": f"bench run {n}",
        "state": "call",
        "status": "running",
        "iteration": 1,
        "tokens": {"input": 0, "output": 0, "cache_read": 0, "cache_creation": 0, "total": 0},
        "created": f"2025-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}Z",
        "age_seconds": 60.0,
        "approval": None,
        "outcome": None,
        "answer": "",
    }


class Feed:
    """The runs and the events of one measurement, and what the app showed when."""

    def __init__(self, runs: int, rate: float, seconds: float) -> None:
        self.rows = [run_json(n) for n in range(runs)]
        self.rate, self.seconds = rate, seconds
        self.go = asyncio.Event()  # set once the app shows every run
        self.done = asyncio.Event()
        self.waiting: dict[str, list[tuple[int, float]]] = {}  # run id: (total, arrived)
        self.latencies: list[float] = []
        self.in_view: list[float] = []
        self.frames = 0
        self.cpu = 0.0

    def listing(self) -> list[Run]:
        return [run_from(row) for row in self.rows]

    async def events(self) -> AsyncIterator[StreamEvent]:
        """A gap (the app lists the runs), then the events at `rate` a second."""
        yield EventsGap("EventsGap", "b0-1", {}, last_event_id="0-0", reason="bench")
        await self.go.wait()
        rng = random.Random(1)
        count = int(self.rate * self.seconds)
        cpu, start = time.process_time(), time.perf_counter()
        for k in range(count):
            delay = start + k / self.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            row = self.rows[rng.randrange(len(self.rows))]
            row["tokens"]["total"] += 1 + rng.randrange(500)
            row["state"] = "execute" if row["state"] == "call" else "call"
            total = row["tokens"]["total"]
            self.waiting.setdefault(row["run_id"], []).append((total, time.perf_counter()))
            yield StreamEvent("RunUpdated", f"b0-{k + 2}", row)
        await asyncio.sleep(0.5)  # the last events' frames
        self.cpu = time.process_time() - cpu
        self.done.set()

    def frame(self, table: DataTable[Any]) -> None:
        """A frame was composed: the events whose value the table holds are shown now."""
        now = time.perf_counter()
        self.frames += self.go.is_set()
        top = int(table.scroll_y)
        rows = table.size.height - 1  # the header
        for run_id in list(self.waiting):
            total = int(table.get_cell(run_id, "tokens").plain.replace(",", ""))
            pending = self.waiting[run_id]
            shown = [arrived for value, arrived in pending if value <= total]
            if not shown:
                continue
            self.waiting[run_id] = [(v, a) for v, a in pending if v > total]
            if not self.waiting[run_id]:
                del self.waiting[run_id]
            in_view = top <= table.get_row_index(run_id) < top + rows
            for arrived in shown:
                self.latencies.append(now - arrived)
                if in_view:
                    self.in_view.append(now - arrived)


def watch_frames(app: App[Any], on_frame: Callable[[], None]) -> None:
    """Call `on_frame` after each frame `app` composes."""
    display = app._display

    def displayed(screen: Any, renderable: Any) -> None:
        display(screen, renderable)
        if renderable is not None:
            on_frame()

    app._display = displayed  # type: ignore[method-assign]


class FeedControl:
    """The `Control` of the operate app: the feed's runs and events; no requests."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def runs(self) -> list[Run]:
        return self.feed.listing()

    async def run(self, run_id: str) -> Run:
        return run_from(next(r for r in self.feed.rows if r["run_id"] == run_id))

    async def answer(self, run_id: str, tool_use_id: str, answer: str) -> Run:
        raise NotImplementedError

    suspend = resume = abort = run

    def events(
        self, run: str | None = None, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self.feed.events()


class BareApp(App[None]):
    """A DataTable of the runs, each event applied to its row at once."""

    def __init__(self, feed: Feed) -> None:
        super().__init__()
        self.feed = feed

    def compose(self) -> ComposeResult:
        yield DataTable(cursor_type="row")

    def on_mount(self) -> None:
        table: DataTable[Content] = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        for run in self.feed.listing():
            texts = (run.name, run.status, run.state, f"{run.tokens.total:,}", "1m", "")
            table.add_row(*(Content(t) for t in texts), key=run.run_id)
        self.run_worker(self.read())

    async def read(self) -> None:
        table: DataTable[Content] = self.query_one(DataTable)
        async for event in self.feed.events():
            if event.name == "RunUpdated":
                run = event.run()
                table.update_cell(run.run_id, "tokens", Content(f"{run.tokens.total:,}"))
                table.update_cell(run.run_id, "state", Content(run.state))


def summary(feed: Feed, first: float | None = None) -> dict[str, float]:
    def p95(values: list[float]) -> float:
        return statistics.quantiles(values, n=20)[18] if len(values) > 1 else values[0]

    lat, view = feed.latencies or [float("nan")], feed.in_view or [float("nan")]
    figures = {
        "events": float(len(feed.latencies)),
        "unshown": float(sum(len(v) for v in feed.waiting.values())),
        "median": statistics.median(lat),
        "p95": p95(lat),
        "in_view": float(len(feed.in_view)),
        "view_median": statistics.median(view),
        "view_p95": p95(view),
        "frames_s": feed.frames / feed.seconds,
        "cpu": feed.cpu / (feed.seconds + 0.5),
    }
    if first is not None:
        figures["first_frame"] = first
    return figures


async def _operate(runs: int, rate: float, seconds: float) -> dict[str, float]:
    feed = Feed(runs, rate, seconds)
    app = OperateApp(FeedControl(feed))
    start = time.perf_counter()
    first: list[float] = []

    def frame() -> None:
        table = app.table
        if not feed.go.is_set() and table.row_count == runs:
            first.append(time.perf_counter() - start)
            feed.go.set()
        feed.frame(table)

    async with app.run_test(size=SIZE) as pilot:
        watch_frames(app, frame)
        await feed.done.wait()
        await pilot.pause()
    return summary(feed, first[0] if first else None)


async def _bare(runs: int, rate: float, seconds: float) -> dict[str, float]:
    feed = Feed(runs, rate, seconds)
    app = BareApp(feed)

    def frame() -> None:
        table: DataTable[Any] = app.query_one(DataTable)
        if table.row_count == runs:
            feed.go.set()
            feed.frame(table)

    async with app.run_test(size=SIZE) as pilot:
        watch_frames(app, frame)
        await feed.done.wait()
        await pilot.pause()
    return summary(feed)


def operate_figure(
    runs: int = 1000, rate: float = 50.0, seconds: float = 10.0
) -> dict[str, dict[str, float]]:
    """The Operate figure: for "operate" and "bare", the events shown, the median and p95 of
    their arrival-to-frame time (s; all, and the rows in view), frames/s and CPU share."""
    bare = asyncio.run(_bare(runs, rate, seconds))
    operate = asyncio.run(_operate(runs, rate, seconds))
    return {"bare": bare, "operate": operate}


def print_figure(
    figures: dict[str, dict[str, float]], runs: int, rate: float, seconds: float
) -> None:
    """The figure as a table, with the ratio and the target."""
    python, cpus = sys.version.split()[0], os.cpu_count()
    print(f"Python {python}, {cpus} CPUs, Textual headless {SIZE[0]}×{SIZE[1]}; {runs} runs,")
    print(f"{rate:g} RunUpdated events/s for {seconds:g} s; event arrival → first frame after")
    print("the table holds its value (ms); 'in view': events whose row was on the screen")
    print()
    print(
        f"{'':<8} {'events':>6} {'median':>7} {'p95':>7} {'in view':>7} {'median':>7} {'p95':>7}",
        end="",
    )
    print(f" {'frames/s':>8} {'cpu':>5}")
    for name in ("bare", "operate"):
        f = figures[name]
        print(
            f"{name:<8} {f['events']:>6.0f} {f['median'] * 1e3:>7.1f} {f['p95'] * 1e3:>7.1f}",
            end="",
        )
        print(
            f" {f['in_view']:>7.0f} {f['view_median'] * 1e3:>7.1f} {f['view_p95'] * 1e3:>7.1f}",
            end="",
        )
        print(f" {f['frames_s']:>8.1f} {f['cpu']:>5.0%}")
    op, bare = figures["operate"], figures["bare"]
    if "first_frame" in op:
        print(f"operate: first frame with every run listed after {op['first_frame'] * 1e3:.0f} ms")
    unshown = op["unshown"] + bare["unshown"]
    if unshown:
        print(f"never shown: {unshown:.0f} event(s)")
    print(f"ratio operate/bare, median: {op['median'] / bare['median']:.2f}×,", end="")
    print(f" p95: {op['p95'] / bare['p95']:.2f}×, cpu: {op['cpu'] / bare['cpu']:.2f}×")
    verdict = "ok" if op["median"] < TARGET_MEDIAN else "MISSED"
    print(f"target: operate median < {TARGET_MEDIAN * 1e3:.0f} ms: {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="events a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the feed lasts")
    parser.add_argument("--smoke", action="store_true", help="tiny: 50 runs, 20/s, 2 s")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.rate, args.seconds = 50, 20.0, 2.0
    figures = operate_figure(args.runs, args.rate, args.seconds)
    print_figure(figures, args.runs, args.rate, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

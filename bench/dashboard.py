"""The dashboard with 1,000 runs: time to first render and main-thread time per event, for the
dashboard of this tree and for an older one (default: commit ce4b508, before issue 23), in the
same run, against the same supervisor.

A real `fisk-sm supervise` (tests/ctlkit.py's, with a token) runs `--runs` real runs (default
1,000) through the engine against the fake Messages API, each answered at once. Headless
Chromium (Debian's, as in tests/browserkit.py) then opens each dashboard. Both pages are
served the same way: Playwright answers `GET /` with the page assembled by
`fisk_sm.supervisor.api.page.assemble` (the files' CSS and JS put inline) and its
Content-Security-Policy; everything else goes to the supervisor.

* **first render**: from the navigation's start (`performance.now()` = 0) to the first frame
  after the runs table holds every run (a MutationObserver notes when the rows are in, a
  `requestAnimationFrame` + `setTimeout` when that frame is done).
* **per event**: the page open and settled, `--batch` more runs (default 25) are submitted
  over HTTP; each brings a RunSubmitted and RunUpdated events (the Run JSON that the page
  shows in its row), and typed events (StateEntered, MessageReceived...) that both pages log.
  The page's main-thread busy time (the Chrome DevTools Protocol's `Performance.getMetrics`
  TaskDuration) from the first submission until the page shows every new run completed,
  divided by the run events the stream carried (counted by a reader of `/api/events` in this
  process); the wall time per event too (which includes the engine's own time).

Each measurement is repeated `--repeat` times (default 3), the two dashboards alternating; the
table shows the median and the best. Nothing is asserted: the figures are printed, with the
ratio old / new.

    .venv/bin/python bench/dashboard.py [--runs N] [--batch K] [--repeat R] [--old-commit C]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browserkit import chromium_path  # noqa: E402
from ctlkit import DEADLINE, Supervisor, wait_until  # noqa: E402

from fisk_sm.supervisor.api.page import Page, assemble, load_page  # noqa: E402
from fisk_sm.testing import FakeMessagesAPI, Reply  # noqa: E402

TOKEN = "bench-token"
RUN_EVENTS = ("RunSubmitted", "RunUpdated", "RunParked")
#: Notes in the page when the table first holds `want` rows, and when that frame is done.
FIRST_RENDER = """(() => {
  const want = %d;
  const observer = new MutationObserver(() => {
    const body = document.querySelector('#runs tbody');
    if (!body || body.rows.length < want || window.__inDom) return;
    window.__inDom = performance.now();
    observer.disconnect();
    requestAnimationFrame(() => setTimeout(() => { window.__rendered = performance.now(); }));
  });
  observer.observe(document, {childList: true, subtree: true});
})();"""
#: Resolves after two frames: what was queued has been applied and painted.
SETTLED = """() => new Promise(r =>
  requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r))))"""


def old_page(commit: str) -> Page:
    """The dashboard of `commit`, assembled as the server assembles the current one."""

    def show(name: str) -> str:
        # Under supervisor/api/ since issue 24; in supervisor/ itself before.
        for where in ("fisk_sm/supervisor/api", "fisk_sm/supervisor"):
            shown = subprocess.run(
                ["git", "show", f"{commit}:{where}/{name}"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if shown.returncode == 0:
                return shown.stdout
        raise SystemExit(f"{name} is in neither place at commit {commit}: {shown.stderr.strip()}")

    return assemble(show("dashboard.html"), show("dashboard.css"), show("dashboard.js"))


class EventCounter:
    """Reads `/api/events` in a thread and counts the events by name."""

    def __init__(self, url: str) -> None:
        request = urllib.request.Request(
            url + "/api/events", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        self.response = urllib.request.urlopen(request, timeout=DEADLINE)
        self.counts: dict[str, int] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    name = line.partition(":")[2].strip()
                    self.counts[name] = self.counts.get(name, 0) + 1
        # close() from the main thread ends the read midway: http.client then fails in one of
        # these ways, all meaning "closed".
        except (OSError, ValueError, AttributeError):
            return

    def run_events(self) -> int:
        return sum(self.counts.get(n, 0) for n in RUN_EVENTS)

    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        self.response.close()


def submit_many(sup: Supervisor, count: int, prefix: str) -> list[str]:
    with ThreadPoolExecutor(4) as pool:
        return list(
            pool.map(lambda i: sup.submit(f"{prefix} {i}", name=f"{prefix}-{i:04d}"), range(count))
        )


def listed(sup: Supervisor) -> list[dict[str, Any]]:
    status, body = sup.api("GET", "/api/runs")
    assert status == 200, (status, body)
    return list(body["runs"])


class Bench:
    def __init__(self, pw: Any, chromium: str, sup: Supervisor, pages: dict[str, Page]) -> None:
        self.browser = pw.chromium.launch(executable_path=chromium, headless=True)
        self.sup = sup
        self.pages = pages
        self.batches = 0

    def open(self, which: str, rows: int) -> tuple[Any, Any]:
        """A fresh context with the `which` dashboard open, its first render noted."""
        page_of = self.pages[which]
        context = self.browser.new_context(viewport={"width": 1400, "height": 900})
        url = self.sup.url
        context.route(
            re.compile(rf"^{re.escape(url)}/(\?.*)?$"),
            lambda route: route.fulfill(
                status=200,
                headers={
                    "Content-Type": "text/html; charset=utf-8",
                    "Content-Security-Policy": page_of.csp,
                    "Cache-Control": "no-store",
                },
                body=page_of.html,
            ),
        )
        context.add_init_script(FIRST_RENDER % rows)
        page = context.new_page()
        page.set_default_timeout(DEADLINE * 1000)
        page.goto(f"{url}/?token={TOKEN}", wait_until="load")
        page.wait_for_function("() => window.__rendered !== undefined")
        page.locator("#live.on").wait_for()
        return context, page

    def first_render(self, which: str) -> tuple[float, float]:
        """(ms to the rows in the DOM, ms to the frame after), from the navigation's start."""
        rows = len(listed(self.sup))
        context, page = self.open(which, rows)
        in_dom, rendered = page.evaluate("[window.__inDom, window.__rendered]")
        context.close()
        return float(in_dom), float(rendered)

    def per_event(self, which: str) -> tuple[float, float, int]:
        """(main-thread ms per run event, wall ms per run event, run events)."""
        rows = len(listed(self.sup))
        context, page = self.open(which, rows)
        page.evaluate(SETTLED)
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")

        def busy() -> float:
            metrics = cdp.send("Performance.getMetrics")["metrics"]
            return float(next(m["value"] for m in metrics if m["name"] == "TaskDuration"))

        counter = EventCounter(self.sup.url)
        self.batches += 1
        batch = self.args_batch
        busy0, t0 = busy(), time.perf_counter()
        ids = submit_many(self.sup, batch, f"batch{self.batches}")
        done = json.dumps(ids)
        page.wait_for_function(
            f"() => {done}.every(id => {{ const r = document.querySelector("
            "'#runs tbody tr[data-run=\"' + id + '\"]');"
            " return r && r.dataset.status === 'completed'; })",
            polling=50,
        )
        page.evaluate(SETTLED)
        busy1, t1 = busy(), time.perf_counter()
        wait_until(
            lambda: all(r["status"] == "completed" for r in listed(self.sup)), "the batch to end"
        )
        events = counter.run_events()
        counter.close()
        context.close()
        return (busy1 - busy0) * 1000 / events, (t1 - t0) * 1000 / events, events

    args_batch = 25


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):8.2f}  best {min(values):8.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs listed (default 1000)")
    parser.add_argument("--batch", type=int, default=25, help="runs submitted per event phase")
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each (default 3)")
    parser.add_argument("--old-commit", default="ce4b508", help="the older dashboard's commit")
    args = parser.parse_args()
    from playwright import sync_api

    chromium = chromium_path()
    if chromium is None:
        print("bench/dashboard.py: no chromium binary (apt-get install chromium)", file=sys.stderr)
        return 69
    pages = {"old": old_page(args.old_commit), "new": load_page()}
    with (
        tempfile.TemporaryDirectory(prefix="fisk-bench-dash-") as tmp,
        FakeMessagesAPI(responder=lambda body: Reply.text("done")) as api,
        Supervisor(Path(tmp), api, token=TOKEN) as sup,
        sync_api.sync_playwright() as pw,
    ):
        t0 = time.perf_counter()
        submit_many(sup, args.runs, "run")
        wait_until(
            lambda: sum(r["status"] == "completed" for r in listed(sup)) == args.runs,
            f"{args.runs} runs to complete",
            600,
        )
        print(f"{args.runs} real runs through the engine in {time.perf_counter() - t0:.1f} s")
        bench = Bench(pw, chromium, sup, pages)
        bench.args_batch = args.batch
        render: dict[str, list[float]] = {"old": [], "new": []}
        in_dom: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(args.repeat):
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                dom, frame = bench.first_render(which)
                in_dom[which].append(dom)
                render[which].append(frame)
        rows = len(listed(sup))
        busy: dict[str, list[float]] = {"old": [], "new": []}
        wall: dict[str, list[float]] = {"old": [], "new": []}
        counts: list[int] = []
        for i in range(args.repeat):
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                b, w, n = bench.per_event(which)
                busy[which].append(b)
                wall[which].append(w)
                counts.append(n)
        final = len(listed(sup))
    names = {"old": args.old_commit, "new": "this tree"}
    print(f"first render of {rows} runs (ms from the navigation's start)")
    for label, table in (("rows in the DOM", in_dom), ("the frame after (painted)", render)):
        print(f"  {label}")
        for which in ("old", "new"):
            print(f"    {which} ({names[which]}): {summary(table[which])}")
        ratio = statistics.median(table["old"]) / statistics.median(table["new"])
        print(f"    old / new (medians): {ratio:.1f}x")
    print(
        f"per run event ({args.batch} runs submitted per measurement, {min(counts)}-{max(counts)}"
        f" RunSubmitted/RunUpdated/RunParked events each; {rows}-{final} runs listed)"
    )
    for label, table in (("main-thread ms / event", busy), ("wall ms / event", wall)):
        print(f"  {label}")
        for which in ("old", "new"):
            print(f"    {which}: {summary(table[which])}")
        ratio = statistics.median(table["old"]) / statistics.median(table["new"])
        print(f"    old / new (medians): {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

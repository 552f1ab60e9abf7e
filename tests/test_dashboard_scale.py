"""The dashboard with a thousand runs, in a real headless Chromium.

A real `fisk-sm supervise` (a subprocess, with a token) holds 1,000 real runs, submitted over
HTTP and run through the engine against the fake Messages API: 999 answer at once, and one
(`needle`) calls the gated `deploy` tool and parks. Chromium opens the dashboard and the test
checks, as an operator would use it:

- names first: a row's first cell is the run's name, its id the second;
- the status tabs count the runs (999 completed, 1 parked), and a tab shows only its runs;
- the filter box finds the needle by a piece of its name in another case, or by its id;
- the selected run's detail stays in view after the list and the page are scrolled to the
  bottom, and its approval is answered from there: the run completes (the tool really ran);
- an event touches one row only: a MutationObserver in the page records which rows change
  while the needle's approval completes it and while one more run is submitted (the age
  column's clock is left out: it ticks for the rows in view);
- the event stream resumes: the page's connection is cut (a loopback TCP proxy between the
  page and the supervisor) while a run is submitted and parks; the page reconnects with
  `Last-Event-ID` = the last id it read, gets the missed events replayed (the new run's row
  appears parked) and does not reload the listing. With a replay buffer too small for what
  it missed, it gets `EventsGap` and reloads the listing.

A plain `def` on purpose: Playwright's sync API refuses to run inside an event loop.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from browserkit import Watched, artifact, browser_or_skip
from ctlkit import DEADLINE, Supervisor, wait_until

from fisk_sm.testing import FakeMessagesAPI, Reply

TOKEN = "scale-token-456"
RUNS = 1000
NEEDLE = "Needle-Deploy-Prod"
NEEDLE_PROMPT = "deploy to prod, the needle"
#: The rows visible (not hidden by the filter or the tab).
SHOWN_ROWS = "() => [...document.querySelectorAll('#runs tbody tr')].filter(r => !r.hidden).length"
#: Records, per run id, the mutations of the runs table (the age cells' clock left out).
OBSERVE = """() => {
  window.__touched = [];
  window.__added = 0;
  window.__removed = 0;
  const body = document.querySelector('#runs tbody');
  new MutationObserver((records) => {
    for (const m of records) {
      const node = m.target.nodeType === 1 ? m.target : m.target.parentElement;
      if (m.target === body) {  // rows put in or taken out: the rows count as touched
        window.__added += m.addedNodes.length;
        window.__removed += m.removedNodes.length;
        for (const r of [...m.addedNodes, ...m.removedNodes])
          window.__touched.push(r.dataset ? r.dataset.run : '?');
        continue;
      }
      if (!node) {  // a text node taken out since: which row it was in is unknown
        window.__touched.push('(detached ' + m.type + ' ' + m.target.nodeName + ')');
        continue;
      }
      if (node.closest('td.age')) continue;
      const row = node.closest('tr[data-run]');
      window.__touched.push(row ? row.dataset.run : '(table)');
    }
  }).observe(body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""
#: Whether the element `sel` is on screen (within the window's viewport).
IN_VIEW = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
  return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight
    && r.left >= 0 && r.right <= innerWidth; }"""


def _submit_many(sup: Supervisor, count: int) -> list[str]:
    """Submit `count` instantly answered runs named batch-NNNN; their ids."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda i: sup.submit(f"job {i}", name=f"batch-{i:04d}"), range(count)))


def _statuses(sup: Supervisor) -> dict[str, str]:
    status, body = sup.api("GET", "/api/runs")
    assert status == 200, (status, body)
    return {r["run_id"]: r["status"] for r in body["runs"]}


def _open(pw: Any, chromium: str, url: str) -> tuple[Watched, Any]:
    ms = DEADLINE * 1000
    browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=ms)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    watched = Watched(context, url)
    watched.page.set_default_timeout(ms)
    return watched, watched.page


def test_a_thousand_runs_filter_select_approve_and_one_row_per_event(tmp_path: Path) -> None:
    sync_api, chromium = browser_or_skip()
    conversations = {
        NEEDLE_PROMPT: [Reply.tool_use("deploy", {"target": "prod"}), Reply.text("shipped")]
    }
    with (
        FakeMessagesAPI(
            conversations=conversations, responder=lambda body: Reply.text("done")
        ) as api,
        Supervisor(tmp_path, api, token=TOKEN) as sup,
        sync_api.sync_playwright() as pw,
    ):
        ids = _submit_many(sup, 500)
        needle = sup.submit(NEEDLE_PROMPT, name=NEEDLE)
        ids += _submit_many(sup, RUNS - 501)
        wait_until(
            lambda: sorted(_statuses(sup).values()) == ["completed"] * (RUNS - 1) + ["parked"],
            "999 runs completed and the needle parked",
        )
        assert len(api.requests) == RUNS  # every run really asked the model
        watched, page = _open(pw, chromium, sup.url)
        try:
            page.goto(f"{sup.url}/?token={TOKEN}", wait_until="load")
            page.locator("#live.on").wait_for()
            page.wait_for_function(
                f"() => document.querySelectorAll('#runs tbody tr').length === {RUNS}"
            )

            # Names first: the name, then the id.
            assert page.locator("#runs thead th").first.inner_text() == "name"
            row = page.locator(f'#runs tbody tr[data-run="{needle}"]')
            # (textContent: a row off screen is not rendered, so it has no innerText)
            assert row.locator("td").nth(0).text_content() == NEEDLE
            assert row.locator("td").nth(1).text_content() == needle
            assert row.get_attribute("data-status") == "parked"

            # The tabs count, and show only their runs.
            def count(tab: str) -> str:
                return str(page.locator(f'#tabs button[data-tab="{tab}"] .count').inner_text())

            assert (count("all"), count("completed"), count("parked"), count("failed")) == (
                str(RUNS),
                str(RUNS - 1),
                "1",
                "0",
            )
            page.locator('#tabs button[data-tab="parked"]').click()
            page.wait_for_function(f"{SHOWN_ROWS} === 1")
            assert row.is_visible()
            page.locator('#tabs button[data-tab="completed"]').click()
            page.wait_for_function(f"{SHOWN_ROWS} === {RUNS - 1}")
            assert not row.is_visible()
            page.locator('#tabs button[data-tab="all"]').click()
            page.wait_for_function(f"{SHOWN_ROWS} === {RUNS}")

            # The filter: a piece of the name in another case, then a piece of an id.
            page.locator("#filter").fill("needle-DEPLOY")
            page.wait_for_function(f"{SHOWN_ROWS} === 1")
            assert row.is_visible()
            assert count("all") == "1" and count("parked") == "1" and count("completed") == "0"
            other = ids[123]
            page.locator("#filter").fill(other[-10:].upper())
            page.wait_for_function(
                f"() => {SHOWN_ROWS}() === 1"
                f" && !document.querySelector('#runs tbody tr[data-run=\"{other}\"]').hidden"
            )
            page.locator("#filter").fill(NEEDLE.lower())
            page.wait_for_function(f"{SHOWN_ROWS} === 1")

            # Select it; show every run again and scroll the list and the page to their ends:
            # the detail, and its Approve button, stay in view.
            row.click()
            page.locator("#d-name", has_text=NEEDLE).wait_for()
            page.locator("#d-state", has_text="awaiting_approval").wait_for()
            approve = page.locator('#d-approval .approval button[data-answer="once"]')
            approve.wait_for()
            page.locator("#filter").fill("")
            page.wait_for_function(f"{SHOWN_ROWS} === {RUNS}")
            page.evaluate(
                "() => { const l = document.getElementById('list'); l.scrollTop = l.scrollHeight; }"
            )
            page.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
            page.wait_for_function("() => document.getElementById('list').scrollTop > 1000")
            assert page.evaluate(IN_VIEW, "#d-name"), "the detail scrolled away"
            assert page.evaluate(IN_VIEW, '#d-approval button[data-answer="once"]')
            page.screenshot(path=str(artifact("dashboard-scale.png")))

            # Approve from the detail: only the needle's row changes while it completes.
            page.evaluate(OBSERVE)
            approve.click()
            page.locator(f'#runs tbody tr[data-run="{needle}"][data-status="completed"]').wait_for()
            page.locator("#d-answer", has_text="shipped").wait_for()
            assert sup.run(needle)["status"] == "completed"
            assert sup.effects_lines() == ["prod"]
            touched = page.evaluate("window.__touched")
            assert touched and set(touched) == {needle}, sorted(set(touched))[:5]
            assert page.evaluate("[window.__added, window.__removed]") == [0, 0]
            assert count("completed") == str(RUNS) and count("parked") == "0"

            # One more run: one row added, no other row touched.
            page.evaluate("() => { window.__touched = []; }")
            late = sup.submit("one more job", name="late-run")
            page.locator(f'#runs tbody tr[data-run="{late}"][data-status="completed"]').wait_for()
            assert set(page.evaluate("window.__touched")) == {late}
            assert page.evaluate("[window.__added, window.__removed]") == [1, 0]
            assert page.locator("#runs tbody tr").first.get_attribute("data-run") == late
        except Exception:
            page.screenshot(path=str(artifact("dashboard-scale-failed.png")))
            print("console:", *watched.console, sep="\n")
            raise
    assert not watched.errors, watched.errors
    assert not watched.console_errors(), watched.console
    assert not watched.foreign_requests(sup.url), watched.requests


class Proxy:
    """A loopback TCP proxy to the supervisor that can cut every connection and refuse new
    ones (`down`): the page's event stream dropped as a network would drop it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.upstream = 0
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []

    def start(self, upstream_url: str) -> None:
        self.upstream = int(upstream_url.rsplit(":", 1)[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            if self.down.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:  # the other side, or cut(), closed it
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):  # already shut
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every connection going through."""
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):  # already shut by its pump
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.down.set()
        self.listener.close()
        self.cut()


def _away_and_back(tmp_path: Path, buffer: int | None) -> tuple[list[dict[str, str]], int, str]:
    """The page's stream is cut while a gated run is submitted and parks, then let through
    again: the headers of each of the page's event-stream requests, how many more times it
    loaded the listing after the cut, and the page's event log."""
    sync_api, chromium = browser_or_skip()
    prompt = "deploy while the page is away"
    conversations = {prompt: [Reply.tool_use("deploy", {"target": "away"}), Reply.text("ok")]}
    proxy = Proxy()
    args: tuple[str, ...] = ("--allow-host", f"127.0.0.1:{proxy.port}")
    args += ("--event-buffer", str(buffer)) if buffer is not None else ()
    streams: list[dict[str, str]] = []
    listings: list[str] = []
    with (
        FakeMessagesAPI(
            conversations=conversations, responder=lambda body: Reply.text("done")
        ) as api,
        Supervisor(tmp_path, api, token=TOKEN, args=args) as sup,
        sync_api.sync_playwright() as pw,
    ):
        proxy.start(sup.url)
        try:
            _submit_many(sup, 3)
            watched, page = _open(pw, chromium, proxy.url)

            def seen(request: Any) -> None:
                path = request.url.split("?")[0].removeprefix(proxy.url)
                if path == "/api/events":
                    streams.append(request.headers)
                elif path == "/api/runs" and request.method == "GET":
                    listings.append(path)

            page.on("request", seen)
            page.goto(f"{proxy.url}/?token={TOKEN}", wait_until="load")
            page.locator("#live.on").wait_for()
            before = sup.submit("job before the cut", name="before-cut")  # events with ids
            page.locator(f'#runs tbody tr[data-run="{before}"][data-status="completed"]').wait_for()
            wait_until(lambda: len(listings) >= 1, "the first listing")
            loaded = len(listings)

            proxy.down.set()
            proxy.cut()
            page.locator("#live:not(.on)").wait_for()
            away = sup.submit(prompt, name="away-run")
            sup.wait_status(away, "parked")
            assert page.locator(f'#runs tbody tr[data-run="{away}"]').count() == 0
            proxy.down.clear()

            page.locator(f'#runs tbody tr[data-run="{away}"][data-status="parked"]').wait_for()
            page.locator(f'#approvals .approval[data-run="{away}"]').wait_for()
            page.locator("#live.on").wait_for()
            log = page.locator("#events").inner_text()
        finally:
            proxy.close()
        assert not watched.errors, watched.errors
        assert not watched.foreign_requests(proxy.url), watched.requests
    return streams, len(listings) - loaded, log


def test_the_page_resumes_its_event_stream_from_the_last_id(tmp_path: Path) -> None:
    streams, reloads, log = _away_and_back(tmp_path, buffer=None)
    assert "last-event-id" not in streams[0]  # the first connection
    resumed = streams[-1].get("last-event-id", "")
    assert re.fullmatch(r"[0-9a-f]+-[0-9]+", resumed), streams[-1]
    assert streams[-1]["authorization"] == f"Bearer {TOKEN}"  # the token in a header
    assert reloads == 0, "the page reloaded the listing instead of resuming"
    assert "EventsGap" not in log


def test_after_a_gap_the_page_reloads_the_listing(tmp_path: Path) -> None:
    streams, reloads, log = _away_and_back(tmp_path, buffer=4)
    assert re.fullmatch(r"[0-9a-f]+-[0-9]+", streams[-1].get("last-event-id", ""))
    assert "EventsGap" in log
    assert reloads >= 1

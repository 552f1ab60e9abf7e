"""A hostile page on another loopback port cannot drive the supervisor through Chromium.

A real `fisk-sm supervise` without a token (loopback: what a developer leaves running) has two
runs parked on their `deploy` approvals. A page served from another port of 127.0.0.1 (a
stdlib http.server in a thread: another origin, the same site) tries what a page can do
without reading the answers: `fetch` with `mode: 'no-cors'` and a `text/plain` JSON body (no
preflight), plain HTML forms (enctype text/plain, crafted to carry JSON, and urlencoded),
auto-submitted into hidden frames, and a CORS `fetch` with application/json (preflighted). It
tries to submit a run, approve a parked deploy and abort the other run, and it frames the
dashboard. Chromium sent each of the seven simple POSTs and got an answer (a 403 the test sees,
or one Chromium then withheld from the page: Cross-Origin-Resource-Policy, frame-ancestors);
the CORS fetch never left (its preflight got 405). And nothing happened: no new run, the
journals' bytes unchanged, both runs still parked on the same approvals, the model never asked
about the attacker's prompts, the tool never ran. The framed dashboard shows nothing
(frame-ancestors 'none', X-Frame-Options DENY).

The control: the same three actions from the API's own origin (`fetch` on the dashboard page,
application/json, what the dashboard itself sends) succeed; the dashboard, loaded, logs no
Content-Security-Policy violation and shows a run's diagram.

On the code before issue 11 the attack worked: the attacker's approval got a 200 (the API
parsed any body as JSON and checked no Origin). Without the Origin and JSON-only checks, or
without frame-ancestors and X-Frame-Options, this fails.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from browserkit import artifact, browser_or_skip
from ctlkit import DEADLINE, Supervisor, wait_until

from fisk_sm.testing import FakeMessagesAPI, Reply

PROMPTS = {"approve": "deploy to prod, attacked", "abort": "deploy to stage, attacked"}
EVIL = ("evil fetch", "evil form", "evil cors")

ATTACK = """<!doctype html><meta charset=utf-8><title>cat pictures</title>
<iframe id=dash name=dash src="{api}/" width=800 height=400></iframe>
<iframe name=sink1></iframe><iframe name=sink2></iframe><iframe name=sink3></iframe>
<iframe name=sink4></iframe>
<form id=f1 method=post action="{api}/api/runs" enctype="text/plain" target=sink1>
  <input type=hidden name='{{"prompt": "evil form", "pad": "' value='"}}'></form>
<form id=f2 method=post action="{approve}" enctype="text/plain" target=sink2>
  <input type=hidden name='{{"answer": "once", "pad": "' value='"}}'></form>
<form id=f3 method=post action="{approve}" target=sink3>
  <input type=hidden name=answer value=once></form>
<form id=f4 method=post action="{abort}" enctype="text/plain" target=sink4>
  <input type=hidden name='{{"pad": "' value='"}}'></form>
<script>
  const plain = (url, body) => fetch(url, {{method: "POST", mode: "no-cors",
    headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify(body)}});
  window.attack = Promise.allSettled([
    plain("{api}/api/runs", {{prompt: "evil fetch"}}),
    plain("{approve}", {{answer: "once"}}),
    plain("{abort}", {{}}),
    fetch("{api}/api/runs", {{method: "POST", headers: {{"Content-Type": "application/json"}},
      body: JSON.stringify({{prompt: "evil cors"}})}}),
  ]).then((all) => all.map((r) => r.status));
</script>
"""

#: Records `securitypolicyviolation` events in every frame, before any script of the page.
CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


@contextmanager
def serve_page(html: str) -> Iterator[str]:
    """Serve `html` at / from a thread on 127.0.0.1 (a free port); its origin."""
    page = html.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _journals(sup: Supervisor) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(sup.state.glob("*.json"))}


def _state(sup: Supervisor) -> list[tuple[str, str, str]]:
    status, body = sup.api("GET", "/api/runs")
    assert status == 200
    return sorted((r["run_id"], r["status"], json.dumps(r["approval"])) for r in body["runs"])


def test_a_page_of_another_origin_cannot_submit_approve_abort_or_frame(tmp_path: Path) -> None:
    sync_api, chromium = browser_or_skip()
    conversations = {
        PROMPTS["approve"]: [Reply.tool_use("deploy", {"target": "prod"}), Reply.text("shipped")],
        PROMPTS["abort"]: [Reply.tool_use("deploy", {"target": "stage"}), Reply.text("shipped")],
        "control": [Reply.text("fine")],
    }
    ms = DEADLINE * 1000
    with (
        FakeMessagesAPI(conversations=conversations) as api,
        Supervisor(tmp_path, api) as sup,
        sync_api.sync_playwright() as pw,
    ):
        ids = {k: sup.submit(p) for k, p in PROMPTS.items()}
        tool_use = {
            k: sup.wait_status(i, "parked")["approval"]["tool_use_id"] for k, i in ids.items()
        }
        approve = f"{sup.url}/api/runs/{ids['approve']}/approvals/{tool_use['approve']}"
        abort = f"{sup.url}/api/runs/{ids['abort']}/abort"
        before, journals = _state(sup), _journals(sup)

        browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=ms)
        context = browser.new_context()
        context.add_init_script(CSP_WATCH)
        context.set_default_timeout(ms)
        # How each request ended: the status of its answer, and why the browser then dropped
        # it, if it did ("net::ERR_BLOCKED_BY_RESPONSE...": the answer came, and its headers
        # kept it from the page).
        ends: dict[Any, list[int | str | None]] = {}
        console: list[str] = []
        html = ATTACK.format(api=sup.url, approve=approve, abort=abort)
        with serve_page(html) as attacker:
            page = context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("response", lambda r: ends.setdefault(r.request, []).append(r.status))
            page.on("requestfailed", lambda r: ends.setdefault(r, []).append(r.failure))
            page.goto(attacker + "/", wait_until="load")
            outcomes = page.evaluate("window.attack")
            page.evaluate("for (const form of document.forms) form.submit()")
            posts = lambda: [(r.url, e) for r, e in ends.items() if r.method == "POST"]  # noqa: E731
            # (page.evaluate lets Playwright deliver the events it has queued)
            wait_until(lambda: page.evaluate("1") and len(posts()) >= 8, "the POSTs to end")
            page.screenshot(path=str(artifact("csrf-attacker.png")), full_page=True)
            dash = page.frame(name="dash")
            assert dash is not None
            framed = dash.url, _frame_text(dash)
        # The 3 no-cors fetches and the 4 forms were sent and answered; the CORS fetch's
        # preflight was refused (405), so its POST never left. The answers were refusals
        # (403: a foreign Origin) or dropped unread (CORP, frame-ancestors): either way,
        # nothing happened (below).
        answered = [
            (url, e)
            for url, e in posts()
            if e[0] in (403, 415) or str(e[0]).startswith("net::ERR_BLOCKED_BY_RESPONSE")
        ]
        assert len(answered) == 7, posts()
        assert {url for url, _ in answered} == {f"{sup.url}/api/runs", approve, abort}, answered
        assert (f"{sup.url}/api/runs", ["net::ERR_FAILED"]) in posts(), posts()
        assert outcomes == ["rejected"] * 4, outcomes  # not even an opaque answer (CORP)
        # The framed dashboard was fetched, and not shown.
        framing = [e for r, e in ends.items() if r.method == "GET" and r.url == f"{sup.url}/"]
        assert framing == [[200, "net::ERR_BLOCKED_BY_RESPONSE"]], framing
        assert "fisk-sm supervisor" not in framed[1] and framed[0] != f"{sup.url}/", framed
        # Nothing happened.
        assert _state(sup) == before
        assert _journals(sup) == journals
        assert sup.effects_lines() == []
        assert all(api.requests_for(p) == [] for p in EVIL)

        # The control: the same actions from the API's own origin, as the dashboard sends them.
        page = context.new_page()
        mine: list[str] = []
        missing: list[str] = []
        page.on("console", lambda m: mine.append(f"{m.type}: {m.text}"))
        page.on("response", lambda r: r.status == 404 and missing.append(r.url))
        page.goto(f"{sup.url}/", wait_until="load")
        page.locator("#live.on").wait_for()
        statuses = page.evaluate(
            """async ([approve, abort]) => {
                const json = {"Content-Type": "application/json"};
                const post = async (url, body) => (await fetch(url,
                  {method: "POST", headers: json, body: JSON.stringify(body)})).status;
                return [await post("/api/runs", {prompt: "control"}),
                        await post(approve, {answer: "once"}), await post(abort, {})];
            }""",
            [approve, abort],
        )
        assert statuses == [201, 200, 202], statuses
        wait_until(lambda: sup.effects_lines() == ["prod"], "the approved deploy to run")
        sup.wait_status(ids["abort"], "aborted")
        control = next(r for r in _state(sup) if r[0] not in ids.values())
        sup.wait_status(control[0], "completed")
        # The dashboard shows a run's diagram, with no CSP violation on the way.
        page.locator(f'#runs tbody tr[data-run="{ids["approve"]}"]').click()
        page.wait_for_function(
            "() => { const i = document.getElementById('diagram');"
            " return !i.hidden && i.complete && i.naturalWidth > 100; }"
        )
        page.screenshot(path=str(artifact("csrf-control.png")), full_page=True)
        violations = page.evaluate("window.__csp")
    assert violations == [], violations
    assert not [m for m in mine if "Content Security Policy" in m], mine
    # Chromium asks for /favicon.ico on its own (a 404, logged as an error): nothing else.
    assert set(missing) <= {f"{sup.url}/favicon.ico"}, missing
    assert not [m for m in mine if m.startswith("error") and "404" not in m], mine


def _frame_text(frame: Any) -> str:
    """The text a frame shows; "" when the browser refused to show it (an error page whose
    document the test may not read)."""
    try:
        return str(frame.evaluate("document.documentElement.innerText"))
    except Exception:  # a refused frame: an opaque chrome-error:// document
        return ""

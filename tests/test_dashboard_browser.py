"""The dashboard in a real headless Chromium: clicking Approve completes a parked run.

A real `fisk-sm supervise` (a subprocess, with a token) drives runs against the fake Messages
API; its one gated tool (`ai:confirm`) parks each run until an operator answers. Chromium opens
`/?token=T`; the runs are submitted over HTTP only after the page has loaded, so what the page
shows comes from its live event stream. The test waits until the dashboard shows the pending
approval, opens the run (its diagram and transcript), clicks Approve and checks that the run
completes: in the page, through the API, and in the tool's side-effect file. A second run is
denied from the page. The page must log no console error, make no request off the
supervisor's origin, and show a hostile run name as text. Screenshots are kept as artifacts
(tests/artifacts/dashboard-parked.png and dashboard.png, or under $FISK_SM_ARTIFACTS).

A plain `def` on purpose: Playwright's sync API refuses to run inside an event loop.
"""

from __future__ import annotations

import json
from pathlib import Path

from browserkit import Watched, artifact, browser_or_skip
from ctlkit import DEADLINE, Supervisor, wait_until

from fisk_sm.testing import FakeMessagesAPI, Reply

TOKEN = "dash-token-123"
#: A run name that would run script if the page inserted it as HTML.
HOSTILE_NAME = '<img src="/x-hostile" onerror="document.title=\'pwned\'">deploy'


def test_clicking_approve_on_the_dashboard_completes_a_parked_run(tmp_path: Path) -> None:
    sync_api, chromium = browser_or_skip()
    prompts = {"approve": "deploy to prod from the dashboard", "deny": "deploy to moon, denied"}
    conversations = {
        prompts["approve"]: [Reply.tool_use("deploy", {"target": "prod"}), Reply.text("shipped")],
        prompts["deny"]: [Reply.tool_use("deploy", {"target": "moon"}), Reply.text("not sent")],
    }
    ms = DEADLINE * 1000
    with (
        FakeMessagesAPI(conversations=conversations) as api,
        Supervisor(tmp_path, api, token=TOKEN) as sup,
        sync_api.sync_playwright() as pw,
    ):
        # (sync_playwright's exit closes the browser whatever happens)
        browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=ms)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        watched = Watched(context, sup.url)
        page = watched.page
        page.set_default_timeout(ms)
        try:
            response = page.goto(f"{sup.url}/?token={TOKEN}", wait_until="load")
            assert response is not None and response.ok
            page.locator("#live.on").wait_for()  # the event stream is connected
            assert page.locator("#runs tbody tr").count() == 0

            # Submitted after the page loaded: the row and its approval come over the stream.
            run_id = sup.submit(prompts["approve"], name=HOSTILE_NAME)
            row = page.locator(f'#runs tbody tr[data-run="{run_id}"]')
            once = page.locator(
                f'#approvals .approval[data-run="{run_id}"] button[data-answer="once"]'
            )
            once.wait_for()
            assert row.get_attribute("data-status") == "parked"
            assert row.locator("td.name").inner_text() == HOSTILE_NAME  # as text, not markup
            assert page.locator("img[src='/x-hostile']").count() == 0
            card = page.locator(f'#approvals .approval[data-run="{run_id}"]')
            assert "wants to call deploy" in card.inner_text()
            assert json.loads(card.locator("pre").inner_text()) == {"target": "prod"}
            assert sup.effects_lines() == []

            # The run's detail: diagram with the run's path, current state, transcript tail.
            row.click()
            page.locator("#d-state", has_text="awaiting_approval").wait_for()
            page.wait_for_function(
                "() => { const i = document.getElementById('diagram');"
                " return !i.hidden && i.complete && i.naturalWidth > 100; }"
            )
            path = page.locator("#d-path").inner_text()
            assert path.startswith("suspend_check") and path.endswith("awaiting_approval")
            assert page.locator("#d-path .current").inner_text() == "awaiting_approval"
            assert "tool_use deploy" in page.locator("#transcript").inner_text()
            page.screenshot(path=str(artifact("dashboard-parked.png")), full_page=True)

            once.click()
            page.locator(f'#runs tbody tr[data-run="{run_id}"][data-status="completed"]').wait_for()
            page.locator("#d-status", has_text="completed").wait_for()
            page.locator("#d-answer", has_text="shipped").wait_for()
            page.locator("#transcript", has_text="deployed to prod").wait_for()
            assert page.locator("#d-path .current").inner_text() == "completed"
            assert page.locator(f'#approvals .approval[data-run="{run_id}"]').count() == 0
            assert sup.run(run_id)["status"] == "completed"
            assert sup.run(run_id)["answer"] == "shipped"
            assert sup.effects_lines() == ["prod"]

            # Deny from the page: the tool never runs, the model is told.
            denied = sup.submit(prompts["deny"])
            deny = page.locator(
                f'#approvals .approval[data-run="{denied}"] button[data-answer="deny"]'
            )
            deny.click()
            page.locator(f'#runs tbody tr[data-run="{denied}"][data-status="completed"]').wait_for()
            wait_until(lambda: sup.run(denied)["answer"] == "not sent", "the denied run's answer")
            assert sup.effects_lines() == ["prod"]
            result = api.requests_for(prompts["deny"])[-1]["messages"][-1]["content"][0]
            assert '"allowed": false' in json.dumps(result["content"]).replace('\\"', '"')

            shot = artifact("dashboard.png")
            page.screenshot(path=str(shot), full_page=True)
            assert page.title() == "fisk-sm supervisor"
        except Exception:  # what the page showed when it failed, for the CI artifacts
            page.screenshot(path=str(artifact("dashboard-failed.png")), full_page=True)
            print("page requests:", *watched.requests, "console:", *watched.console, sep="\n")
            raise

    print(f"dashboard screenshots: {shot.parent}")
    assert shot.stat().st_size > 10_000
    assert not watched.errors, watched.errors
    assert not watched.console_errors(), watched.console
    assert not watched.foreign_requests(sup.url), watched.requests
    assert not [u for u in watched.requests if "x-hostile" in u], watched.requests

"""Hostile text in every field the dashboard shows: shown as text, never run, never raw controls.

A real `fisk-sm supervise` runs against the fake Messages API; everything the page shows that a
user, a model or a tool chose carries the same hostile string: markup that would run script if
inserted as HTML (`<img onerror>`, `<script>`), a tag, and characters that would hide or
reorder what the operator reads (U+202E RIGHT-TO-LEFT OVERRIDE and the other bidi controls, ESC,
BEL, NEL; zero-width joiners are fine and not tested). The fields: the run's name, the prompt
(the transcript's first entry), the model's text before its tool call, the tool call's input
(the approval card and the transcript), the tool's output, the model's answer, a failed run's
outcome (the model API's error message), and the event log. (Tool names are identifiers from
the config, the states the machine's own, and the error box shows the API's own messages: no
free text there.) Chromium opens the dashboard, the runs are submitted after it loaded (so the
event stream carries them), the approval is granted from the page, and each run's detail is
opened.

No script ran (`window.__pwned` unset, no dialog, no request for the hostile image, one
`<script>` in the document), no element came from the text, the markup shows as literal text,
and no control or bidi character reaches the page's text raw (the page shows each as a
\\uXXXX escape).

Before issue 11 the page showed every one of them raw (this failed on U+202E in the runs
table); putting innerHTML back in the page's `el()` fails it on the approval card.
"""

from __future__ import annotations

import re
from pathlib import Path

from browserkit import Watched, artifact, browser_or_skip
from ctlkit import DEADLINE, Supervisor

from fisk_sm.testing import FakeMessagesAPI, Reply

MARKUP = '<img src="/x-hostile" onerror="window.__pwned=1"><script>window.__pwned=2</script>'
TAG = "<b id=injected>bold</b>"
CONTROLS = "\u202eevil\u202c \u2066iso\u2069 \u200f \x1b[31m \x07 \x85"
HOSTILE = f"{MARKUP}{TAG} {CONTROLS} end"
#: What must never reach the page's text raw: C0 (but tab and newline), DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The containers of everything the page shows from the server.
SHOWN = ["#runs", "#approvals", "#detail", "#events", "#error", "#summary"]


def _raw_controls(page: object) -> list[str]:
    found = []
    for selector in SHOWN:
        text = page.locator(selector).text_content() or ""  # type: ignore[attr-defined]
        found += [f"{selector}: U+{ord(c):04X}" for c in RAW.findall(text)]
    return found


def test_hostile_text_in_every_field_is_shown_as_text(tmp_path: Path) -> None:
    sync_api, chromium = browser_or_skip()
    prompt = f"deploy {HOSTILE}"
    failing = f"fail {HOSTILE}"
    conversations = {
        prompt: [
            Reply.tool_use("deploy", {"target": HOSTILE}, text=f"I will {HOSTILE}"),
            Reply.text(f"answer {HOSTILE}"),
        ],
        failing: [Reply.error(400, f"bad request {HOSTILE}")],
    }
    ms = DEADLINE * 1000
    dialogs: list[str] = []
    with (
        FakeMessagesAPI(conversations=conversations) as api,
        Supervisor(tmp_path, api) as sup,
        sync_api.sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=ms)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        watched = Watched(context, sup.url)
        page = watched.page
        page.set_default_timeout(ms)
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        try:
            page.goto(f"{sup.url}/", wait_until="load")
            page.locator("#live.on").wait_for()
            run_id = sup.submit(prompt, name=f"name {HOSTILE}")
            failed = sup.submit(failing, name=f"failing {HOSTILE}")
            card = page.locator(f'#approvals .approval[data-run="{run_id}"]')
            card.wait_for()
            assert "<img" in card.locator("pre").inner_text()  # the tool's input, as text
            assert _raw_controls(page) == []
            card.locator('button[data-answer="once"]').click()
            page.locator(f'#runs tbody tr[data-run="{run_id}"][data-status="completed"]').wait_for()
            page.locator(f'#runs tbody tr[data-run="{failed}"][data-status="failed"]').wait_for()

            page.locator(f'#runs tbody tr[data-run="{run_id}"]').click()
            page.locator("#d-answer", has_text="answer <img").wait_for()
            page.locator("#transcript", has_text="deployed to <img").wait_for()
            assert page.locator("#d-name").inner_text().startswith(f"name {MARKUP}{TAG}")
            transcript = page.locator("#transcript").inner_text()
            for shown in (f"deploy {MARKUP}", f"I will {MARKUP}", f"deployed to {MARKUP}"):
                assert shown in transcript, (shown, transcript)
            assert _raw_controls(page) == []
            page.screenshot(path=str(artifact("dashboard-hostile.png")), full_page=True)

            page.locator(f'#runs tbody tr[data-run="{failed}"]').click()
            page.locator("#d-status", has_text="failed").wait_for()
            page.locator("#d-name", has_text="failing <img").wait_for()
            outcome = page.locator("#d-outcome").inner_text()
            assert "<img" in outcome, outcome  # the model API's error, as text
            assert "<img" in page.locator("#events").inner_text()  # the event log too
            assert _raw_controls(page) == []

            assert page.evaluate("window.__pwned") is None
            assert page.evaluate("document.scripts.length") == 1
            assert page.locator("#injected, img[src='/x-hostile']").count() == 0
        except Exception:
            page.screenshot(path=str(artifact("dashboard-hostile-failed.png")), full_page=True)
            raise
    # (read whole: the string holds NEL, which splitlines() would split on)
    assert sup.effects.read_text(encoding="utf-8") == HOSTILE + "\n"
    assert dialogs == []
    assert not watched.errors, watched.errors
    assert not [u for u in watched.requests if "x-hostile" in u], watched.requests
    assert not watched.foreign_requests(sup.url), watched.requests

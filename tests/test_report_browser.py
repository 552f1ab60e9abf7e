"""`fisk-sm report` in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

A session with two tool turns is recorded with the real CLI against the fake Messages API, and
`fisk-sm report` writes its page. Chromium opens the page from file:// and the test checks that
it logs no console error or page error, makes no request but the page's own, draws every state
of the machine in the SVG, and shows each tool call (name and input) in the transcript. The
full-page screenshot is kept at tests/artifacts/report.png (ignored by git).

Playwright cannot download its own browser here, so it drives the system `chromium` through
`executable_path`; `.ci/run` installs that package. Without it (or without playwright) the test
skips with the reason, listed by `-ra`.

The test is a plain `def` on purpose: Playwright's sync API refuses to run inside an event loop,
and pytest-asyncio (auto mode) would run an `async def` test in one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browserkit import chromium_path

from fisk_sm.config.states import STATE_NAMES
from fisk_sm.testing import FakeMessagesAPI, Reply

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CLI = [sys.executable, "-m", "fisk_sm.cli"]
TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def shout(text: str) -> str:
    """Say text louder."""
    return text.upper()
'''
#: The two tool calls the session makes, in order: (tool name, input).
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("add", {"a": 17, "b": 25}),
    ("shout", {"text": "fisk <b>sm</b> & co"}),  # HTML in the input must show as text
]


def fisk(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `fisk-sm` command, as a subprocess."""
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)


def record_and_report(tmp_path: Path) -> Path:
    """Record session `rec` (two tool turns, then an answer) and write its report; the page."""
    (tmp_path / "report_tools.py").write_text(TOOLS)
    state = tmp_path / "state"
    script = [Reply.tool_use(name, args) for name, args in CALLS] + [Reply.text("42, FISK")]
    with FakeMessagesAPI(script) as api:
        agent = tmp_path / "agent.yaml"
        agent.write_text(
            "system_prompt: You use tools.\n"
            f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
            "tools: [{python: 'report_tools:add'}, {python: 'report_tools:shout'}]\n"
        )
        where = ["--state-dir", str(state)]
        recorded = fisk("run", "-c", str(agent), "--checkpoint", "--name", "rec", *where, "go")
        assert recorded.returncode == 0, recorded.stderr
        assert len(api.requests) == 3
    page = tmp_path / "report.html"
    reported = fisk("report", "rec", "-o", str(page), *where)
    assert reported.returncode == 0, reported.stderr
    return page


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    try:
        from playwright import sync_api
    except ImportError as e:  # not installed, or installed broken: skip, and say why
        pytest.skip(f"playwright is not importable ({e}); pip install -e '.[dev]'")
    browser_path = chromium_path()
    if browser_path is None:
        pytest.skip("no chromium binary (apt-get install chromium, or set $FISK_SM_CHROMIUM)")

    page_file = record_and_report(tmp_path)
    url = page_file.as_uri()
    console: list[str] = []
    errors: list[str] = []
    requests: list[str] = []
    shot = ARTIFACTS / "report.png"
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, timeout=60_000)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            # Anything but a file:// URL is refused at once (and still recorded as a request),
            # so a page that reaches out fails here rather than hanging on a network that
            # is not there.
            context.route(re.compile(r"^(?!file:)"), lambda route: route.abort())
            page = context.new_page()
            page.set_default_timeout(30_000)
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.on("request", lambda r: requests.append(r.url))
            response = page.goto(url, wait_until="load")
            assert response is None or response.ok
            page.wait_for_load_state("networkidle")

            assert page.title() == "fisk-sm session rec"
            # Every state of the machine has its node in the rendered SVG, labelled by name.
            svg = page.locator(".diagram svg")
            assert svg.count() == 1
            box = svg.bounding_box()
            assert box is not None and box["width"] > 100 and box["height"] > 100, box
            for name in STATE_NAMES:
                node = svg.locator(f"#state_{name}")
                assert node.count() == 1, f"state {name} is not in the rendered SVG"
                assert node.is_visible(), f"state {name} is not drawn"
                assert (node.locator("text").first.text_content() or "").startswith(name)
            # ...and no other state (the one node without a state id is the start dot).
            assert svg.locator("g.node[id^='state_']").count() == len(STATE_NAMES)
            assert "×2" in (svg.locator("#state_execute").text_content() or "")

            # The transcript shows each tool call: its summary is on screen, and unfolding it
            # shows its input, as escaped text.
            summaries = page.locator("details > summary", has_text=re.compile(r"^tool call "))
            assert summaries.count() == len(CALLS)
            for n, (name, args) in enumerate(CALLS):
                summary = summaries.nth(n)
                assert summary.is_visible()
                assert summary.inner_text().startswith(f"tool call {name} (toolu_")
                body = summary.locator("xpath=..").locator("pre")
                assert not body.is_visible()  # folded until opened
                summary.click()
                assert body.is_visible()
                assert json.loads(body.inner_text()) == args
            results = page.locator("details > summary", has_text=re.compile(r"^result of "))
            assert results.count() == len(CALLS)
            for n, expected in enumerate(["42", "FISK <B>SM</B> & CO"]):
                results.nth(n).click()
                assert expected in results.nth(n).locator("xpath=..").inner_text()
            assert page.locator(".turn.assistant p", has_text="42, FISK").is_visible()

            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    print(f"report screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert not errors, errors
    assert not [m for m in console if m.startswith("error:")], console
    assert requests == [url], requests

"""The full-screen UI's test kit: settling an app and comparing its screen with a snapshot.

A snapshot is Textual's own `App.export_screenshot()` SVG, compared byte for byte with the file
committed under tests/snapshots/tui/. `pytest --update-tui-snapshots` rewrites the files
instead (look at them before committing). On a mismatch the screen actually drawn is written
next to the test's tmp files and named in the failure, to be opened in a browser. Snapshots are
deterministic: the apps turn the cursor blink off, the tests wait for the workers and for the
screen to settle, the size is fixed, and Textual is pinned to one version (pyproject.toml).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.app import App
from textual.pilot import Pilot

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "tui"
#: The SVG window chrome's own colours: drawn around every screenshot, even with NO_COLOR.
CHROME = frozenset({"#ff5f57", "#febc2e", "#28c840"})


async def settle(pilot: Pilot[object]) -> None:
    """Let the app finish what it is doing: its workers, then the messages they posted, then
    a repaint."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def colours(svg: str) -> set[str]:
    """The colours a screenshot's cells use (the window chrome's left out)."""
    return {c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}\b", svg)} - CHROME


def check_snapshot(app: App[object], name: str, config: pytest.Config, tmp: Path) -> str:
    """Compare `app`'s screen with tests/snapshots/tui/`name`.svg (or rewrite it, with
    `--update-tui-snapshots`); returns the SVG."""
    svg = app.export_screenshot(title=name)
    path = SNAPSHOTS / f"{name}.svg"
    if config.getoption("--update-tui-snapshots"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        return svg
    if not path.exists():
        pytest.fail(f"no snapshot {path}: run pytest --update-tui-snapshots and look at it")
    if path.read_text(encoding="utf-8") != svg:
        actual = tmp / f"{name}.actual.svg"
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"the screen differs from {path}; it drew {actual}")
    return svg

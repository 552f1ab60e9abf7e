"""The full-screen UI's test kit: settling an app and comparing its screen with a snapshot.

A snapshot is Textual's own `App.export_screenshot()` SVG, compared byte for byte with the file
committed under tests/snapshots/tui/. `pytest --update-tui-snapshots` rewrites the files
instead (look at them before committing). On a mismatch the screen actually drawn is written
next to the test's tmp files and named in the failure, to be opened in a browser. Snapshots are
deterministic: the apps turn the cursor blink off, the tests wait for the workers and for the
screen to settle, the size is fixed, and Textual is pinned to one version (pyproject.toml).
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from textual.app import App
from textual.message import Message
from textual.pilot import Pilot
from textual.screen import Screen

from fisk_sm.config.agent import load_config
from fisk_sm.tui import command
from fisk_sm.tui.app import LoopApp
from fisk_sm.tui.command import add_tui_parser

M = TypeVar("M", bound=Message)

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "tui"
#: The SVG window chrome's own colours, drawn around every screenshot even with NO_COLOR: its
#: three buttons, and its title's and the default text's (the export theme's foreground).
CHROME = frozenset({"#ff5f57", "#febc2e", "#28c840", "#c5c8c6"})


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


def tui_args(*argv: str) -> argparse.Namespace:
    """`fisk-sm tui ARGV` parsed, as the command line parses it."""
    parser = argparse.ArgumentParser(prog="fisk-sm")
    add_tui_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["tui", *argv])


@contextlib.asynccontextmanager
async def local_app(*argv: str) -> AsyncIterator[LoopApp]:
    """The app `fisk-sm tui ARGV` builds (its runs opened within the block), checked as the
    command checks its flags; NO_COLOR is left as the test set it."""
    args = tui_args(*argv)
    command._check(args)
    config = load_config(args.config)
    async with contextlib.AsyncExitStack() as stack:
        yield command.app_for(args, config, stack)


def messages_of(kind: type[M], seen: list[Message]) -> list[M]:
    """The messages of one kind the app handled (`run_test(message_hook=seen.append)`), each
    once (a bubbling message is handled by each widget it reaches)."""
    return list({id(m): m for m in seen if isinstance(m, kind)}.values())


async def wait_for(pilot: Pilot[object], probe: Callable[[], object], what: str) -> None:
    """Pause until `probe()` holds (messages handled, screen settled), failing after a while
    with `what`: the app works off the test's own event loop, so the test must yield to it."""
    for _ in range(600):
        if probe():
            return
        await pilot.pause(0.05)
    pytest.fail(f"timed out waiting for {what}")


async def dialog(pilot: Pilot[object], kind: type[Screen[object]], what: str) -> Screen[object]:
    """Wait for a dialog of `kind` to be on screen, composed and mounted (its keys line drawn,
    its focus set), so that what the test reads or types reaches it; the dialog."""
    app = pilot.app

    def ready() -> bool:
        screen = app.screen
        return isinstance(screen, kind) and screen.is_mounted and bool(screen.query(".keys"))

    await wait_for(pilot, ready, what)
    await pilot.pause()
    return app.screen

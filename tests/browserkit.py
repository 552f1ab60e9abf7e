"""Headless Chromium for the browser tests: Debian's `chromium`, driven by Playwright.

Playwright cannot download its own browser here, so it drives the system binary through
`executable_path` (`.ci/run` installs the package). `browser_or_skip()` skips the test, saying
why, when playwright or the binary is missing; with $FISK_SM_REQUIRE_CHROMIUM set (`.ci/run`
sets it), it fails instead, so the browser tests cannot quietly skip in CI. `Watched` records
what a page did: console messages, page errors, failed requests and every URL it requested,
with anything off the allowed origin refused at once (so a page that reaches out fails the test
rather than hanging on a network that is not there). Screenshots go to $FISK_SM_ARTIFACTS,
else tests/artifacts/.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, NoReturn

import pytest

__all__ = ["Watched", "artifact", "browser_or_skip", "chromium_path"]


def chromium_path() -> str | None:
    """The system Chromium: $FISK_SM_CHROMIUM, else `chromium` (Debian) on PATH."""
    named = os.environ.get("FISK_SM_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def artifact(name: str) -> Path:
    """Where to keep an artifact called `name` (its directory created)."""
    where = Path(os.environ.get("FISK_SM_ARTIFACTS") or Path(__file__).parent / "artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where / name


REQUIRE = "FISK_SM_REQUIRE_CHROMIUM"


def _missing(why: str) -> NoReturn:
    """Skip the test for `why`; fail it instead when $FISK_SM_REQUIRE_CHROMIUM is set."""
    if os.environ.get(REQUIRE):
        pytest.fail(f"{why}, and ${REQUIRE} is set: the browser tests must run", pytrace=False)
    pytest.skip(why)


def browser_or_skip() -> tuple[Any, str]:
    """Playwright's sync API module and the Chromium binary; skips the test without them (fails
    it with $FISK_SM_REQUIRE_CHROMIUM set)."""
    try:
        from playwright import sync_api
    except ImportError as e:  # not installed, or installed broken: skip, and say why
        _missing(f"playwright is not importable ({e}); pip install -e '.[dev]'")
    path = chromium_path()
    if path is None:
        _missing("no chromium binary (apt-get install chromium, or set $FISK_SM_CHROMIUM)")
    return sync_api, path


class Watched:
    """A page's console, errors and requests; requests off `origin` are aborted."""

    def __init__(self, context: Any, origin: str) -> None:
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        allowed = re.escape(origin.rstrip("/"))
        # blob: URLs are the page's own (a fetched image shown through URL.createObjectURL).
        context.route(re.compile(rf"^(?!{allowed}/|{allowed}$|blob:)"), lambda r: r.abort())
        self.page = context.new_page()
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def console_errors(self) -> list[str]:
        """The console messages of type error."""
        return [m for m in self.console if m.startswith("error:")]

    def foreign_requests(self, origin: str) -> list[str]:
        """The requested URLs that are not on `origin` (nor the page's own blobs)."""
        base = origin.rstrip("/")
        return [
            u
            for u in self.requests
            if not (u == base or u.startswith(base + "/") or u.startswith(f"blob:{base}/"))
        ]

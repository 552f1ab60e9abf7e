"""The dashboard page: `dashboard.html` with `dashboard.css` and the script files (`SCRIPTS`, in
that order, joined into one script) put inline, and the Content-Security-Policy that allows
exactly that style and that script (by their SHA-256), nothing inline else.

No `'unsafe-inline'`: markup that a run's text smuggled into the page could not run script or
style. The diagram is an `<img>` of a `blob:` URL (fetched with the token, which an `<img src>`
cannot send), so `img-src` allows `blob:`.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import attrs

__all__ = ["DASHBOARD", "PLACEHOLDER", "SCRIPTS", "Page", "assemble", "load_page"]

HERE = Path(__file__).parent
DASHBOARD = HERE / "dashboard.html"
PLACEHOLDER = (
    "<!doctype html><meta charset=utf-8><title>fisk-sm supervisor</title>"
    "<p>The dashboard is not installed; the API is at <code>/api/runs</code>.</p>"
)
STYLE_MARK = "<style>/*dashboard.css*/</style>"
SCRIPT_MARK = "<script>/*dashboard.js*/</script>"
#: The dashboard's script files, joined in this order into the page's one inline <script> (one
#: script, one hash in the policy). The first makes the namespace (`fisk`) that the others fill;
#: dashboard.js, the page's wiring, runs last, when all of it is there.
SCRIPTS = (
    "dashboard_dom.js",
    "dashboard_stream.js",
    "dashboard_view.js",
    "dashboard_detail.js",
    "dashboard.js",
)


@attrs.frozen
class Page:
    """The page's HTML and its Content-Security-Policy."""

    html: str
    csp: str


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode() + "'"


def policy(style: str, script: str) -> str:
    """The page's Content-Security-Policy, allowing the inline `style` and `script` only."""
    return (
        f"default-src 'none'; script-src {_hash(script)}; style-src {_hash(style)};"
        " img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none';"
        " frame-ancestors 'none'"
    )


def load_page() -> Page:
    """The assembled page (blocking: reads the package's files); the placeholder without them."""
    try:
        html = DASHBOARD.read_text(encoding="utf-8")
        style = (HERE / "dashboard.css").read_text(encoding="utf-8")
        scripts = [(HERE / name).read_text(encoding="utf-8") for name in SCRIPTS]
    except FileNotFoundError:
        return Page(PLACEHOLDER, policy("", ""))
    for name, text in zip(SCRIPTS, scripts, strict=True):
        if "</script" in text.lower():  # named here; assemble() checks the whole script too
            raise ValueError(f"{name} holds a closing tag")
    return assemble(html, style, "\n".join(scripts))


def assemble(html: str, style: str, script: str) -> Page:
    """The page of `html` with `style` and `script` (one script: the `SCRIPTS` joined, or an
    older dashboard's one dashboard.js, as bench/dashboard.py serves it) put in at their marks,
    and its policy."""
    if "</" in style or "</script" in script.lower():  # would end the element early
        raise ValueError("dashboard.css or the dashboard script holds a closing tag")
    page = html.replace(STYLE_MARK, f"<style>{style}</style>")
    page = page.replace(SCRIPT_MARK, f"<script>{script}</script>")
    return Page(page, policy(style, script))

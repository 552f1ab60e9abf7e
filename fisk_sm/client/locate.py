"""Where the supervisor is, and its token: found the same way by `fisk-sm ctl` and by
`fisk_sm.client` (standard library only, cheap to import).

The URL: the one given, else `$FISK_SM_URL`, else the URL `fisk-sm supervise` wrote to
`supervisor.url` in the default sessions directory (`$XDG_STATE_HOME/fisk-sm/runs`), else
http://127.0.0.1:8765. The token: the one given, else `$FISK_SM_TOKEN`, else none.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_URL",
    "TOKEN_ENV",
    "URL_ENV",
    "default_token",
    "default_url",
    "token_problem",
    "url_problem",
]

DEFAULT_URL = "http://127.0.0.1:8765"
URL_ENV = "FISK_SM_URL"
TOKEN_ENV = "FISK_SM_TOKEN"


def default_url(env: Mapping[str, str] | None = None) -> str:
    """`$FISK_SM_URL`, else the URL in the default sessions directory's `supervisor.url`
    (`$XDG_STATE_HOME/fisk-sm/runs`), else 127.0.0.1:8765."""
    env = os.environ if env is None else env
    if env.get(URL_ENV):
        return env[URL_ENV]
    from fisk_sm.journal.statedir import default_directory

    try:  # where `supervise` writes it with the default sessions directory
        written = (default_directory(env) / "supervisor.url").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        written = ""
    return written.strip() or DEFAULT_URL


def default_token(env: Mapping[str, str] | None = None) -> str | None:
    """`$FISK_SM_TOKEN` (stripped), or None when it is unset or blank."""
    env = os.environ if env is None else env
    return env.get(TOKEN_ENV, "").strip() or None


def url_problem(url: str) -> str | None:
    """Why `url` is not a supervisor's URL (one line, without the field's name), or None."""
    import urllib.parse

    from fisk_sm.operator.sanitize import sanitize

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {sanitize(url, 200)}"
    try:
        parts.port  # noqa: B018 - the property validates the port
    except ValueError:
        return f"bad port in {sanitize(url, 200)}"
    return None


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a bearer token (one line, without the field's name), or None."""
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in token):
        return "only printable ASCII without spaces is allowed"
    return None

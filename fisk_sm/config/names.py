"""The names and addresses fisk-sm checks, in one place: crash policies, identities, tool names,
NATS subjects, which environment variables are secrets, and which API base URLs are allowed.

Every rule here is used by more than one module (the config loader, the tools, the remote host);
keeping one copy means agent.yaml and `serve_tools` can never disagree about what is valid.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from fisk_sm.config.errors import show

__all__ = [
    "ALWAYS_STRIPPED_PREFIX",
    "CRASH_POLICIES",
    "IDENTITY_RE",
    "SUBJECT_RE",
    "TOOL_NAME_RE",
    "always_stripped_env_name",
    "base_url_problem",
    "check_base_url",
    "crash_policy_problem",
    "identity_problem",
    "pass_env_problem",
    "secret_env_name",
    "subject_problem",
]

#: What happens on resume to a tool that was running when the process died.
CRASH_POLICIES = ("retry", "fail", "ask")
#: An agent identity or a remote host's alias.
IDENTITY_RE = re.compile(r"[a-zA-Z0-9_-]+")
#: A tool name, as the Messages API accepts it.
TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
#: A NATS subject without wildcards: dot-separated tokens of letters, digits, '_' and '-'.
SUBJECT_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")

#: Variables whose name starts with this (in any case) never reach a tool, not even by pass_env.
ALWAYS_STRIPPED_PREFIX = "ANTHROPIC_"
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME_RE = re.compile(r"^AWS_|_SECRET|_(?:TOKEN|KEY|PASSWORD)$", re.IGNORECASE)


def identity_problem(value: str) -> str | None:
    """Why ``value`` is not an identity or an alias (`IDENTITY_RE`), or None if it is one."""
    return None if IDENTITY_RE.fullmatch(value) else f"must match [a-zA-Z0-9_-]+, got {show(value)}"


def crash_policy_problem(value: str) -> str | None:
    """Why ``value`` is not one of the `CRASH_POLICIES`, or None if it is one."""
    if value in CRASH_POLICIES:
        return None
    return f"must be one of {CRASH_POLICIES}, got {show(value)}"


def subject_problem(value: str) -> str | None:
    """Why ``value`` is not a NATS subject without wildcards (`SUBJECT_RE`), or None."""
    if SUBJECT_RE.fullmatch(value):
        return None
    return f"not a NATS subject without wildcards: {show(value)}"


def always_stripped_env_name(name: str) -> bool:
    """Whether the variable is an ``ANTHROPIC_*`` one, kept from every tool without exception."""
    return name.upper().startswith(ALWAYS_STRIPPED_PREFIX)


def secret_env_name(name: str) -> bool:
    """Whether a variable of this name is kept from a tool's environment by default.

    That is ``ANTHROPIC_*`` and, unless the tool lists the name in ``pass_env``, names that look
    like credentials: ``*_TOKEN``, ``*_SECRET*``, ``*_KEY``, ``*_PASSWORD`` and ``AWS_*`` (in
    any case).
    """
    return always_stripped_env_name(name) or _SECRET_NAME_RE.search(name) is not None


def pass_env_problem(name: str) -> str | None:
    """Why ``name`` cannot be listed in a tool's ``pass_env``, or None if it can."""
    if not _ENV_NAME_RE.fullmatch(name):
        return f"must be a variable name ({_ENV_NAME_RE.pattern}), got {name!r}"
    if always_stripped_env_name(name):
        return f"{name} is never passed to a tool (no {ALWAYS_STRIPPED_PREFIX}* variable is)"
    return None


def base_url_problem(url: str | None) -> str | None:
    """`check_base_url` for an optional URL: None (no URL given) is fine."""
    return None if url is None else check_base_url(url)


def check_base_url(url: str) -> str | None:
    """Return why ``url`` is not an acceptable API base URL, or ``None`` if it is fine.

    ``https://`` is allowed for any host; ``http://`` only for ``localhost``, 127.0.0.0/8
    and ``[::1]``. Credentials, other schemes, and URLs without a host are refused.
    """
    if any(ch.isspace() or not ch.isprintable() for ch in url) or "\\" in url:
        return "must not contain whitespace, control characters or backslashes"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _ = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return f"scheme must be https (or http for localhost), got {scheme or 'none'!r}"
    if "@" in parts.netloc:
        return "must not contain credentials (user:password@)"
    if not host:
        return "has no host"
    if scheme == "http" and host != "localhost" and not _is_loopback_ip(host):
        return f"http:// is only allowed for localhost, 127.0.0.0/8 or [::1], not {host!r}"
    return None


def _is_loopback_ip(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback if addr.version == 4 else addr == ipaddress.IPv6Address("::1")

"""Two pretend tools for the supervisor example: they only note what they did in deploys.log."""

from __future__ import annotations

from pathlib import Path

LOG = Path(__file__).with_name("deploys.log")


def check(site: str) -> str:
    """Check that a site builds.

    Args:
        site: the site's name
    """
    return f"{site}: builds cleanly"


def deploy(site: str) -> str:
    """Deploy a site (gated: an operator approves every call).

    Args:
        site: the site's name
    """
    with LOG.open("a") as log:
        log.write(site + "\n")
    return f"{site}: deployed"

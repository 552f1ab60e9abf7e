"""Tools from elsewhere (remote tool hosts, MCP servers): the names they take in the run.

A foreign tool keeps its bare name unless a local tool has taken it or more than one source
offers it; then it becomes `<alias>_<bare>`. A collision that still remains, or a name the
Messages API would refuse, is an error of the caller's type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import attrs

from fisk_sm.config.names import TOOL_NAME_RE
from fisk_sm.tools.base import ToolLoadError

__all__ = ["Offered", "local_names"]


@attrs.frozen
class Offered:
    """One tool a source offers: the source's alias, the tool's bare name, and how messages
    name the pair (`tool 'x' of remote tool host 'ops' (tools.ops)`)."""

    alias: str
    name: str
    source: str


def local_names(
    offers: Sequence[Offered], taken: Collection[str], error: type[ToolLoadError]
) -> list[str]:
    """The name each offer is registered under; `error` if two would still collide."""
    sources_offering = Counter(o.name for o in offers)
    names = [
        f"{o.alias}_{o.name}" if o.name in taken or sources_offering[o.name] > 1 else o.name
        for o in offers
    ]
    claimed: dict[str, Offered] = {}
    for offer, name in zip(offers, names, strict=True):
        if not TOOL_NAME_RE.fullmatch(name):
            raise error(f"{offer.source} would be named {name!r}, longer than 64 characters")
        if name in taken:
            raise error(f"{offer.source} would be named {name!r}, which a local tool has")
        if name in claimed:
            raise error(f"{offer.source} would be named {name!r}, like {claimed[name].source}")
        claimed[name] = offer
    return names

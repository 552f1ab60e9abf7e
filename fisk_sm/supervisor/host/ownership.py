"""`Ownership`: what a host asks of whoever decides which process drives a run.

`FileOwnership` is a lone host's (or a worker's): the registry (runs.jsonl) says what a restart
resumes, and the session's own lock (`<id>.lock`, an flock the kernel drops when its holder
dies) keeps a second process from driving a run. A NATS member owns runs by lease instead
(`fisk_sm.supervisor.host.leased.LeaseHolder`, until the cluster is a part of its own).
"""

from __future__ import annotations

from typing import Protocol

from fisk_sm.loop.run import Run
from fisk_sm.supervisor.host.registry import RegistryEntry, RunRegistry
from fisk_sm.supervisor.view.tracked import Tracked

__all__ = ["FileOwnership", "Ownership"]


class Ownership(Protocol):
    """Who drives which run."""

    @property
    def registry(self) -> RunRegistry:
        """Where submissions and dispositions are recorded."""
        ...

    async def take(self, entry: RegistryEntry) -> bool:
        """Whether this host may start or resume the run now."""
        ...

    async def give_up(self, tracked: Tracked, run: Run) -> None:
        """The task driving `run` ended here."""
        ...

    def refused(self, tracked: Tracked, exc: Exception) -> bool:
        """Whether `exc` (a step raised it) means the run was lost, not that it failed."""
        ...


class FileOwnership:
    """Runs owned through `registry` and the sessions' locks: whatever this host holds."""

    def __init__(self, registry: RunRegistry) -> None:
        self.registry = registry

    async def take(self, entry: RegistryEntry) -> bool:
        return True

    async def give_up(self, tracked: Tracked, run: Run) -> None:
        return None

    def refused(self, tracked: Tracked, exc: Exception) -> bool:
        return False

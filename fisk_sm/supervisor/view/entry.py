"""A run as the supervisor's registry knows it (`RegistryEntry`), and the dispositions that
decide what a restart does with it (`fisk_sm.supervisor.host.registry` keeps them durably; a
run's row shows its name and whether an operator suspended or aborted it)."""

from __future__ import annotations

import attrs

__all__ = [
    "ABORTED",
    "DISPOSITIONS",
    "OPERATOR_SUSPENDED",
    "RESUMABLE",
    "RESUMED",
    "SHUTDOWN_SUSPENDED",
    "SUBMITTED",
    "RegistryEntry",
]

SUBMITTED = "submitted"
OPERATOR_SUSPENDED = "operator_suspended"
RESUMED = "resumed"
ABORTED = "aborted"
SHUTDOWN_SUSPENDED = "shutdown_suspended"
DISPOSITIONS = (SUBMITTED, OPERATOR_SUSPENDED, RESUMED, ABORTED, SHUTDOWN_SUSPENDED)
#: The dispositions after which a restart resumes the run (if its journal allows).
RESUMABLE = frozenset({SUBMITTED, RESUMED, SHUTDOWN_SUSPENDED})


@attrs.frozen
class RegistryEntry:
    """A run as the registry knows it: who it is and its last disposition."""

    run_id: str
    name: str
    config: str
    created: float
    disposition: str = SUBMITTED

    @property
    def resumable(self) -> bool:
        """Whether a restart resumes it (unless its journal ended or waits for an answer)."""
        return self.disposition in RESUMABLE

"""The supervisor: many checkpointed runs on one event loop, an approval desk, and the HTTP
control API (`fisk-sm supervise`)."""

from fisk_sm.supervisor.desk import ApprovalDesk, DeskPrompter, PendingApproval
from fisk_sm.supervisor.registry import Registry, RegistryEntry
from fisk_sm.supervisor.supervisor import Conflict, NotFound, Supervisor
from fisk_sm.supervisor.view.hub import EventHub
from fisk_sm.supervisor.view.tracked import Tracked

__all__ = [
    "ApprovalDesk",
    "Conflict",
    "DeskPrompter",
    "EventHub",
    "NotFound",
    "PendingApproval",
    "Registry",
    "RegistryEntry",
    "Supervisor",
    "Tracked",
]

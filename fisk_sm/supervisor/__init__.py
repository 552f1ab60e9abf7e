"""The supervisor: many checkpointed runs, their approval desk, and the HTTP control API
(`fisk-sm supervise`).

A request walks down, never back up:
  api/        HTTP only: checks the request, calls a HostControl (interface.py), shapes the JSON.
  host/       implements HostControl: LocalControl (host/control.py) over the Host that drives
              the runs in this process (host/host.py: slots, parking at the desk, suspend, resume,
              shutdown, adopt), which owns them through host/ownership.py (the registry and the
              sessions' locks). A NATS member is a plain Host given parts (host/cluster_setup.py:
              host/leased.py owns by lease, host/intake.py pulls the work queue).
  view/       the read model the host keeps (view/book.py's RunBook): each run's row, listings,
              the event hub; view/cluster_rows.py: the rows of other members' runs.
  cluster/    NATS parts the host uses: the work queue, the leases, the approvals mirror.
Events go up only as data: a run's sink -> view/hub.py -> the API's stream. interface.py,
errors.py and confine.py are shared by every part; tests/test_layers.py holds the order.
Importing this package is cheap: each name below is imported when first looked up.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from fisk_sm.supervisor.errors import Conflict, NotFound
    from fisk_sm.supervisor.host.desk import ApprovalDesk, DeskPrompter, PendingApproval
    from fisk_sm.supervisor.host.host import Host, Supervisor
    from fisk_sm.supervisor.host.registry import Registry, RegistryEntry
    from fisk_sm.supervisor.view.hub import EventHub
    from fisk_sm.supervisor.view.tracked import Tracked

_EXPORTS = {
    "Conflict": "fisk_sm.supervisor.errors",
    "NotFound": "fisk_sm.supervisor.errors",
    "ApprovalDesk": "fisk_sm.supervisor.host.desk",
    "DeskPrompter": "fisk_sm.supervisor.host.desk",
    "PendingApproval": "fisk_sm.supervisor.host.desk",
    "Host": "fisk_sm.supervisor.host.host",
    "Supervisor": "fisk_sm.supervisor.host.host",
    "Registry": "fisk_sm.supervisor.host.registry",
    "RegistryEntry": "fisk_sm.supervisor.host.registry",
    "EventHub": "fisk_sm.supervisor.view.hub",
    "Tracked": "fisk_sm.supervisor.view.tracked",
}
__all__ = [
    "ApprovalDesk",
    "Conflict",
    "DeskPrompter",
    "EventHub",
    "Host",
    "NotFound",
    "PendingApproval",
    "Registry",
    "RegistryEntry",
    "Supervisor",
    "Tracked",
]
__getattr__, __dir__ = exports(__name__, _EXPORTS)

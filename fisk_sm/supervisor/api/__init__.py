"""The supervisor's HTTP side, and HTTP only: the control API (`app`), its defences (`security`,
`methods`, `bodies`), the server it runs under (`server`), the OpenAPI document (`openapi`,
`openapi_schemas`) and the dashboard page (`page`, with `dashboard.*`). Nothing else in the
supervisor imports it (tests/test_layers.py). Importing this package is cheap: the web stack
is imported with the first name looked up.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from fisk_sm.supervisor.api.app import MAX_BODY, ControlApp, build_app

_EXPORTS = {
    "MAX_BODY": "fisk_sm.supervisor.api.app",
    "ControlApp": "fisk_sm.supervisor.api.app",
    "build_app": "fisk_sm.supervisor.api.app",
}
__all__ = ["MAX_BODY", "ControlApp", "build_app"]
__getattr__, __dir__ = exports(__name__, _EXPORTS)

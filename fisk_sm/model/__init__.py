"""The model adapter: one Messages API call under a deadline, every reply validated.

Its public names are imported on first use (PEP 562): importing the package costs nothing.
"""

from __future__ import annotations

from fisk_sm.config.lazy import exports

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the real imports, for type checkers and IDEs; never run
    from fisk_sm.model.anthropic import AnthropicModel, ModelClient, ModelRequest
    from fisk_sm.model.blocks import Message
    from fisk_sm.model.reply import ModelError

_EXPORTS = {
    "AnthropicModel": "fisk_sm.model.anthropic",
    "ModelClient": "fisk_sm.model.anthropic",
    "ModelRequest": "fisk_sm.model.anthropic",
    "ModelError": "fisk_sm.model.reply",
    "Message": "fisk_sm.model.blocks",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "AnthropicModel",
    "Message",
    "ModelClient",
    "ModelError",
    "ModelRequest",
]

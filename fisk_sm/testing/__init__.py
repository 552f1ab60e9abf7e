"""A loopback fake of the Anthropic Messages API, for fisk_sm's tests and for yours."""

from fisk_sm.testing.script import Reply, ScriptError, load_script
from fisk_sm.testing.server import FakeMessagesAPI, serve

__all__ = ["FakeMessagesAPI", "Reply", "ScriptError", "load_script", "serve"]

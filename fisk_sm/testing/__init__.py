"""A loopback fake of the Anthropic Messages API, for fisk_sm's tests and for yours."""

from fisk_sm.testing.conversations import Turn, first_user_text, tool_turns, turn_of
from fisk_sm.testing.script import Reply, ScriptError, ScriptFile, load_script, load_script_file
from fisk_sm.testing.server import FakeMessagesAPI, Responder, serve

__all__ = [
    "FakeMessagesAPI",
    "Reply",
    "Responder",
    "ScriptError",
    "ScriptFile",
    "Turn",
    "first_user_text",
    "load_script",
    "load_script_file",
    "serve",
    "tool_turns",
    "turn_of",
]

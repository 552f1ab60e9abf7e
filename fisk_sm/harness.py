"""The infrastructure of a run: everything rebuilt from config on every start or resume.

A `Harness` holds what a run uses but does not own as data: the model client, the tool box, the
journal, the event sink and the system blocks. Keeping it apart from `RunData` is what makes a
run resumable: the data is persisted, the harness is rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fisk_sm.config import AgentConfig
from fisk_sm.events import Events, Recorder
from fisk_sm.journal import Journal, MemoryJournal
from fisk_sm.llm import AnthropicModel, ModelClient, ModelRequest, build_request
from fisk_sm.tools import Tool, ToolBox, load_tool

__all__ = ["Harness"]


def _never() -> bool:
    return False


@attrs.define
class Harness:
    """What a run needs besides its data."""

    config: AgentConfig
    model: ModelClient
    tools: ToolBox
    journal: Journal
    events: Events
    should_suspend: Callable[[], bool] = _never
    system: tuple[dict[str, Any], ...] = ()
    tool_definitions: tuple[dict[str, Any], ...] = ()

    @classmethod
    def build(
        cls,
        config: AgentConfig,
        *,
        model: ModelClient | None = None,
        tools: Iterable[Tool] = (),
        journal: Journal | None = None,
        events: Events | None = None,
        should_suspend: Callable[[], bool] = _never,
    ) -> Harness:
        """Build from config: tools named in agent.yaml first, then `tools` given in code."""
        loaded = [load_tool(t.python, config.base_dir, t.crash_policy) for t in config.tools]
        box = ToolBox.of([*loaded, *tools])
        system = ({"type": "text", "text": config.system_prompt},) if config.system_prompt else ()
        return cls(
            config=config,
            model=model or AnthropicModel(config.llm),
            tools=box,
            journal=journal if journal is not None else MemoryJournal(),
            events=events if events is not None else Recorder(),
            should_suspend=should_suspend,
            system=system,
            tool_definitions=tuple(box.definitions),
        )

    def request(self, messages: list[dict[str, Any]]) -> ModelRequest:
        """The next model request over `messages`."""
        return build_request(self.config.llm, self.system, self.tool_definitions, messages)

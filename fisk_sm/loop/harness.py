"""The infrastructure of a run: everything rebuilt from config on every start or resume.

A `Harness` holds what a run uses but does not own as data: the model client, the tool box, the
confirm gate, the journal, the event sink and the system blocks. Keeping it apart from `RunData`
is what makes a run resumable: the data is persisted, the harness is rebuilt.

Tools come from agent.yaml (Python functions and exec commands), from code, and from the
built-ins that the harness block enables (the ask_human_* and memory_* tools); then the tool
selection keeps those offered to the model. `system` is fingerprinted; `context` (the memory
index, the resume reminder) is sent after it but may change between a run and its resume.

What a caller hands in rather than have built from config (a model, more tools, a journal, an
event sink, a suspend source, a prompter) travels as one frozen `RunOptions` record, through
`Run.create`, `Harness.build`, `start_session` and `resume_session` alike.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from fisk_sm.config.agent import AgentConfig, ConfigError, ToolSpec
from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.events.types import Events, Recorder
from fisk_sm.journal.base import Journal, MemoryJournal
from fisk_sm.model.anthropic import AnthropicModel, ModelClient, ModelRequest, build_request
from fisk_sm.model.blocks import Message
from fisk_sm.operator.prompter import NoOperator, Prompter
from fisk_sm.tools.base import Tool, ToolBox, ToolLoadError, load_tool
from fisk_sm.tools.gate import Gate
from fisk_sm.tools.hitl import HITL_NOTE, hitl_tools

# The exec and memory tools are imported when agent.yaml configures them, not with the core:
# the exec tool's process machinery (the reaper, ctypes, secrets, shlex) alone costs some 10 ms.
if TYPE_CHECKING:
    from fisk_sm.tools.mcp import McpServers
    from fisk_sm.tools.memory import MemoryStore
    from fisk_sm.tools.memory_kv import KVMemoryStore
    from fisk_sm.tools.memory_tools import MemoryBackend

__all__ = ["Harness", "NoModel", "RunOptions", "configured_tools"]


def _never() -> bool:
    return False


def _text(text: str) -> JSONObject:
    return {"type": "text", "text": text}


def configured_tools(config: AgentConfig) -> list[Tool]:
    """The tools agent.yaml declares, in order: Python functions and exec commands.

    A Python tool that cannot be imported (a syntax error, an exception or `sys.exit` at import,
    a missing module or function) is a `ConfigError` naming agent.yaml and `tools[N]`.
    """
    tools = []
    for index, spec in enumerate(config.tools):
        if isinstance(spec, ToolSpec):
            try:
                loaded = load_tool(
                    spec.python, config.base_dir, spec.crash_policy, spec.tags, spec.limits
                )
            except ToolLoadError as exc:
                source = str(config.path) if config.path is not None else "<config>"
                raise ConfigError(source, f"tools[{index}].python", str(exc)) from None
            tools.append(loaded)
        else:
            from fisk_sm.tools.exec import exec_tool

            tools.append(exec_tool(spec, work_dir=config.work_dir))
    return tools


def _gate_warnings(gate: Gate, offered: Sequence[Tool]) -> list[tuple[str, str, str]]:
    """Gated tools that nobody can approve, and confirm tags that no tool carries."""
    warnings = []
    gated = gate.gated_tools(offered)
    if gated and not gate.prompter.available:
        warnings.append(("confirm_no_terminal", ", ".join(gated), f"{len(gated)} gated"))
    warnings += [("confirm_tag_unmatched", tag, "") for tag in gate.unmatched_tags(offered)]
    return warnings


def _check_mcp_sdk(config: AgentConfig) -> None:
    """`mcp_servers` without the `mcp` SDK is a `ConfigError` (found without importing it)."""
    if config.mcp_servers and importlib.util.find_spec("mcp") is None:
        source = str(config.path) if config.path is not None else "<config>"
        problem = "needs the mcp SDK, which is not installed: pip install 'fisk-sm[mcp]'"
        raise ConfigError(source, "mcp_servers", problem)


def _tool_tuple(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(tools)


@attrs.frozen
class RunOptions:
    """The infrastructure a run is handed instead of building it from config; all optional.

    - `model`: answers the model calls (default: `AnthropicModel(config.llm)`, which the run
      then owns and releases when it is closed);
    - `tools`: tools given in code, offered after agent.yaml's;
    - `journal`: where the records go (default: in memory; `start_session` and
      `resume_session` open the session's file journal and refuse one given here);
    - `events`: the event sink (default: a `Recorder`);
    - `should_suspend`: polled at every loop boundary (default: never);
    - `prompter`: answers the confirm gate and the ask_human_* tools (default: nobody, so
      gated tools are denied).
    """

    model: ModelClient | None = None
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tool_tuple)
    journal: Journal | None = None
    events: Events | None = None
    should_suspend: Callable[[], bool] | None = None
    prompter: Prompter | None = None


class NoModel:
    """A model for a harness that never calls one (`fisk-sm info`, listing a run's tools):
    building it needs no SDK client."""

    async def create(self, request: ModelRequest) -> JSONObject:
        """Refuse: nothing built with it may call the model."""
        raise RuntimeError("this harness was built without a model")


#: Where the jetstream memory backend looks for NATS without `options.url`, after $NATS_URL.
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def memory_store(config: AgentConfig) -> MemoryStore | KVMemoryStore:
    """The memory store of `config`'s identity and backend; builds no connection (a KV store
    connects on its first operation). `jetstream` without nats-py is a `ConfigError`."""
    from fisk_sm.tools.memory import MemoryStore, default_memory_directory

    memory = config.harness.memory
    if memory.backend == "file":
        directory = config.memory_directory or default_memory_directory(config.identity)
        return MemoryStore(directory)
    try:
        from fisk_sm.tools.memory_kv import KVMemoryStore
    except ImportError:
        source = str(config.path) if config.path is not None else "<config>"
        raise ConfigError(
            source,
            "harness.memory.backend",
            "jetstream needs nats-py, which is not installed: pip install 'fisk-sm[nats]'",
        ) from None
    options = memory.options
    url = options.url or os.environ.get("NATS_URL") or DEFAULT_NATS_URL
    require_read = not options.no_require_read_before_update
    return KVMemoryStore(url, options.bucket, config.identity, require_read=require_read)


@attrs.define
class Harness:
    """What a run needs besides its data."""

    config: AgentConfig
    model: ModelClient
    tools: ToolBox
    journal: Journal
    events: Events
    gate: Gate = attrs.field(factory=lambda: Gate(NoOperator()))
    should_suspend: Callable[[], bool] = _never
    system: tuple[JSONObject, ...] = ()
    context: tuple[JSONObject, ...] = ()
    tool_definitions: tuple[JSONObject, ...] = ()
    warnings: tuple[tuple[str, str, str], ...] = ()
    #: Whether the model was built here (so the run releases it), not handed in.
    owns_model: bool = False
    #: A memory store that holds a connection (JetStream), released with the harness.
    memory: MemoryBackend | None = None
    #: The memory index still to fetch (`prepare`): building never waits on the network.
    index_pending: bool = False
    #: The MCP servers of agent.yaml, once started (`start_mcp_servers`), released with it.
    mcp: McpServers | None = None
    #: Whether the MCP servers are still to start: building never starts a process.
    mcp_pending: bool = False

    @classmethod
    def build(cls, config: AgentConfig, options: RunOptions | None = None) -> Harness:
        """Build from config and `options`: agent.yaml's tools, then `options.tools`, then
        built-ins; what `options` leaves out is built from config (see `RunOptions`)."""
        options = options or RunOptions()
        prompter = options.prompter or NoOperator()
        harness = config.harness
        _check_mcp_sdk(config)
        candidates = [*configured_tools(config), *options.tools]
        system = [_text(config.system_prompt)] if config.system_prompt else []
        context = []
        warnings: list[tuple[str, str, str]] = []
        remote_memory: MemoryBackend | None = None
        if harness.human_in_the_loop.enabled:
            candidates += hitl_tools(prompter)
            system.append(_text(HITL_NOTE))
            if not prompter.available:
                warnings.append(("hitl_no_terminal", "", "nobody can answer ask_human_* tools"))
        if harness.memory.enabled:
            from fisk_sm.tools.memory import MEMORY_NOTE, MemoryStore, memory_index
            from fisk_sm.tools.memory_tools import memory_tools

            store = memory_store(config)
            candidates += memory_tools(store)
            system.append(_text(MEMORY_NOTE))
            if not isinstance(store, MemoryStore):
                remote_memory = store  # its index comes from `prepare`, off the build
            elif not harness.memory.no_index:
                try:
                    context.append(_text(memory_index(store)))
                except OSError as exc:
                    warnings.append(("memory_index", "", str(exc)))
        offered = [t for t in candidates if harness.tools.offers(t.name, t.tags)]
        box = ToolBox.of(offered)
        gate = Gate(prompter, harness.confirm_tags)
        if not config.mcp_servers:  # else the whole tool set is known once they listed theirs
            warnings += _gate_warnings(gate, offered)
        return cls(
            config=config,
            model=options.model or AnthropicModel(config.llm),
            tools=box,
            journal=options.journal if options.journal is not None else MemoryJournal(),
            events=options.events if options.events is not None else Recorder(),
            gate=gate,
            should_suspend=options.should_suspend or _never,
            system=tuple(system),
            context=tuple(context),
            tool_definitions=tuple(box.definitions),
            warnings=tuple(warnings),
            owns_model=options.model is None,
            memory=remote_memory,
            index_pending=remote_memory is not None and not harness.memory.no_index,
            mcp_pending=bool(config.mcp_servers),
        )

    async def start_mcp_servers(self) -> None:
        """Start (stdio) or reach (http) the MCP servers of agent.yaml and add their tools,
        which the selection filters like any other; then the gate's warnings, over the whole
        tool set. Idempotent. A server that fails raises `McpError` (a `ToolLoadError`)."""
        if not self.mcp_pending:
            return
        self.mcp_pending = False
        import asyncio

        # Importing the SDK takes a while: a worker thread's time, not the loop's.
        await asyncio.to_thread(importlib.import_module, "fisk_sm.tools.mcp")
        from fisk_sm.tools.mcp import McpServers

        config = self.config
        self.mcp = await McpServers.open(
            config.mcp_servers, taken=self.tools.tools, work_dir=config.work_dir
        )
        selection = config.harness.tools
        offered = [t for t in self.mcp.tools if selection.offers(t.name, t.tags)]
        tools = [*self.tools.tools.values(), *offered]
        self.tools = ToolBox.of(tools)
        self.tool_definitions = tuple(self.tools.definitions)
        self.warnings = (*self.warnings, *_gate_warnings(self.gate, tools))

    async def prepare(self) -> None:
        """Do what building could not without waiting: start the MCP servers
        (`start_mcp_servers`), and fetch a JetStream memory index, put first in `context`.
        Idempotent; a store that fails (a missing or misconfigured bucket, no server) becomes a
        `memory_index` warning naming why, and each memory tool then reports the same error."""
        await self.start_mcp_servers()
        if not self.index_pending or self.memory is None:
            return
        self.index_pending = False
        from fisk_sm.tools.memory import MemoryStoreError

        try:
            index = await self.memory.index()
        except (MemoryStoreError, OSError) as exc:
            self.warnings = (*self.warnings, ("memory_index", "", str(exc)))
            return
        self.context = (_text(index), *self.context)

    async def aclose(self) -> None:
        """Release the journal (a session's lock and file) and, if it was built here, the
        model's share of the SDK client; stop the MCP servers; idempotent."""
        try:
            if self.mcp is not None:
                await self.mcp.aclose()  # a stdio server's process group is killed
            await self.journal.close()
        finally:
            try:
                if self.memory is not None:
                    await self.memory.aclose()
            finally:
                close = getattr(self.model, "aclose", None) if self.owns_model else None
                if close is not None:
                    await close()

    def request(self, messages: Sequence[Message]) -> ModelRequest:
        """The next model request over `messages`."""
        system = self.system + self.context if self.context else self.system
        interactive = self.gate.prompter.available
        return build_request(
            self.config.llm, system, self.tool_definitions, messages, interactive=interactive
        )

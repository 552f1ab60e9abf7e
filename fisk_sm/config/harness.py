"""The `harness:` block of agent.yaml: sessions, the confirm gate, human in the loop, memory
and tool selection. Frozen attrs classes, structured by `fisk_sm.config.agent`'s converter."""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from fisk_sm.config.errors import ConfigError, check, show
from fisk_sm.config.limits import MAX_OUTPUT, byte_limit_problem, timeout_problem
from fisk_sm.config.names import identity_problem, subject_problem

__all__ = [
    "HarnessConfig",
    "HumanInTheLoop",
    "MemoryConfig",
    "MemoryOptions",
    "NatsConfig",
    "RemoteHost",
    "SessionOptions",
    "Sessions",
    "ToolRules",
    "ToolSelection",
]


def _bad_regexes(patterns: Sequence[str]) -> str | None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"invalid regex {show(pattern)}: {exc}"
    return None


def _tidy_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """Trimmed, empty ones dropped, first occurrence kept."""
    return tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))


def stream_name_problem(name: str) -> str | None:
    """Why `name` cannot name a JetStream stream (None if it can)."""
    if name and not any(c in name for c in " \t\r\n.*>/\\"):
        return None
    return f"not a stream name: {show(name)}"


@attrs.frozen
class SessionOptions:
    """Options of the session backend."""

    #: The file backend's directory; relative paths are taken from the config's folder.
    directory: str | None = None
    #: The jetstream backend's NATS server (default: `$NATS_URL`, else the top-level `nats.url`).
    url: str | None = None
    #: The jetstream backend's stream (it must exist: `fisk-sm session init-stream`).
    stream: str = attrs.field(default="FISK_SM_SESSIONS", validator=check(stream_name_problem))
    #: The jetstream backend's subject prefix: a session is `<prefix>.<id>.>`.
    prefix: str = attrs.field(
        default="fisk-sm.sessions",
        validator=check(subject_problem),
    )


def _check_session_backend(value: str) -> str | None:
    if value in ("file", "jetstream"):
        return None
    return f"must be 'file' or 'jetstream', got {show(value)}"


@attrs.frozen
class Sessions:
    """Where checkpointed runs keep their journals: files, or a JetStream stream."""

    backend: str = attrs.field(default="file", validator=check(_check_session_backend))
    options: SessionOptions = SessionOptions()

    def __attrs_post_init__(self) -> None:
        if self.backend == "jetstream" and self.options.directory is not None:
            raise ConfigError("<config>", "options.directory", "is for the file backend only")
        if self.backend == "file" and self.options.url is not None:
            raise ConfigError("<config>", "options.url", "is for the jetstream backend only")


@attrs.frozen
class HumanInTheLoop:
    """The ask_human_* tools."""

    enabled: bool = False


MEMORY_BACKENDS = ("file", "jetstream")
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")


def _check_bucket(value: object) -> str | None:
    if isinstance(value, str) and _BUCKET_RE.fullmatch(value):
        return None
    return f"must be a KV bucket name ([a-zA-Z0-9_-]+), got {show(value)}"


def _check_memory_backend(value: object) -> str | None:
    if value in MEMORY_BACKENDS:
        return None
    return f"must be 'file' or 'jetstream', got {show(value)}"


def _check_nats_url(value: str | None) -> str | None:
    if value is None or (isinstance(value, str) and re.match(r"(nats|tls|ws|wss)://.", value)):
        return None
    return f"must be a NATS URL (nats://host:port), got {show(value)}"


@attrs.frozen
class MemoryOptions:
    """Options of the memory backend (each names the backend it belongs to)."""

    #: file: the directory; relative paths are taken from the config's folder.
    directory: str | None = None
    #: jetstream: the NATS server (default: $NATS_URL, else nats://127.0.0.1:4222).
    url: str | None = attrs.field(default=None, validator=check(_check_nats_url))
    #: jetstream: the KV bucket, which must already exist (history 1, no TTL).
    bucket: str = attrs.field(default="fisk_sm_memory", validator=check(_check_bucket))
    #: jetstream: allow overwriting a memory this run has not read (last writer wins).
    no_require_read_before_update: bool = False


@attrs.frozen
class MemoryConfig:
    """The memory_* tools and the index of stored memories in the system prompt."""

    enabled: bool = False
    backend: str = attrs.field(
        default="file",
        validator=check(_check_memory_backend),
    )
    no_index: bool = False
    options: MemoryOptions = MemoryOptions()


@attrs.frozen
class ToolRules:
    """Tools matched by a name regex (searched anywhere in the name) or carrying a tag."""

    names: tuple[str, ...] = attrs.field(default=(), validator=check(_bad_regexes))
    tags: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """No rule at all."""
        return not self.names and not self.tags

    def match(self, name: str, tags: Sequence[str]) -> bool:
        """Whether a tool with `name` and `tags` matches any rule."""
        return any(re.search(p, name) for p in self.names) or any(t in self.tags for t in tags)


@attrs.frozen
class ToolSelection:
    """Which tools are offered: those matching `include` (all, if it is empty), less those
    matching `exclude`. A tool tagged `ai:deny` is never offered."""

    include: ToolRules = ToolRules()
    exclude: ToolRules = ToolRules()

    def offers(self, name: str, tags: Sequence[str]) -> bool:
        """Whether a tool with `name` and `tags` is offered to the model."""
        if "ai:deny" in tags:
            return False
        if not self.include.empty and not self.include.match(name, tags):
            return False
        return not self.exclude.match(name, tags)


def _host_timeout_problem(value: float | None) -> str | None:
    # `timeout_problem` reads any value (a tool's `@tool` arguments); this field's is typed.
    return timeout_problem(value)


@attrs.frozen
class RemoteHost:
    """A host of remote tools, reached over NATS request/reply under `subject`."""

    alias: str = attrs.field(validator=check(identity_problem))
    subject: str = attrs.field(validator=check(subject_problem))
    #: Seconds a call may wait for the host's reply; None: the run's `call_timeout`.
    timeout: float | None = attrs.field(default=None, validator=check(_host_timeout_problem))
    #: Bytes of text a call's result keeps (its head and tail; `fisk_sm.config.limits`).
    max_output: int = attrs.field(default=MAX_OUTPUT, validator=check(byte_limit_problem))


@attrs.frozen
class NatsConfig:
    """Where the NATS server is (for remote tools)."""

    url: str = "nats://127.0.0.1:4222"


@attrs.frozen
class HarnessConfig:
    """Settings of the harness around the loop."""

    sessions: Sessions = Sessions()
    #: Tags that put a tool behind the confirm gate (exact match), besides `ai:confirm`.
    confirm_tags: tuple[str, ...] = attrs.field(default=(), converter=_tidy_tags)
    human_in_the_loop: HumanInTheLoop = HumanInTheLoop()
    memory: MemoryConfig = MemoryConfig()
    tools: ToolSelection = ToolSelection()
    #: The working directory of exec tools (relative to the config's folder); default: cwd.
    work_dir: str | None = None

"""Which agent.yaml files a client of the supervisor may name: only those in allowed directories.

A client of the control API (or of an MCP server over the supervisor) names a run's config by
path. Left open, that reads any file the supervisor can read, and an error quoting the file
would hand its first line out. `ConfigDirs.confine` allows a path only if, with every symlink
resolved, it is a regular file directly in one of the allowed directories (the supervisor's own
agent.yaml directory, and any added with `--config-dir`; not in a directory below them). A
relative path is taken from the supervisor's agent.yaml directory. Every refusal is the same
`NotAllowed`, so a client learns nothing about files outside (not even whether they exist).
`ConfigDirs.load` confines, then reads the resolved path through one open that follows no
symlink: a file swapped for a symlink (or a FIFO) after the check is refused, not read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

from fisk_sm.config.agent import AgentConfig, load_config

__all__ = ["ConfigDirs", "NotAllowed"]


class NotAllowed(ValueError):
    """The path is not an allowed config file (the same for every reason)."""


@attrs.frozen
class ConfigDirs:
    """The allowed config directories (resolved) and the base of relative paths."""

    base: Path
    allowed: tuple[Path, ...]

    @classmethod
    def of(cls, agent_yaml: Path | None, extra: Iterable[Path] = ()) -> ConfigDirs:
        """The directory of `agent_yaml` (else the working directory), and `extra` (blocking:
        resolves the paths)."""
        base = (agent_yaml.parent if agent_yaml is not None else Path.cwd()).absolute()
        dirs = [base, *(Path(d).absolute() for d in extra)]
        resolved = tuple(dict.fromkeys(d.resolve() for d in dirs))
        return cls(base=base, allowed=resolved)

    def confine(self, text: str) -> Path:
        """The resolved path of the config file `text` names; `NotAllowed` unless it is a
        regular file inside an allowed directory (blocking: call it off the loop)."""
        if not text or "\0" in text:
            raise NotAllowed(text)
        try:
            resolved = (self.base / text).resolve(strict=True)
            regular = resolved.is_file()
        except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, unreadable
            raise NotAllowed(text) from None
        if not regular or resolved.parent not in self.allowed:
            raise NotAllowed(text)
        return resolved

    def load(self, text: str) -> AgentConfig:
        """The config `text` names, confined (`NotAllowed`) and read without following a
        symlink (`ConfigError`) (blocking: call it off the loop)."""
        return load_config(self.confine(text), follow=False)

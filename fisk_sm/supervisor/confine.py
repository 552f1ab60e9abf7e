"""Which agent.yaml files a client of the supervisor may name: only those in allowed directories.

A client of the control API (or of an MCP server over the supervisor) names a run's config by
path. Left open, that reads any file the supervisor can read, and an error quoting the file
would hand its first line out. `ConfigDirs.confine` allows a path only if, with every symlink
resolved, it is a regular file inside one of the allowed directories (the supervisor's own
agent.yaml directory, and any added with `--config-dir`). A relative path is taken from the
supervisor's agent.yaml directory. Every refusal is the same `NotAllowed`, so a client learns
nothing about files outside (not even whether they exist).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

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
        if not regular or not any(resolved.is_relative_to(d) for d in self.allowed):
            raise NotAllowed(text)
        return resolved

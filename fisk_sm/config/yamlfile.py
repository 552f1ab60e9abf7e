"""Reading an agent.yaml safely: one open, a size cap, no aliases, a nesting cap.

A config may come from a client (the supervisor's control API names one by path), so reading it
must cost little whatever the file holds. `read_yaml` opens the path once (`O_NONBLOCK`: a FIFO
never blocks the open; `O_NOFOLLOW` when the caller already resolved the path), checks on that
descriptor that it is a regular file of at most `MAX_BYTES`, and parses those bytes: nothing is
re-opened, so a file swapped after a check is never the one read. The YAML may not use aliases
(`*name`): 400 bytes of them build a tree whose every walk (validation, an error's `repr`) takes
billions of steps. Nesting deeper than `MAX_NESTING` is refused before the recursive composer
could exhaust the stack. Every refusal is a one-line `ConfigError` naming the file.
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

import yaml

from fisk_sm.config.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_NESTING", "read_yaml"]

MAX_BYTES = 1 << 20
MAX_NESTING = 64


class _Mark(Protocol):
    """Where in the text a YAML event starts (the pure-Python and the C parser's marks)."""

    @property
    def line(self) -> int: ...
    @property
    def column(self) -> int: ...


class _Refused(Exception):
    def __init__(self, problem: str, mark: _Mark | None) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark


class _Loader(yaml.SafeLoader):
    """`SafeLoader` refusing aliases and nesting deeper than `MAX_NESTING`."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise _Refused("YAML aliases are not allowed", event.start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _Refused(f"nested deeper than {MAX_NESTING} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _read_upto(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    while limit > 0 and (part := os.read(fd, min(limit, 1 << 16))):
        parts.append(part)
        limit -= len(part)
    return b"".join(parts)


def _read(path: str | os.PathLike[str], source: str, follow: bool) -> str:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ConfigError(source, "(file)", exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(source, "(file)", "not a regular file")
        if info.st_size > MAX_BYTES:
            raise ConfigError(source, "(file)", "larger than 1 MiB")
        raw = _read_upto(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, "(file)", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:  # it grew after the fstat
        raise ConfigError(source, "(file)", "larger than 1 MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "(file)", f"not valid UTF-8 ({exc.reason})") from None


def read_yaml(path: str | os.PathLike[str], source: str, *, follow: bool = True) -> object:
    """The YAML document of the file at `path` (`source` names it in errors); `follow=False`
    refuses a symlink (for a path already resolved and checked). Blocking: call off the loop."""
    text = _read(path, source, follow)
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader
    except _Refused as exc:
        mark = exc.mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(source, "(yaml)", exc.problem + where) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "(yaml)", f"invalid YAML: {where}{what}") from exc
    except RecursionError:
        raise ConfigError(source, "(yaml)", "nested too deeply") from None
    except ValueError as exc:  # a constructor's: an integer past the int-to-str digit limit
        raise ConfigError(source, "(yaml)", f"invalid value: {exc}") from None

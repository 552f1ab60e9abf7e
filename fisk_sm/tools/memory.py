"""Agent memory on disk: one file per key, and the four memory tools the model uses.

The tools work on any `MemoryBackend` (async): this file store through `ThreadedMemory` (its
file work in worker threads), or the JetStream KV store of `fisk_sm.tools.memory_kv`. Both keep
the same entry format, key rule and limits (`check_key`, `render_entry`, `parse_entry`).

`<directory>/<key>.md` (0600, in a 0700 directory) holds exactly

    ---
    description: <one line>
    ---

    <content>

i.e. `---\\ndescription: <one line>\\n---\\n\\n<content>`, the content byte for byte (a file that
ends after the closing `---` has empty content). Every write goes to a temp file first: create
hard-links it to the key's name, so two racing creators (even in two processes) get exactly one
winner and nobody sees a torn file; overwrite renames it over the key, so the last writer wins.
Symlinks are never followed: list skips them and read opens with `O_NOFOLLOW`.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

from fisk_sm.config.errors import one_line
from fisk_sm.config.names import IDENTITY_RE
from fisk_sm.journal import statedir

__all__ = [
    "INDEX_HEADER",
    "MAX_CONTENT_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_KEY_CHARS",
    "MEMORY_NOTE",
    "MemoryEntry",
    "MemoryFileError",
    "MemoryFullError",
    "MemoryKeyError",
    "MemoryLimitError",
    "MemoryStaleError",
    "MemoryStore",
    "MemoryStoreError",
    "check_key",
    "default_memory_directory",
    "format_index",
    "memory_index",
    "parse_entry",
    "render_entry",
]

MAX_KEY_CHARS = 200
MAX_CONTENT_BYTES = 65536
MAX_DESCRIPTION_CHARS = 500
MAX_ENTRIES = 1024
MAX_ENTRY_BYTES = MAX_CONTENT_BYTES + 8192  # content plus the largest frontmatter we write
_KEY = re.compile(r"[A-Za-z0-9._=-]+")
_FRONTMATTER = re.compile(rb"---\ndescription:[ \t]*([^\n]*)\n---(?:\n\n?|\Z)")


class MemoryStoreError(Exception):
    """A memory operation the store refused; the message says what and which key or file."""


class MemoryKeyError(MemoryStoreError, ValueError):
    """A key that is not `[A-Za-z0-9._=-]+`, over 200 characters, dotted at an end, or has `..`."""


class MemoryLimitError(MemoryStoreError, ValueError):
    """Content over 65536 bytes (UTF-8) or a blank description."""


class MemoryFullError(MemoryStoreError):
    """Creating a memory in a store that already holds 1024 entries."""


class MemoryFileError(MemoryStoreError):
    """A memory file that is not a regular file in the frontmatter format (or is a symlink)."""


class MemoryStaleError(Exception):
    """An overwrite refused because this run has not read the memory's current value: a normal
    `{"written": false, "reason"}` result for the model, not an error."""


def full_error(key: str) -> MemoryFullError:
    """The refusal to create `key` in a store that already holds `MAX_ENTRIES` memories."""
    return MemoryFullError(
        f"cannot create memory '{key}': the store already holds {MAX_ENTRIES} memories;"
        " delete or overwrite one"
    )


def _key_problem(key: str) -> str:
    """What is wrong with `key` as a memory key, or "" if nothing is."""
    if _KEY.fullmatch(key) is None:
        return "must be non-empty and use only letters, digits and . _ = -"
    if len(key) > MAX_KEY_CHARS:
        return f"is {len(key)} characters; at most {MAX_KEY_CHARS} are allowed"
    if key.startswith(".") or key.endswith("."):
        return "must not start or end with '.'"
    return "must not contain '..'" if ".." in key else ""


def check_key(key: object) -> str:
    """Return `key` if it is a valid memory key, else raise `MemoryKeyError` naming it."""
    if not isinstance(key, str):
        raise MemoryKeyError(f"memory key must be a string, not {type(key).__name__}")
    problem = _key_problem(key)
    if problem:
        raise MemoryKeyError(f"invalid memory key {key[: MAX_KEY_CHARS + 20]!r}: {problem}")
    return key


def render_entry(key: str, description: object, content: object) -> bytes:
    """The file bytes for one memory, after checking the limits (the description flattened)."""
    if not isinstance(description, str) or not isinstance(content, str):
        raise MemoryLimitError(f"memory '{key}': description and content must be strings")
    flat = one_line(description)[:MAX_DESCRIPTION_CHARS].rstrip()
    if not flat:
        raise MemoryLimitError(f"memory '{key}': the description must not be empty")
    body = content.encode("utf-8")
    if len(body) > MAX_CONTENT_BYTES:
        raise MemoryLimitError(
            f"memory '{key}': content is {len(body)} bytes; at most {MAX_CONTENT_BYTES} allowed"
        )
    return b"---\ndescription: " + flat.encode("utf-8") + b"\n---\n\n" + body


def parse_entry(data: bytes) -> tuple[str, str] | None:
    """(description, content) of a memory file's bytes, or None if they are not the format."""
    match = _FRONTMATTER.match(data)
    if match is None:
        return None
    try:
        return match.group(1).decode("utf-8").strip(), data[match.end() :].decode("utf-8")
    except UnicodeDecodeError:
        return None


@attrs.frozen
class MemoryEntry:
    """One stored memory."""

    key: str
    description: str
    content: str


@attrs.frozen
class MemoryStore:
    """The memories of one identity, as `<directory>/<key>.md` files (see the module docstring)."""

    directory: Path = attrs.field(converter=Path)

    @property
    def location(self) -> str:
        """Where the memories are, for people: the directory."""
        return str(self.directory)

    def path(self, key: str) -> Path:
        """The file of `key` (checked)."""
        return self.directory / f"{check_key(key)}.md"

    def list(self) -> builtins.list[tuple[str, str]]:
        """(key, description) of every memory, sorted by key; unparsable files are skipped."""
        found = []
        for key in self._keys():
            try:
                entry = self.read(key)
            except (MemoryStoreError, OSError):
                continue  # a file that breaks must not hide the rest of the index
            if entry is not None:
                found.append((key, entry.description))
        return found

    def read(self, key: str) -> MemoryEntry | None:
        """The memory under `key`, or None if there is none; a bad file is a `MemoryFileError`."""
        path = self.path(key)
        try:  # a symlink or a FIFO planted under a key's name is refused, never waited on
            fd = statedir.open_regular(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except statedir.UnsafeFileError as exc:
            raise MemoryFileError(f"{path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as file:
            data = file.read(MAX_ENTRY_BYTES + 1)
        parsed = parse_entry(data) if len(data) <= MAX_ENTRY_BYTES else None
        if parsed is None:
            raise MemoryFileError(
                f"{path}: not a memory file (expected '---', 'description: ...', '---', a blank"
                f" line, then the content, at most {MAX_ENTRY_BYTES} bytes)"
            )
        return MemoryEntry(key, *parsed)

    def create(self, key: str, description: str, content: str) -> bool:
        """Store a new memory atomically; False if `key` already exists (nothing is changed).

        The 1024-entry cap is checked first, before the key-exists check: a full store refuses
        even a duplicate with `MemoryFullError`.
        """
        data = render_entry(check_key(key), description, content)
        self._ensure_directory()
        if len(self._keys()) >= MAX_ENTRIES:
            raise full_error(key)
        temp = self._write_temp(key, data)
        try:
            # A hard link appears complete or not at all, and fails if the name exists: the one
            # creator that wins a race publishes an intact file; the others get False.
            os.link(temp, self.path(key))
        except FileExistsError:
            return False
        finally:
            temp.unlink(missing_ok=True)
        self._fsync_directory()
        return True

    def overwrite(self, key: str, description: str, content: str) -> None:
        """Store a memory, replacing any under `key` (last writer wins; also creates).

        Deliberately not subject to the 1024-entry cap, even when it creates: the reference's
        file backend checks the cap only in create (its subtlety 19), and this keeps that.
        """
        data = render_entry(check_key(key), description, content)
        self._ensure_directory()
        temp = self._write_temp(key, data)
        try:
            temp.replace(self.path(key))
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._fsync_directory()

    def delete(self, key: str) -> bool:
        """Remove the memory under `key`; False if there was none (so deleting is idempotent)."""
        try:
            self.path(key).unlink()  # unlink removes a symlink itself, never its target
        except FileNotFoundError:
            return False
        self._fsync_directory()
        return True

    def _keys(self) -> builtins.list[str]:
        """Keys of the regular `<key>.md` files, sorted; temp files and symlinks are left out."""
        try:
            with os.scandir(self.directory) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        return sorted(n[:-3] for n in names if n.endswith(".md") and not _key_problem(n[:-3]))

    def _ensure_directory(self) -> None:
        statedir.make_private_directory(self.directory)

    def _write_temp(self, key: str, data: bytes) -> Path:
        """A fsynced 0600 temp file holding `data`, beside the key's file (same filesystem).

        Its name starts with '.', which no key may, so it never collides with a memory.
        """
        import secrets  # here: it imports random and hashlib, which the core needs not

        temp = self.directory / f".{key}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                os.fchmod(fd, 0o600)
                file.write(data)
                file.flush()
                os.fsync(fd)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp

    def _fsync_directory(self) -> None:
        statedir.fsync_directory(self.directory)


MEMORY_NOTE = (
    "You have a persistent memory that outlives this run: the memory_list, memory_read,"
    " memory_write and memory_delete tools. Store durable facts that will matter in later runs:"
    " what you learn about the user and their preferences, about the environment, and decisions"
    " taken and why. Do not store transient state such as the progress of the current task."
    " Each memory has a short key, a one-line description and its content. Before you change an"
    " existing memory, read it with memory_read; memory_write's overwrite defaults to false, so"
    " writing to a key that exists is refused until you pass overwrite=true."
)

INDEX_HEADER = "Memories stored from earlier runs (use memory_read to see one):"


def format_index(entries: builtins.list[tuple[str, str]]) -> str:
    """The index of stored memories, (key, description) pairs, as injected at a run's start."""
    lines = "\n".join(f"- {key}: {text}" for key, text in entries) or "(none stored yet)"
    return f"{INDEX_HEADER}\n<memory-index>\n{lines}\n</memory-index>"


def memory_index(store: MemoryStore) -> str:
    """The index of the memories in `store` (an OSError propagates)."""
    return format_index(store.list())


def default_memory_directory(identity: str, env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/fisk-sm/memory/<identity>` if set and absolute, else under `~/.local`."""
    if IDENTITY_RE.fullmatch(identity) is None:
        raise ValueError(f"invalid identity {identity!r}: must match ^[a-zA-Z0-9_-]+$")
    return statedir.state_home(env) / "memory" / identity

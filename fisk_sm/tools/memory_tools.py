"""The memory tools (`memory_list`, `memory_read`, `memory_write`, `memory_delete`) over any
memory backend: the file store through worker threads (`ThreadedMemory`), or a JetStream KV
bucket (`fisk_sm.tools.memory_kv`). See `fisk_sm.tools.memory` for the keys, the limits and the
file store."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs

from fisk_sm.config.errors import one_line
from fisk_sm.tools.base import Tool, ToolError
from fisk_sm.tools.memory import (
    MAX_CONTENT_BYTES,
    MemoryEntry,
    MemoryStaleError,
    MemoryStore,
    MemoryStoreError,
    memory_index,
)

__all__ = ["MAX_OUTPUT", "MemoryBackend", "ThreadedMemory", "memory_tools"]

#: Bytes of text a memory tool's result keeps: a memory holds up to 64 KiB (MAX_CONTENT_BYTES),
#: which JSON escaping may grow, and a read of one is not to be cut; a long listing is.
MAX_OUTPUT = 4 * MAX_CONTENT_BYTES


class MemoryBackend(Protocol):
    """What the memory tools use: a store's operations as coroutines.

    `create` is False if the key exists; `overwrite` may raise `MemoryStaleError` (a store that
    guards updates); refusals are `MemoryStoreError`s. `index()` is the text injected at a
    run's start; `aclose()` releases what the store holds.
    """

    async def list(self) -> builtins.list[tuple[str, str]]: ...
    async def read(self, key: str) -> MemoryEntry | None: ...
    async def create(self, key: str, description: str, content: str) -> bool: ...
    async def overwrite(self, key: str, description: str, content: str) -> None: ...
    async def delete(self, key: str) -> bool: ...
    async def index(self) -> str: ...
    async def aclose(self) -> None: ...


@attrs.frozen
class ThreadedMemory:
    """A `MemoryStore` as a `MemoryBackend`: every file operation in a worker thread."""

    store: MemoryStore

    async def list(self) -> builtins.list[tuple[str, str]]:
        return await asyncio.to_thread(self.store.list)

    async def read(self, key: str) -> MemoryEntry | None:
        return await asyncio.to_thread(self.store.read, key)

    async def create(self, key: str, description: str, content: str) -> bool:
        return await asyncio.to_thread(self.store.create, key, description, content)

    async def overwrite(self, key: str, description: str, content: str) -> None:
        await asyncio.to_thread(self.store.overwrite, key, description, content)

    async def delete(self, key: str) -> bool:
        return await asyncio.to_thread(self.store.delete, key)

    async def index(self) -> str:
        return await asyncio.to_thread(memory_index, self.store)

    async def aclose(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""


@contextlib.contextmanager
def _tool_errors(action: str) -> Iterator[None]:
    """Turn the store's refusals and I/O failures into `ToolError`s (is_error results)."""
    try:
        yield
    except MemoryStoreError as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"cannot {action}: {one_line(str(exc))}") from None


def _schema(properties: dict[str, Any], required: builtins.list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    return {**schema, "required": required} if required else schema


_KEY_PROP = {
    "type": "string",
    "description": "the memory's key: letters, digits and . _ = - (at most 200 characters,"
    " no '..', not starting or ending with '.')",
}


def memory_tools(backend: MemoryStore | MemoryBackend) -> builtins.list[Tool]:
    """The memory_list, memory_read, memory_write and memory_delete tools over a store (a file
    `MemoryStore` is used through `ThreadedMemory`)."""
    store = ThreadedMemory(backend) if isinstance(backend, MemoryStore) else backend

    async def memory_list() -> dict[str, Any]:
        with _tool_errors("list memories"):
            entries = await store.list()
        return {"memories": [{"key": k, "description": d} for k, d in entries]}

    async def memory_read(key: str) -> dict[str, Any]:
        with _tool_errors(f"read memory '{key}'"):
            entry = await store.read(key)
        if entry is None:
            return {"found": False, "reason": f"no memory is stored under key '{key}'"}
        return {"found": True, **attrs.asdict(entry)}

    async def memory_write(
        key: str, description: str, content: str, overwrite: bool = False
    ) -> dict[str, Any]:
        if not isinstance(overwrite, bool):
            raise ToolError("memory_write: overwrite must be a boolean (true or false)")
        with _tool_errors(f"write memory '{key}'"):
            try:
                if overwrite:
                    await store.overwrite(key, description, content)
                    return {"written": True}
            except MemoryStaleError as exc:
                return {"written": False, "reason": str(exc)}
            if await store.create(key, description, content):
                return {"written": True}
        try:  # a guarded store remembers this read: it grants the overwrite the reason invites
            existing = await store.read(key)
            stored = existing.description if existing else "it was deleted just now"
        except (MemoryStoreError, OSError):
            stored = "its description could not be read"
        reason = (
            f"a memory with key '{key}' already exists ({stored}); read it, then write again"
            " with overwrite=true to replace it"
        )
        return {"written": False, "reason": reason}

    async def memory_delete(key: str) -> dict[str, Any]:
        with _tool_errors(f"delete memory '{key}'"):
            return {"deleted": await store.delete(key)}

    key_only = _schema({"key": _KEY_PROP}, ["key"])
    write = _schema(
        {
            "key": _KEY_PROP,
            "description": {
                "type": "string",
                "description": "one line saying what the memory holds (shown in the index;"
                " at most 500 characters)",
            },
            "content": {"type": "string", "description": "the memory itself (at most 64 KiB)"},
            "overwrite": {
                "type": "boolean",
                "default": False,
                "description": "replace an existing memory under this key; read it first",
            },
        },
        ["key", "description", "content"],
    )
    specs: builtins.list[tuple[Callable[..., Any], str, dict[str, Any]]] = [
        (memory_list, "List the stored memories: each key and description.", _schema({}, [])),
        (memory_read, "Read one stored memory by key.", key_only),
        (memory_write, "Store a memory for later runs (refused if the key exists).", write),
        (memory_delete, "Delete the memory stored under a key.", key_only),
    ]
    return [
        Tool(fn.__name__, text, schema, fn, kind="memory", max_output=MAX_OUTPUT)
        for fn, text, schema in specs
    ]

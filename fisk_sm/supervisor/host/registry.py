"""The supervisor's durable registry of its runs: `STATE_DIR/supervisor/runs.jsonl`.

One JSON object per line, appended and fsynced in a worker thread (never on the loop):
`{"event": "submitted", "run_id", "name", "config", "created"}` when a run is submitted, then
`{"event": DISPOSITION, "run_id"}` whenever what should happen to it on a restart changes:
`operator_suspended`, `resumed`, `aborted`, `shutdown_suspended`. The last disposition of a run
decides: on start the supervisor resumes a run whose last word is `submitted`, `resumed` or
`shutdown_suspended` (its journal then says where: a shutdown's suspend, or an owner that died
with the journal open), and only lists one an operator suspended or aborted. The journal, not
this file, remains the truth about a run's progress; the file is 0600 in a 0700 directory.
A torn last line (a crash mid-append) is skipped on load.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

import attrs

from fisk_sm.journal.base import JournalError
from fisk_sm.journal.statedir import fsync_directory, make_private_directory, open_regular
from fisk_sm.supervisor.view.entry import DISPOSITIONS, SUBMITTED, RegistryEntry

__all__ = ["DirectoryInUse", "Registry", "RegistryEntry", "RunRegistry", "hold_directory"]


class RunRegistry(Protocol):
    """What a host asks of its registry (`Registry`; a cluster keeps none of its own)."""

    def load(self) -> dict[str, RegistryEntry]: ...

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry: ...

    async def mark(self, disposition: str, *run_ids: str) -> None: ...


class DirectoryInUse(JournalError):
    """Another supervisor drives the runs of this state directory."""


def hold_directory(directory: Path) -> int:
    """Take the supervisor's lock on `directory` (`supervisor/lock`, 0600, never a planted
    link); the descriptor holds it for the life of the process. Blocking: call it off the loop.
    Raises `DirectoryInUse` if another `fisk-sm supervise` holds it."""
    where = Path(directory) / "supervisor"
    make_private_directory(where)
    fd = open_regular(where / "lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryInUse(
            f"{directory}: another fisk-sm supervise drives the runs of this state directory"
        ) from None
    return fd


class Registry:
    """`runs.jsonl` in `directory`: appended one durable line at a time, in order."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / "runs.jsonl"
        # Lines asked for while an append is under way share the next one (one fsync).
        self._pending: list[tuple[list[dict[str, Any]], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    def load(self) -> dict[str, RegistryEntry]:
        """Every run in the file, by id, in submission order (blocking: call it off the loop)."""
        entries: dict[str, RegistryEntry] = {}
        try:
            fd = open_regular(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return entries
        with os.fdopen(fd, "rb") as stream:
            lines = stream.read().split(b"\n")
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a torn last line
            if not isinstance(line, dict) or not isinstance(line.get("run_id"), str):
                continue
            run_id, event = line["run_id"], line.get("event")
            if event == SUBMITTED:
                entries[run_id] = RegistryEntry(
                    run_id,
                    str(line.get("name", run_id)),
                    str(line.get("config", "")),
                    float(line.get("created", 0.0)),
                )
            elif event in DISPOSITIONS and run_id in entries:
                entries[run_id] = attrs.evolve(entries[run_id], disposition=event)
        return entries

    def _append(self, lines: list[dict[str, Any]]) -> None:
        fresh = not self.path.exists()
        make_private_directory(self.directory)
        fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.fchmod(fd, 0o600)
            data = "".join(json.dumps(line) + "\n" for line in lines).encode()
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if fresh:
            fsync_directory(self.directory)

    async def submitted(self, run_id: str, name: str, config: str) -> RegistryEntry:
        """Record a new run durably; returns its entry."""
        entry = RegistryEntry(run_id, name, config, time.time())
        line = {"event": SUBMITTED, **attrs.asdict(entry)}
        del line["disposition"]
        await self.write([line])
        return entry

    async def mark(self, disposition: str, *run_ids: str) -> None:
        """Record `disposition` for each run, in one durable append."""
        if disposition not in DISPOSITIONS:
            raise ValueError(f"unknown disposition {disposition!r}")
        if run_ids:
            await self.write([{"event": disposition, "run_id": r} for r in run_ids])

    async def write(self, lines: list[dict[str, Any]]) -> None:
        """Append `lines` durably (in a worker thread); returns once they are fsynced. Lines
        asked for meanwhile by other callers go out together, in order, in one append."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((lines, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._flush())
        await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._append, [line for ls, _ in batch for line in ls])
            except OSError as exc:  # a failing disk: each waiter raises it
                for _, future in batch:
                    future.set_exception(exc)
            except BaseException as exc:  # a bug, a cancel: the waiters raise it, and so do we
                for _, future in batch:
                    future.set_exception(exc)
                raise
            else:
                for _, future in batch:
                    future.set_result(None)

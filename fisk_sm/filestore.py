"""The file backend of sessions: one JSON Lines journal per session, locked while a run owns it.

Layout: `<dir>/<id>.json` is the journal (mode 0600), `<dir>/<id>.lock` the lock file taken with a
non-blocking exclusive `flock`; the directory is mode 0700. Each append is one `write` of one line
followed by `fsync`. On `open`, a torn last line (no trailing newline, or undecodable) is truncated
away so the next append starts clean; a bad interior line is a `CorruptJournalError` and the file
is left untouched.
"""

from __future__ import annotations

import builtins
import fcntl
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import attrs

from fisk_sm.journal import JournalError, check_append
from fisk_sm.records import Meta, Record, Terminal, decode, encode

__all__ = [
    "CorruptJournalError",
    "FileJournal",
    "FileStore",
    "InvalidIdError",
    "SessionExistsError",
    "SessionInfo",
    "SessionLockedError",
    "SessionNotFoundError",
    "check_run_id",
    "default_directory",
]

_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_-]*")
_MAX_ID = 128


class InvalidIdError(JournalError):
    """A session id that does not match `^[a-zA-Z0-9][a-zA-Z0-9_-]*$` or is over 128 chars."""


class SessionExistsError(JournalError):
    """Creating a session whose journal already exists."""


class SessionNotFoundError(JournalError):
    """Opening, loading or deleting a session that has no journal."""


class SessionLockedError(JournalError):
    """The session's lock is held (another run owns it)."""


class CorruptJournalError(JournalError):
    """A journal with a bad interior line; the message names the file and 1-based line."""


def _one_line(text: object) -> str:
    """`text` with all whitespace runs (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def _is_valid_id(run_id: str) -> bool:
    return len(run_id) <= _MAX_ID and _ID.fullmatch(run_id) is not None


def check_run_id(run_id: str) -> str:
    """Return `run_id` if it is a valid session id, else raise `InvalidIdError`."""
    if not _is_valid_id(run_id):
        raise InvalidIdError(
            f"invalid session id {run_id[:_MAX_ID + 8]!r}: must match "
            f"^[a-zA-Z0-9][a-zA-Z0-9_-]*$ and be at most {_MAX_ID} characters"
        )
    return run_id


def default_directory(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/fisk-sm/runs` if set and absolute, else `~/.local/state/fisk-sm/runs`."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "fisk-sm" / "runs"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / "fisk-sm" / "runs"


@attrs.frozen
class SessionInfo:
    """One row of `FileStore.list()`."""

    run_id: str
    model: str
    status: str  # "open" without a terminal record, else the last terminal reason
    updated: float  # the journal's mtime
    prompt: str
    records: int


def _parse(path: Path, data: bytes) -> tuple[builtins.list[Record], int]:
    """Decode a journal: its good records and the byte offset where the good prefix ends.

    A torn last line is left out of both; a bad interior line or a seq out of order raises
    `CorruptJournalError` naming `path` and the 1-based line.
    """
    lines = data.split(b"\n")
    torn_tail = lines.pop() != b""  # the text after the last newline: a write cut short
    records: list[Record] = []
    end = 0
    for number, line in enumerate(lines, start=1):
        try:
            record = decode(line)
        except ValueError as exc:
            if number == len(lines) and not torn_tail:
                break  # the last line is garbage: torn, dropped
            raise CorruptJournalError(f"{path}: line {number}: {_one_line(exc)}") from None
        if record.seq != number:
            raise CorruptJournalError(f"{path}: line {number}: seq {record.seq}, expected {number}")
        if (number == 1) != isinstance(record, Meta):
            what = "first record is not meta" if number == 1 else "meta record after line 1"
            raise CorruptJournalError(f"{path}: line {number}: {what}")
        records.append(record)
        end += len(line) + 1
    return records, end


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


@attrs.define(eq=False)
class FileJournal:
    """An open session journal: appends are durable (fsync) before they return.

    It holds the session lock until closed. `records` are the records the journal held when it
    was handed out (read at open, or the meta at create); appends do not extend it.
    """

    path: Path
    _fd: int = attrs.field(repr=False)
    _lock_fd: int = attrs.field(repr=False)
    records: builtins.list[Record]
    _last_seq: int = 0
    _broken: bool = False
    _closed: bool = False

    @property
    def last_seq(self) -> int:
        """The seq of the last record known durable (0 when empty)."""
        return self._last_seq

    def append_sync(self, record: Record) -> None:
        """Append under the append contract: write one line, fsync, then advance `last_seq`.

        After a failed write the journal refuses further appends (the file's tail is unknown);
        reopen the session, which truncates a torn line.
        """
        if self._closed:
            raise JournalError(f"{self.path}: journal is closed")
        if self._broken:
            raise JournalError(f"{self.path}: journal is broken by a failed write; reopen it")
        try:
            if not check_append(self._last_seq, record):
                return
        except JournalError as exc:
            raise JournalError(f"{self.path}: {exc}") from None
        view = memoryview((encode(record) + "\n").encode())
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            self._broken = True
            raise JournalError(
                f"{self.path}: append of seq {record.seq} failed: {_one_line(exc)}"
            ) from exc
        self._last_seq = record.seq

    async def append(self, record: Record) -> None:
        """The `Journal` protocol's append: `append_sync` (it blocks for the fsync)."""
        self.append_sync(record)

    def close_sync(self) -> None:
        """Close the journal and release the lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            os.close(self._fd)
        finally:
            os.close(self._lock_fd)

    async def close(self) -> None:
        """The `Journal` protocol's close: `close_sync`."""
        self.close_sync()

    def __enter__(self) -> FileJournal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_sync()


@attrs.frozen
class FileStore:
    """Sessions as JSON Lines files in `directory`."""

    directory: Path = attrs.field(converter=Path)

    @classmethod
    def default(cls, env: Mapping[str, str] | None = None) -> FileStore:
        """A store in `default_directory(env)`."""
        return cls(default_directory(env))

    def path(self, run_id: str) -> Path:
        """The journal of `run_id`: `<dir>/<id>.json` (the id is checked first)."""
        return self.directory / f"{check_run_id(run_id)}.json"

    def lock_path(self, run_id: str) -> Path:
        """The lock file of `run_id`: `<dir>/<id>.lock`."""
        return self.directory / f"{check_run_id(run_id)}.lock"

    def ensure_directory(self) -> None:
        """Create the directory (mode 0700) and its missing parents; an existing one is kept."""
        if self.directory.is_dir():
            return
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.directory.mkdir(mode=0o700)
        except FileExistsError:
            return
        self.directory.chmod(0o700)  # mkdir's mode is masked by the umask

    def _lock(self, run_id: str) -> int:
        """Take the session's lock without blocking; the lock fd, or `SessionLockedError`."""
        lock_path = self.lock_path(run_id)
        try:
            fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o600)
        except OSError as exc:
            raise JournalError(f"{lock_path}: {_one_line(exc)}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SessionLockedError(f"session '{run_id}' is locked by another run") from None
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # a delete unlinked the lock file between our open and flock
                raise SessionLockedError(f"session '{run_id}' is being deleted")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def create(self, meta: Meta) -> FileJournal:
        """Create session `meta.run_id` with `meta` (seq 1) as its first, durable record."""
        run_id = check_run_id(meta.run_id)
        if meta.seq != 1:
            raise ValueError(f"session '{run_id}': meta must have seq 1, got {meta.seq}")
        path = self.path(run_id)
        if path.exists():
            raise SessionExistsError(f"session '{run_id}' already exists: {path}")
        try:
            self.ensure_directory()
        except OSError as exc:
            raise JournalError(f"{self.directory}: {_one_line(exc)}") from exc
        lock_fd = self._lock(run_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            os.close(lock_fd)
            raise SessionExistsError(f"session '{run_id}' already exists: {path}") from None
        except OSError as exc:
            os.close(lock_fd)
            raise JournalError(f"{path}: {_one_line(exc)}") from exc
        journal = FileJournal(path, fd, lock_fd, [meta])
        try:
            os.fchmod(fd, 0o600)  # the umask may have taken bits off
            journal.append_sync(meta)
            _fsync_directory(self.directory)
        except BaseException as exc:
            path.unlink(missing_ok=True)
            journal.close_sync()
            if isinstance(exc, OSError):
                raise JournalError(f"{path}: {_one_line(exc)}") from exc
            raise
        return journal

    def open(self, run_id: str) -> FileJournal:
        """Open session `run_id` for appending: lock it, validate it, truncate a torn last line."""
        path = self.path(run_id)
        if not path.exists():
            raise SessionNotFoundError(f"session '{run_id}' not found: {path}")
        lock_fd = self._lock(run_id)
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                raise SessionNotFoundError(f"session '{run_id}' not found: {path}") from None
            try:
                data = _read_fd(fd)
                records, end = _parse(path, data)
                if end < len(data):
                    os.ftruncate(fd, end)
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            os.close(lock_fd)
            raise JournalError(f"{path}: {_one_line(exc)}") from exc
        except BaseException:
            os.close(lock_fd)
            raise
        return FileJournal(path, fd, lock_fd, records, len(records))

    def load(self, run_id: str) -> builtins.list[Record]:
        """Read session `run_id` without locking or changing it (a torn last line is dropped)."""
        path = self.path(run_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SessionNotFoundError(f"session '{run_id}' not found: {path}") from None
        except OSError as exc:
            raise JournalError(f"{path}: {_one_line(exc)}") from exc
        return _parse(path, data)[0]

    def delete(self, run_id: str) -> None:
        """Remove the session's journal and lock file; refused while another run holds it."""
        path = self.path(run_id)
        if not path.exists():
            raise SessionNotFoundError(f"session '{run_id}' not found: {path}")
        lock_fd = self._lock(run_id)
        try:
            path.unlink()
            self.lock_path(run_id).unlink(missing_ok=True)
        except FileNotFoundError:
            raise SessionNotFoundError(f"session '{run_id}' not found: {path}") from None
        except OSError as exc:
            raise JournalError(f"{path}: {_one_line(exc)}") from exc
        finally:
            os.close(lock_fd)

    def fork(self, run_id: str, at_seq: int, new_id: str) -> None:
        """Create session `new_id` from the first `at_seq` records of `run_id`."""
        check_run_id(new_id)
        records = self.load(run_id)
        if not 1 <= at_seq <= len(records):
            raise ValueError(
                f"fork of session '{run_id}' at seq {at_seq}: must be between 1 and {len(records)}"
            )
        meta = records[0]
        assert isinstance(meta, Meta)  # _parse guarantees it
        with self.create(attrs.evolve(meta, run_id=new_id)) as journal:
            try:
                for record in records[1:at_seq]:
                    journal.append_sync(record)
            except BaseException:
                journal.path.unlink(missing_ok=True)  # no half-written fork left behind
                raise

    def list(self) -> builtins.list[SessionInfo]:
        """Every readable session, newest first; corrupt or unreadable journals are skipped."""
        try:
            paths = builtins.list(self.directory.glob("*.json"))
        except OSError:
            return []
        infos = []
        for path in paths:
            if not _is_valid_id(path.stem):
                continue
            try:
                updated = path.stat().st_mtime
                records = self.load(path.stem)
            except (OSError, JournalError):
                continue
            if not records:
                continue
            meta = records[0]
            assert isinstance(meta, Meta)
            ends = [r.reason for r in records if isinstance(r, Terminal)]
            infos.append(
                SessionInfo(
                    run_id=path.stem,
                    model=str(meta.fingerprint.get("model", "")),
                    status=ends[-1] if ends else "open",
                    updated=updated,
                    prompt=meta.prompt,
                    records=len(records),
                )
            )
        infos.sort(key=lambda info: (-info.updated, info.run_id))
        return infos

"""The file backend of sessions: one JSON Lines journal per session, locked while a run owns it.

`<dir>/<id>.json` is the journal (0600), `<dir>/<id>.lock` its flock; the directory is 0700. `open`
truncates a torn last line so the next append starts clean, but only once the file is known to be
readable by this version; a bad interior line is an error. Journals and locks are opened with
`O_NOFOLLOW` and `O_NONBLOCK`, and anything but a regular file is refused, so a planted symlink or
FIFO is never followed, written through or waited on.

`open` and `create` take a lock, read or create a file and fsync it: on an event loop, use
`open_async` and `create_async`, which do the same in a worker thread. The open journal
(`fisk_sm.journal.filejournal`) appends through the group-commit writer, off the loop too.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import attrs

from fisk_sm.config.errors import one_line
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.checkpoint import checkpoint_path
from fisk_sm.journal.filejournal import FileJournal, JournalIOError
from fisk_sm.journal.ids import run_id_problem
from fisk_sm.journal.parsing import CorruptJournalError, fold_journal, parse_journal, read_all
from fisk_sm.journal.records import Meta, Record
from fisk_sm.journal.snapshot import Snapshot
from fisk_sm.journal.statedir import (
    UnsafeFileError,
    default_directory,
    fsync_directory,
    make_private_directory,
    open_regular,
)

__all__ = [
    "CorruptJournalError",
    "FileJournal",
    "FileStore",
    "ForkRangeError",
    "InvalidIdError",
    "JournalIOError",
    "SessionExistsError",
    "SessionInfo",
    "SessionLockedError",
    "SessionNotFoundError",
    "check_fork_at",
    "check_run_id",
    "default_directory",
    "fold_journal",
]


class InvalidIdError(JournalError):
    """A session id that does not match `^[a-zA-Z0-9][a-zA-Z0-9_-]*$` or is over 128 chars."""


class SessionExistsError(JournalError):
    """Creating a session whose journal already exists."""


class SessionNotFoundError(JournalError):
    """Opening, loading or deleting a session that has no journal."""


class SessionLockedError(JournalError):
    """The session's lock is held (another run owns it)."""


class ForkRangeError(JournalError, ValueError):
    """A fork at a seq the session does not have (bad input: one line, exit 2)."""


def check_fork_at(run_id: str, at_seq: int, records: builtins.list[Record]) -> None:
    """Raise `ForkRangeError` unless `at_seq` is a seq of `records` (the session `run_id`)."""
    if not 1 <= at_seq <= len(records):
        raise ForkRangeError(
            f"fork of session '{run_id}' at seq {at_seq}: must be between 1 and {len(records)}"
        )


def check_run_id(run_id: str) -> str:
    """Return `run_id` if it is a valid session id, else raise `InvalidIdError`."""
    problem = run_id_problem(run_id)
    if problem is not None:
        raise InvalidIdError(problem)
    return run_id


@attrs.frozen
class SessionInfo:
    """One row of `FileStore.list()`."""

    run_id: str
    model: str
    status: str  # "open" without a terminal record, else the last terminal reason; "damaged"
    updated: float  # the journal's mtime
    prompt: str
    records: int
    #: Why a damaged session cannot be read (its status is "damaged"); empty otherwise.
    problem: str = ""
    #: "live" while a process holds the session's lock (its run is going on); "gone" for an
    #: open session whose lock is free (its owner died or was killed); "" otherwise.
    owner: str = ""


def _not_found(run_id: str, path: Path) -> SessionNotFoundError:
    return SessionNotFoundError(f"session '{run_id}' not found: {path}")


@contextlib.contextmanager
def _errors(path: Path, run_id: str = "") -> Iterator[None]:
    """Re-raise an OSError as a one-line `JournalError` naming `path` (or as not-found)."""
    try:
        yield
    except FileNotFoundError as exc:
        if run_id:
            raise _not_found(run_id, path) from None
        raise JournalError(f"{path}: {one_line(exc)}") from exc
    except UnsafeFileError as exc:  # a planted file: bad input, not a failing disk
        raise JournalError(f"{path}: {exc.strerror}") from None
    except OSError as exc:
        raise JournalIOError(f"{path}: {one_line(exc.strerror or exc)}") from exc


_T = TypeVar("_T")


def _unfinished(path: Path) -> bool:
    """Whether the journal at `path` is an empty regular file: what a create leaves when its
    process is killed between making the file and writing its meta record (one small write,
    whole or not at all), so nothing in it was ever acknowledged. Anything else, half a line
    included, may be another program's and is never taken over."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == 0


def _reopen_unfinished(path: Path) -> int | None:
    """`path` opened for appending if it is still empty (`_unfinished`); None, and the file
    untouched, if it is not. Call it holding the session's lock."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND)
    if os.fstat(fd).st_size == 0:
        return fd
    os.close(fd)
    return None


async def _off_loop(opener: Callable[[_T], FileJournal], arg: _T) -> FileJournal:
    """`opener(arg)` in a worker thread; should the caller be cancelled meanwhile, the journal
    it opened is closed when the thread is done, so its lock is not held forever."""
    task = asyncio.ensure_future(asyncio.to_thread(opener, arg))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_close_unclaimed)
        raise


def _close_unclaimed(task: asyncio.Future[FileJournal]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close_sync()


def _flock_exclusive(fd: int) -> None:
    """Take `fd`'s exclusive lock without waiting for another run; a `session ls` probing the
    lock holds it shared for a few microseconds, so a refusal is tried again briefly first."""
    for _ in range(_LOCK_TRIES - 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.002)
        else:
            return
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


_LOCK_TRIES = 5


@attrs.frozen
class FileStore:
    """Sessions as JSON Lines files in `directory`."""

    directory: Path = attrs.field(converter=Path)

    def path(self, run_id: str) -> Path:
        """The journal of `run_id`: `<dir>/<id>.json` (the id is checked first)."""
        return self.directory / f"{check_run_id(run_id)}.json"

    def lock_path(self, run_id: str) -> Path:
        """The lock file of `run_id`: `<dir>/<id>.lock`."""
        return self.directory / f"{check_run_id(run_id)}.lock"

    def ensure_directory(self) -> None:
        """Create the directory and its missing parents (mode 0700); an existing one is kept."""
        make_private_directory(self.directory)

    def _lock(self, run_id: str) -> int:
        """Take the session's lock without blocking; the lock fd, or `SessionLockedError`."""
        lock_path = self.lock_path(run_id)
        with _errors(lock_path):
            fd = open_regular(lock_path, os.O_RDONLY | os.O_CREAT)
        try:
            _flock_exclusive(fd)
            # A delete may have unlinked the lock file between our open and flock.
            if not os.path.lexists(lock_path) or lock_path.lstat().st_ino != os.fstat(fd).st_ino:
                raise SessionLockedError(f"session '{run_id}' is being deleted")
        except BlockingIOError:
            os.close(fd)
            raise SessionLockedError(f"session '{run_id}' is locked by another run") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def lock_held(self, run_id: str) -> bool:
        """Whether a process holds the session's lock now (its run is live).

        A non-blocking shared flock on the lock file, released at once; nothing is created, and
        a missing or planted lock file counts as free.
        """
        try:
            fd = open_regular(self.lock_path(run_id), os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # and with it the shared lock, if it was granted
        return False

    def create(self, meta: Meta) -> FileJournal:
        """Create session `meta.run_id` with `meta` (seq 1) as its first, durable record."""
        run_id = check_run_id(meta.run_id)
        if meta.seq != 1:
            raise ValueError(f"session '{run_id}': meta must have seq 1, got {meta.seq}")
        path = self.path(run_id)
        exists = SessionExistsError(f"session '{run_id}' already exists: {path}")
        if os.path.lexists(path) and not _unfinished(path):
            raise exists
        with _errors(path), contextlib.ExitStack() as undo:
            self.ensure_directory()
            lock_fd = self._lock(run_id)
            undo.callback(os.close, lock_fd)
            try:
                fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
            except FileExistsError:
                reopened = _reopen_unfinished(path)  # under the lock: one cut short is redone
                if reopened is None:
                    raise exists from None
                fd = reopened
            undo.callback(os.close, fd)
            undo.callback(path.unlink, missing_ok=True)  # a failed create leaves nothing behind
            os.fchmod(fd, 0o600)  # the umask may have taken bits off
            journal = FileJournal(path, fd, lock_fd, [meta])
            journal.append_sync(meta)
            fsync_directory(self.directory)  # make the new file's directory entry durable
            undo.pop_all()
        return journal

    def open(self, run_id: str) -> FileJournal:
        """Open session `run_id` for appending: lock it, validate it, truncate a torn last line.

        A corrupt journal raises `CorruptJournalError` with the file unchanged and the lock freed.
        """
        path = self.path(run_id)
        if not os.path.lexists(path):
            raise _not_found(run_id, path)
        with _errors(path, run_id), contextlib.ExitStack() as undo:
            lock_fd = self._lock(run_id)
            undo.callback(os.close, lock_fd)
            fd = open_regular(path, os.O_RDWR | os.O_APPEND)
            undo.callback(os.close, fd)
            data = read_all(fd)  # under the lock: no writer but us
            # refuses before a byte is cut; read from its checkpoint if it has one that holds
            records, end = parse_journal(path, data, checkpoint=True)
            if end < len(data):
                os.ftruncate(fd, end)
                os.fsync(fd)
            undo.pop_all()
        return FileJournal(path, fd, lock_fd, records, len(records))

    async def create_async(self, meta: Meta) -> FileJournal:
        """`create` in a worker thread: the lock, the new file and both fsyncs stay off the loop."""
        return await _off_loop(self.create, meta)

    async def open_async(self, run_id: str) -> FileJournal:
        """`open` in a worker thread: the lock, the read, the parse and a torn line's cut."""
        return await _off_loop(self.open, run_id)

    def load(self, run_id: str) -> builtins.list[Record]:
        """Read session `run_id` without locking or changing it (a torn last line is dropped)."""
        path = self.path(run_id)
        with _errors(path, run_id):
            fd = open_regular(path, os.O_RDONLY)
            try:
                data = read_all(fd)
            finally:
                os.close(fd)
        return parse_journal(path, data)[0]

    def snapshot(self, run_id: str) -> Snapshot:
        """The folded state of session `run_id` (read without locking or changing it)."""
        return fold_journal(self.path(run_id), self.load(run_id))

    def delete(self, run_id: str) -> None:
        """Remove the session's journal and lock file; refused while another run holds it."""
        path = self.path(run_id)
        if not os.path.lexists(path):
            raise _not_found(run_id, path)
        lock_fd = self._lock(run_id)
        try:
            with _errors(path, run_id):
                path.unlink()
                checkpoint_path(path).unlink(missing_ok=True)
                self.lock_path(run_id).unlink(missing_ok=True)
        finally:
            os.close(lock_fd)

    def fork(self, run_id: str, at_seq: int, new_id: str) -> None:
        """Create session `new_id` from the first `at_seq` records of `run_id`."""
        check_run_id(new_id)
        records = self.load(run_id)
        check_fork_at(run_id, at_seq, records)
        meta = records[0]
        assert isinstance(meta, Meta)  # parse_journal guarantees it
        with self.create(attrs.evolve(meta, run_id=new_id)) as journal:
            try:
                for record in records[1:at_seq]:
                    journal.append_sync(record)
            except BaseException:
                journal.path.unlink(missing_ok=True)  # no half-written fork left behind
                raise

    def list(self) -> builtins.list[SessionInfo]:
        """Every session, newest first; one that cannot be read is listed as damaged, with why.

        A planted file (a FIFO, a symlink) or a corrupt journal never stops the listing.
        """
        try:
            paths = builtins.list(self.directory.glob("*.json"))
        except OSError:
            return []
        infos = [self._info(path) for path in paths]
        infos.sort(key=lambda info: (-info.updated, info.run_id))
        return infos

    def _info(self, path: Path) -> SessionInfo:
        try:
            updated = path.lstat().st_mtime
        except OSError:
            updated = 0.0
        try:
            records = self.load(path.stem)
            snap = fold_journal(path, records)  # a row shown as good is one `show` can read
        except (OSError, JournalError) as exc:  # an invalid id, a planted file, corrupt
            reason = one_line(exc).removeprefix(f"{path}: ")
            return SessionInfo(path.stem, "", "damaged", updated, "", 0, reason)
        model = str(snap.fingerprint.get("model", ""))
        live = self.lock_held(path.stem)
        owner = "live" if live else "gone" if snap.status == "open" else ""
        return SessionInfo(
            path.stem, model, snap.status, updated, snap.prompt, len(records), "", owner
        )

"""The state directory and the files in it: private modes, no followed links, no odd files.

Everything fisk-sm keeps on disk (session journals and their locks, agent memory, event logs)
lives under `$XDG_STATE_HOME/fisk-sm` (or `~/.local/state/fisk-sm`) unless configured elsewhere.
Someone else with write access to a parent directory may plant a symlink or a FIFO where a file
is expected, so files are opened with `O_NOFOLLOW` and `O_NONBLOCK` and only regular files are
accepted. Directories are made 0700 and files 0600 whatever the umask.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "UnsafeFileError",
    "default_directory",
    "fsync_directory",
    "make_private_directory",
    "open_regular",
    "state_home",
]

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symlink",
}


class UnsafeFileError(OSError):
    """A path that is a symlink, a FIFO or anything else but a regular file; not opened."""


def state_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/fisk-sm` when that is set and absolute, else `~/.local/state/fisk-sm`."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "fisk-sm"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / "fisk-sm"


def default_directory(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/fisk-sm/runs` if set and absolute, else `~/.local/state/fisk-sm/runs`."""
    return state_home(env) / "runs"


def make_private_directory(directory: Path) -> None:
    """Create `directory` and each missing parent with mode 0700; existing ones are kept.

    `mkdir(parents=True)` would make the parents 0777 less the umask, and under umask 000 that
    leaves `fisk-sm/` itself world-writable: any local user could then plant files in it.
    """
    missing = []
    for folder in (directory, *directory.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # a racing process made it
        folder.chmod(0o700)  # mkdir's mode is masked by the umask


def _refuse(path: Path, exc: OSError) -> UnsafeFileError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: O_NOFOLLOW on the BSDs
        return UnsafeFileError(exc.errno, "a symlink; refusing to follow it", str(path))
    return UnsafeFileError(exc.errno or errno.EINVAL, exc.strerror or str(exc), str(path))


def open_regular(path: Path, flags: int, mode: int = 0o600) -> int:
    """`os.open` that refuses a symlink, never blocks on a FIFO and accepts only regular files.

    Returns the descriptor; raises `UnsafeFileError` (an OSError naming `path`) for a symlink or
    a file of another kind, and the usual OSError otherwise.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise _refuse(path, exc) from None
        if exc.errno == errno.EISDIR:  # opened for writing: refused before the fstat below
            what = f"{_KINDS[stat.S_IFDIR]}, not a regular file; refusing it"
            raise UnsafeFileError(errno.EISDIR, what, str(path)) from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = _KINDS.get(kind, "not a regular file")
        raise UnsafeFileError(errno.EINVAL, f"{what}, not a regular file; refusing it", str(path))
    return fd


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a file just created or renamed) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The standard streams of a command: never the reason it fails, or fails to shut down.

A command may start with a standard descriptor closed (`fisk-sm supervise 2>&-`), and its
stderr or stdout may be a pipe whose reader goes away (`... | head -1`, a log collector that
died). Three rules, set up once by `guard_standard_streams` before any command runs:

- A closed 0, 1 or 2 is opened on /dev/null first. Python leaves `sys.stderr` None when fd 2 is
  closed at start, and the next file the command opens would get the free number: a journal
  on fd 2 would then receive every diagnostic.
- Diagnostics never raise. `sys.stderr` becomes a `QuietStream`: the first write or flush that
  fails (a broken pipe, a vanished terminal, a closed file) points fd 2 at /dev/null, so that
  nothing tries it again and the interpreter's last flush succeeds; every line after that is
  dropped. A signal handler that reports what it does can then never be stopped by its report.
- A closed stdout ends a listing quietly: `stdout_gone` tells `fisk_sm.cli.main` whether a
  `BrokenPipeError` came from stdout (its reader left), and `silence_stdout` points fd 1 at
  /dev/null so the interpreter's last flush does not report the pipe again.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys

#: `typing.TYPE_CHECKING` without importing typing, which `fisk-sm ctl` never needs otherwise
#: (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Literal, TextIO

__all__ = ["QuietStream", "guard_standard_streams", "silence_stdout", "stdout_gone"]


def _to_devnull(fd: int) -> None:
    """Point `fd` at /dev/null (it stays open, so its number is never handed out again)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        if null != fd:
            os.dup2(null, fd, inheritable=fd <= 2)
    finally:
        if null != fd:
            os.close(null)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class QuietStream(io.TextIOBase):
    """A text stream that gives up, silently and for good, the first time writing fails."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        #: Set once a write failed: fd 2 then points at /dev/null and lines are dropped.
        self.gone = False

    def _give_up(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError):
            _to_devnull(self.stream.fileno())

    def write(self, text: str) -> int:
        """Write `text`, or drop it once the stream has failed."""
        if not self.gone:
            try:
                self.stream.write(text)
            except (OSError, ValueError):  # EPIPE, EIO; ValueError: a closed file object
                self._give_up()
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        """Write each line."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush, or do nothing once the stream has failed."""
        if not self.gone:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._give_up()

    def fileno(self) -> int:
        """The descriptor underneath (a terminal check reads it)."""
        return self.stream.fileno()

    def isatty(self) -> bool:
        """Whether the stream is a terminal (False once it failed)."""
        if self.gone:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        """Always: a write that cannot be done is dropped."""
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The wrapped stream's encoding."""
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The wrapped stream's error handler."""
        return self.stream.errors

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _reopen(fd: int, mode: Literal["r", "w"]) -> TextIO:
    return open(fd, mode, closefd=False, encoding="utf-8", errors="backslashreplace")


def guard_standard_streams() -> None:
    """Open each closed standard descriptor on /dev/null and make `sys.stderr` quiet."""
    for fd in (0, 1, 2):
        if not _is_open(fd):
            _to_devnull(fd)
    if sys.stdin is None:
        sys.stdin = _reopen(0, "r")
    if sys.stdout is None:
        sys.stdout = _reopen(1, "w")
    if sys.stderr is None:
        sys.stderr = _reopen(2, "w")
    if not isinstance(sys.stderr, QuietStream):
        sys.stderr = QuietStream(sys.stderr)


def stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll reports an error)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def silence_stdout() -> None:
    """Point fd 1 at /dev/null: what is still buffered for the reader that left is dropped."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        _to_devnull(sys.stdout.fileno())

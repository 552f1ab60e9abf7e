"""Run `fisk-sm` commands as real child processes for the crash-safety trials.

A fresh interpreter spends about 1.2 s of CPU importing the Anthropic SDK, and the trials start
hundreds of processes. So by default each command is a process forked from a multiprocessing
fork server that has imported the SDK and fisk_sm once; it runs `fisk_sm.cli.main(argv)` with
its own environment and its stdout and stderr on the log, and its exit code is the command's.
`Command(..., exec_=True)` (every command, with FISK_CRASH_EXEC=1) runs the real thing,
`python -m fisk_sm.cli ...`, exactly as a user does; a few trials always do.

multiprocessing reads a child's exit code from a pipe the fork server writes it to, and any
thread's `Process.start()` polls every other live child: two threads polling one child at once
made one of them read end-of-file, which multiprocessing reports as exit code 255. Every start
and every poll here holds `_LOCK`, so each child's code is read exactly once.

Waits have no fixed deadline: `wait` gives up only when the command has made no progress (its
log and the journal did not change) for `STALL` seconds, so a busy machine slows the trials
down without failing them, and a hung command still fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fisk_sm import cli

__all__ = ["EXEC", "STALL", "Command", "Lines", "Stalled", "run", "size"]

EXEC = os.environ.get("FISK_CRASH_EXEC") == "1"
#: Seconds without progress after which a command is taken for hung.
STALL = 120.0
_forks = multiprocessing.get_context("forkserver")
# fisk_sm.cli imports a command's module only when it runs: preload the ones the trials run.
_COMMANDS = ["fisk_sm.cli", "fisk_sm.cli.commands", "fisk_sm.cli.run"]
_forks.set_forkserver_preload(["__main__", "anthropic", *_COMMANDS, __name__])
_LOCK = threading.Lock()


class Stalled(AssertionError):
    """A command made no progress for `STALL` seconds."""


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.exit(cli.main(argv))


def size(*paths: Path) -> tuple[int, ...]:
    """The sizes of `paths` (-1 for a missing one): a cheap token of progress."""
    sizes = []
    for path in paths:
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            sizes.append(-1)
    return tuple(sizes)


class Command:
    """One `fisk-sm` command running in its own process, its stdout and stderr going to `log`."""

    def __init__(
        self, argv: list[str], env: dict[str, str], log: Path, *, exec_: bool = EXEC
    ) -> None:
        self.log = log
        self._popen: subprocess.Popen[bytes] | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        if exec_:
            with log.open("ab") as out:
                command = [sys.executable, "-m", "fisk_sm.cli", *argv]
                self._popen = subprocess.Popen(command, stdout=out, stderr=out, env=env)
        else:
            process = _forks.Process(target=_child, args=(argv, env, str(log)))
            with _LOCK:
                process.start()
            self._process = process

    @property
    def pid(self) -> int:
        if self._popen is not None:
            return self._popen.pid
        assert self._process is not None and self._process.pid is not None
        return self._process.pid

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self._popen is not None:
            return self._popen.poll()
        assert self._process is not None
        with _LOCK:
            return self._process.exitcode

    def _block(self, seconds: float) -> None:
        """Wait up to `seconds` for the process to end (without reading its exit code)."""
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(seconds)
        else:
            assert self._process is not None
            multiprocessing.connection.wait([self._process.sentinel], seconds)

    def wait(self, progress: Callable[[], object] | None = None) -> int:
        """Wait for the exit code while the command makes progress.

        `progress` returns something that changes while the command works (by default the
        size of its log); after `STALL` seconds without a change the command is killed and
        `Stalled` raised.
        """
        token = progress or (lambda: size(self.log))
        last, since = token(), time.monotonic()
        while (code := self.poll()) is None:
            self._block(0.05)
            now = token()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > STALL:
                self.kill()
                self._block(STALL)
                raise Stalled(f"fisk-sm made no progress for {STALL:g}s: {self.log}")
        return code

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process if it still runs (an exit code known means its pid may be reused)."""
        if self.poll() is None:
            if self._popen is not None:
                self._popen.send_signal(sig)
            else:
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    progress: Callable[[], object] | None = None,
    *,
    exec_: bool = EXEC,
) -> int:
    """Run a command to its end; its exit code."""
    command = Command(argv, env, log, exec_=exec_)
    try:
        return command.wait(progress)
    finally:
        if command.poll() is None:
            command.kill()
            command._block(STALL)


class Lines:
    """A child's text output (a pipe), read line by line on a thread of its own.

    `wait_for` returns once a line holds the text: a test sends its second signal only after
    the first one's "suspending" line, since two pending identical signals would coalesce.
    """

    def __init__(self, stream: Iterable[str]) -> None:
        self._lines: list[str] = []
        self._ended = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Iterable[str]) -> None:
        try:
            for line in stream:
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def wait_for(self, text: str, guard: float = STALL) -> str:
        """The first line holding `text`; fails if the stream ends (or `guard` s pass) first."""

        def found() -> str | None:
            return next((line for line in self._lines if text in line), None)

        with self._cond:
            self._cond.wait_for(lambda: found() is not None or self._ended, guard)
            line = found()
            assert line is not None, f"no line with {text!r} in: {''.join(self._lines)}"
            return line

    def text(self, guard: float = STALL) -> str:
        """Everything, once the stream has ended."""
        self._thread.join(guard)
        with self._cond:
            return "".join(self._lines)

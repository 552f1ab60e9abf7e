"""Run `fisk-sm` commands as real child processes for the crash-safety trials.

By default every command is `python -m fisk_sm.cli ...`, exactly as a user runs it. A fresh
interpreter spends about 1.5 s of CPU importing the Anthropic SDK and the trials start hundreds
of processes, so FISK_CRASH_FORK=1 offers a faster mode for local iteration: a multiprocessing
fork server imports fisk_sm and the SDK once, and every command is a process forked from it that
runs `fisk_sm.cli.main(argv)`. That mode is not the default because the fork server now and then
reports exit code 255 (its "exit status unknown") for a child that exited 0.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

from fisk_sm import cli

__all__ = ["EXEC", "Command"]

EXEC = os.environ.get("FISK_CRASH_FORK") != "1"
_forks = multiprocessing.get_context("forkserver")
_forks.set_forkserver_preload(["__main__", "anthropic", "fisk_sm.cli", __name__])


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.exit(cli.main(argv))


class Command:
    """One `fisk-sm` command running in its own process, its stdout and stderr going to `log`."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self._popen: subprocess.Popen[bytes] | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        if EXEC:
            with log.open("ab") as out:
                command = [sys.executable, "-m", "fisk_sm.cli", *argv]
                self._popen = subprocess.Popen(command, stdout=out, stderr=out, env=env)
        else:
            self._process = _forks.Process(target=_child, args=(argv, env, str(log)))
            self._process.start()

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self._popen is not None:
            return self._popen.poll()
        assert self._process is not None
        return self._process.exitcode

    def wait(self, timeout: float = 60.0) -> int:
        if self._popen is not None:
            return self._popen.wait(timeout)
        assert self._process is not None
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise TimeoutError(f"fisk-sm still running after {timeout:g}s")
        return self._process.exitcode

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process if it still runs (an exit code known means its pid may be reused)."""
        if self.poll() is None:
            if self._popen is not None:
                self._popen.send_signal(sig)
            else:
                assert self._process is not None and self._process.pid is not None
                os.kill(self._process.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(argv: list[str], env: dict[str, str], log: Path, timeout: float = 60.0) -> int:
    """Run a command to its end; its exit code."""
    command = Command(argv, env, log)
    try:
        return command.wait(timeout)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()

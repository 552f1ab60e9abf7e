"""The process table as the containment reads it, and the guard that cleans up after a SIGKILL.

The first half is what `fisk_sm.tools.reaper` scans with: a process's state, parent and start
time (``/proc/PID/stat``), the cookies in its environment (``/proc/PID/environ``), a SIGKILL
that cannot hit a recycled pid (through a pidfd), and the kill of every carrier of a cookie.

The second half is the guard: a small process, one per fisk-sm process that contains any tool,
started lazily in a session of its own and run from this file's path (``python -I``: it imports
nothing of fisk-sm, only the standard library). Its stdin is a pipe from the fisk-sm process,
which announces each containment (``+ COOKIE CGROUP``) and retires it when cleaned up
(``- COOKIE``). When the pipe ends (the fisk-sm process exited or was SIGKILLed), the guard kills
what is still announced (the cgroup whole, the carriers of the cookie), removes the cgroups and
exits. So a SIGKILLed fisk-sm still leaves nothing running, except a process that escaped the
cookie without a cgroup. Only the guard's own SIGKILL (or the machine's end) defeats it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "COOKIE_NAME",
    "SETTLE_WITHIN",
    "Seen",
    "cookies",
    "kill_carriers",
    "pids",
    "proc_stat",
    "settled_cookies",
    "sigkill",
]

#: The environment variable that marks a tool's processes.
COOKIE_NAME = "FISK_SM_COOKIE"
PROC = Path("/proc")
#: Seconds the guard waits for a killed cgroup to empty before removing it.
EMPTY_WITHIN = 5.0
#: Seconds a scan waits for processes in the middle of an exec (`settled_cookies`) to be told.
SETTLE_WITHIN = 5.0
SETTLE_POLL = 0.005
#: ``/proc/PID/stat`` fields after the command: the flags, and the environment's end address.
_ENV_END = 48
_PF_KTHREAD = 0x00200000


class Seen(NamedTuple):
    """What ``/proc/PID/stat`` says of a process (a zombie's too)."""

    state: str
    parent: int
    session: int
    #: Clock ticks after boot: with the pid, it names one process for good.
    start: int

    @property
    def dead(self) -> bool:
        """Whether it exited (a zombie, or on its way out)."""
        return self.state in ("Z", "X")


def proc_stat(pid: int) -> Seen | None:
    """What `pid` is, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return Seen(fields[0], int(fields[1]), int(fields[3]), int(fields[19]))


def cookies(pid: int) -> list[bytes]:
    """The cookies in `pid`'s environment (none if unreadable, a zombie, or unmarked)."""
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return []
    return _cookies_in(environ)


def _cookies_in(environ: bytes) -> list[bytes]:
    prefix = COOKIE_NAME.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].split(b":")
    return []


def settled_cookies(pid: int) -> list[bytes] | None:
    """`cookies`, or None while `pid`'s environment cannot be told: a live process in the
    middle of an ``exec`` has a new address space whose environment is not set up yet (its
    ``environ`` reads empty, and ``stat`` shows its end at 0), so it looks unmarked for an
    instant, though it carried the cookie and will carry it again once the ``exec`` is done."""
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except PermissionError:
        return []  # not ours to read (nor to kill); its `stat` hides the addresses too
    except OSError:
        environ = b""  # gone, or our read raced the exec (ESRCH): `stat` tells which
    if environ:
        return _cookies_in(environ)
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []  # gone
    if len(fields) <= _ENV_END or fields[0] in ("Z", "X") or int(fields[6]) & _PF_KTHREAD:
        return []  # dead, a kernel thread (no environment ever), or a kernel too old to tell
    if fields[_ENV_END] == "0":
        return None  # its environment is not in place yet
    # In place now (an empty environment, or the exec ended since the first read): read again.
    return cookies(pid)


def pids() -> Iterator[int]:
    """Every process's pid but ours."""
    try:
        names = [entry.name for entry in PROC.iterdir()]
    except OSError:
        return
    me = os.getpid()
    for name in names:
        if name.isdigit() and int(name) != me:
            yield int(name)


def sigkill(pid: int, start: int, cookie: bytes | None) -> bool:
    """SIGKILL `pid` if it is still the process seen (same start time, and carrying `cookie`
    if given); through a pidfd where there is one, so that a recycled pid is never hit."""
    pidfd = -1
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        seen = proc_stat(pid)
        if (
            seen is None
            or seen.start != start
            or (cookie is not None and cookie not in cookies(pid))
        ):
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def kill_carriers(cookie: bytes, rounds: int = 50) -> int:
    """SIGKILL every live carrier of `cookie`, scanning again until a scan finds none new and
    none in the middle of an exec (`settled_cookies`); how many were killed."""
    tried: dict[int, int] = {}
    settle_by = time.monotonic() + SETTLE_WITHIN
    while rounds > 0:
        new = 0
        unsettled = False
        for pid in pids():
            seen = proc_stat(pid)
            if seen is None or seen.dead or tried.get(pid) == seen.start:
                continue
            marks = settled_cookies(pid)
            unsettled |= marks is None
            if marks is not None and cookie in marks:
                if sigkill(pid, seen.start, cookie):
                    tried[pid] = seen.start
                    new += 1
                else:
                    unsettled = True  # it began an exec since: look again
        if new:
            rounds -= 1
        elif not unsettled or time.monotonic() > settle_by:
            break  # a scan found no carrier left, nor a process it could not tell
        else:
            time.sleep(SETTLE_POLL)
    return len(tried)


def _kill_cgroup(path: Path) -> None:
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1\n")
    deadline = time.monotonic() + EMPTY_WITHIN
    while time.monotonic() < deadline:
        try:
            if "populated 0" in (path / "cgroup.events").read_text().splitlines():
                break
        except OSError:
            return
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        path.rmdir()


def guard() -> None:
    """Read announcements from stdin until it ends; then kill what is still announced."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    announced: dict[bytes, bytes] = {}
    for line in sys.stdin.buffer:
        op, _, rest = line.rstrip(b"\n").partition(b" ")
        cookie, _, cgroup = rest.partition(b" ")
        if op == b"+":
            announced[cookie] = cgroup
        elif op == b"-":
            announced.pop(cookie, None)
    for cookie, cgroup in announced.items():
        if cgroup:
            _kill_cgroup(Path(os.fsdecode(cgroup)))
        kill_carriers(cookie)


if __name__ == "__main__":
    guard()

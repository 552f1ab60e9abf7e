"""Containment: every process a tool starts, and all it starts in turn, dies with the tool.

A process group is not enough: a descendant that calls ``setsid`` (or double-forks into a new
session) leaves it. So each exec tool call and each MCP stdio server gets a `Containment`, which
holds its descendants by up to three means, strongest first:

- **a cgroup v2** (Linux, where ours is delegated to us: a writable sub-cgroup of our own
  cgroup, with ``cgroup.kill``). An exec tool's program enters a cgroup of its own between
  fork and exec (`enter_in_child`), an MCP server is moved into one right after it starts
  (anyio takes no ``preexec_fn``); everything it forks from then on is in it whatever it does to
  its session or its environment, and ``cgroup.kill`` takes them all down. Only a process with
  the rights to move itself out escapes. Off with ``FISK_SM_CGROUP=0``.
- **an environment cookie** (any OS with ``/proc``): ``FISK_SM_COOKIE=<our pid>-<random>`` is in
  the program's environment and so in that of every descendant. The clean-up scans
  ``/proc/*/environ`` and SIGKILLs every process that carries it (through a pidfd, so a recycled
  pid is never hit), plus the descendants (by parent pid) of those it found, until a scan finds
  none. A process that replaced its environment (``env -i``, ``execve`` with its own) escapes
  the scan unless its parent still carried the cookie when the scan ran. This also covers what
  forked in the instant before the move into the cgroup.
- **the child subreaper** (Linux, ``PR_SET_CHILD_SUBREAPER``, set once per process): an orphan
  of a tool's process is re-parented to us rather than to init, so the clean-up reaps what it
  killed (no zombie left over, even where pid 1 does not reap), and the zombies of ours that
  were the containment's and exited by themselves: those of the program's session, and (with a
  cgroup) those of its cgroup. It never reaps the program itself, which asyncio or anyio waits
  for, nor any other child of ours. So, without a cgroup, an orphan in a session of its own that
  exits by itself stays a zombie of ours until we exit.

Elsewhere (no ``/proc``), only the process group is killed (`fisk_sm.tools.process`). The
scan, the cgroup writes and the reaping are blocking: they run in a worker thread.

None of these can act once our own process is SIGKILLed. For that, each containment is also
announced to this process's guard (`fisk_sm.tools.reaper_guard`: a small process in a session
of its own, started on first use), which kills what is left of the containments still open when
our process ends, however it ends. What escaped the cookie without a cgroup escapes it too; so
does everything if the guard itself is SIGKILLed with us (``kill -9`` of both).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path

from fisk_sm.tools import reaper_guard
from fisk_sm.tools.reaper_guard import (
    COOKIE_NAME,
    SETTLE_WITHIN,
    pids,
    proc_stat,
    settled_cookies,
    sigkill,
)

__all__ = ["CGROUP_SWITCH", "COOKIE_NAME", "Containment", "enable_subreaper"]

#: Set to ``0`` to never use a cgroup (the cookie and the subreaper still apply).
CGROUP_SWITCH = "FISK_SM_CGROUP"
_PR_SET_CHILD_SUBREAPER = 36
#: Bounds of the clean-up: scan rounds, and seconds to wait for killed processes to be reaped.
MAX_ROUNDS = 50
REAP_WITHIN = 5.0
_POLL = 0.005
#: Seconds a normal exit waits for the guard to finish.
GUARD_STOP = 10.0


@functools.cache
def enable_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux); whether it is."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # prctl is libc's, linked in
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@functools.cache
def _cgroup_base() -> Path | None:
    """Our own cgroup v2 directory, if we may create cgroups under it; else None."""
    try:
        lines = (reaper_guard.PROC / "self/cgroup").read_text().splitlines()
        mounts = (reaper_guard.PROC / "self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    ours = next((line[3:] for line in lines if line.startswith("0::")), None)
    if ours is None:
        return None
    for mount in mounts:
        fields = mount.split()
        if " - cgroup2 " in mount and len(fields) > 4:
            root, point = fields[3], fields[4]
            relative = os.path.relpath(ours, root) if ours.startswith(root) else None
            if relative is None:
                continue
            base = Path(point) / relative if relative != "." else Path(point)
            if os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK):
                return base
    return None


class _Guard:
    """This process's guard (`fisk_sm.tools.reaper_guard`), started on first use: told of
    each containment, it kills what is left of them if this process dies without closing
    them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._failed = False

    def tell(self, line: str) -> None:
        """Send one announcement (from a worker thread); the first `+` starts the guard, and
        a guard that is gone is not restarted."""
        with self._lock:
            if self._process is None and not self._failed and line.startswith("+"):
                try:
                    self._process = subprocess.Popen(
                        [sys.executable, "-I", reaper_guard.__file__],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,  # the terminal's signals are not for it
                        cwd="/",  # it must hold no directory busy
                        env={"PATH": os.defpath},  # no cookie of ours: never a carrier
                    )
                except OSError:
                    self._failed = True
                else:
                    atexit.register(self.stop)
            if self._process is None or self._process.stdin is None:
                return
            try:
                self._process.stdin.write(line.encode() + b"\n")
                self._process.stdin.flush()
            except OSError:
                self._failed = True

    def stop(self) -> None:
        """At a normal exit: end the guard's input and reap it (it kills what is still
        announced first), rather than leave it to whoever inherits it."""
        process = self._process
        if process is None or process.stdin is None:
            return
        with contextlib.suppress(OSError):
            process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=GUARD_STOP)


_GUARD = _Guard()


class Containment:
    """The processes of one tool call or MCP server: the cookie its environment gets, the
    cgroup it is moved into (where one can be had), and the clean-up that kills them all."""

    def __init__(self) -> None:
        #: The cookie's value: our pid, then a random part.
        self.cookie = f"{os.getpid()}-{secrets.token_hex(8)}"
        #: The cgroup directory, once made (None: no cgroup).
        self.cgroup: Path | None = None
        #: The direct child (reaped by whoever spawned it, never here).
        self.root: int | None = None
        self._opened: asyncio.Future[None] | None = None
        self._closing: asyncio.Future[int] | None = None
        #: The cgroup's cgroup.procs, open for `enter_in_child`.
        self._procs: int | None = None
        self._entered = False

    def environ(self, env: MutableMapping[str, str]) -> MutableMapping[str, str]:
        """Add the cookie to `env` (after an inherited one: a nested fisk-sm's tools carry both,
        so the outer clean-up finds them too); returns `env`."""
        inherited = env.get(COOKIE_NAME)
        env[COOKIE_NAME] = f"{inherited}:{self.cookie}" if inherited else self.cookie
        return env

    async def open(self) -> None:
        """Become the subreaper and make the cgroup (in a worker thread); before the spawn."""
        if self._opened is None:
            self._opened = asyncio.ensure_future(asyncio.to_thread(self._open))
        # A cancel must not lose a cgroup being made: `close` waits for the same future.
        await asyncio.shield(self._opened)

    def _open(self) -> None:
        if not reaper_guard.PROC.is_dir():
            return  # neither cookie scan, cgroup nor subreaper here: the group alone
        enable_subreaper()
        self._make_cgroup()
        _GUARD.tell(f"+ {self.cookie} {self.cgroup or ''}")

    def _make_cgroup(self) -> None:
        base = _cgroup_base() if os.environ.get(CGROUP_SWITCH, "1") != "0" else None
        if base is None:
            return
        path = base / f"fisk-sm-{self.cookie}"
        try:
            path.mkdir()
        except OSError:
            return
        if not (path / "cgroup.kill").exists():  # before Linux 5.14: the cookie alone
            with contextlib.suppress(OSError):
                path.rmdir()
            return
        self.cgroup = path
        with contextlib.suppress(OSError):
            self._procs = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def enter_in_child(self) -> Callable[[], None] | None:
        """A `preexec_fn` that moves the child into the cgroup between fork and exec, so that
        not even its first fork is outside (None: no cgroup). It makes one system call, on a
        descriptor opened beforehand, and never fails the spawn."""
        procs = self._procs
        if procs is None:
            return None

        def enter() -> None:
            with contextlib.suppress(OSError):
                os.write(procs, b"0")  # 0: the writing process itself

        return enter

    async def adopt(self, pid: int, *, entered: bool = False) -> None:
        """Note `pid` as the direct child and move it into the cgroup (if any; unless it
        `entered` it itself, `enter_in_child`). What it forked before the move is outside the
        cgroup, but carries the cookie."""
        self.root = pid
        self._entered = entered
        if self.cgroup is not None and not entered:
            await asyncio.to_thread(self._move, pid)

    def _move(self, pid: int) -> None:
        assert self.cgroup is not None
        # It may be gone already, or moving it refused: the cookie remains.
        with contextlib.suppress(OSError):
            (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")

    async def close(self) -> int:
        """Kill every process of the containment, reap what was re-parented to us, remove the
        cgroup; never raises (but a cancel of the caller, which the clean-up outlives). Returns
        how many processes were killed. Idempotent."""
        if self._closing is None or self._closing.done():  # one clean-up at a time
            self._closing = asyncio.ensure_future(self._close_once_opened())
        # A cancel of our caller ends this wait, not the clean-up.
        return await asyncio.shield(self._closing)

    async def _close_once_opened(self) -> int:
        if self._opened is not None:
            # Not `await`: how the opening failed is for `open`'s caller to see (it saw it).
            await asyncio.wait({self._opened})
        return await asyncio.to_thread(self._close)

    def _close(self) -> int:
        killed: dict[int, int] = {}  # pid -> start time
        whole = False
        with contextlib.suppress(OSError):
            whole = self._kill_cgroup(killed)
        # A program that entered its cgroup before it ran cannot have left anything outside
        # (but by moving it out, which takes our rights): then the scan has nothing to find.
        if not (whole and self._entered):
            self._kill_carriers(killed)
        self._reap(killed)
        if self.cgroup is not None:
            self._remove_cgroup()
        if self.cgroup is None:
            _GUARD.tell(f"- {self.cookie}")
        return len(killed)

    def _kill_cgroup(self, killed: dict[int, int]) -> bool:
        """Freeze, list and kill the cgroup; whether it was killed."""
        if self.cgroup is None:
            return False
        # Frozen first, so that what is listed is all there is (a frozen process cannot fork);
        # cgroup.kill takes frozen processes too.
        (self.cgroup / "cgroup.freeze").write_text("1\n")
        _wait_for(self.cgroup / "cgroup.events", "frozen 1")
        for line in (self.cgroup / "cgroup.procs").read_text().split():
            seen = proc_stat(int(line))
            if seen is not None:
                killed[int(line)] = seen.start
        (self.cgroup / "cgroup.kill").write_text("1\n")
        return True

    def _kill_carriers(self, killed: dict[int, int]) -> None:
        token = self.cookie.encode()
        tried = dict(killed)  # pid -> start time of those already signalled
        rounds = MAX_ROUNDS
        settle_by = time.monotonic() + SETTLE_WITHIN
        while rounds > 0:
            table = {pid: seen for pid in pids() if (seen := proc_stat(pid)) is not None}
            marks = {pid: settled_cookies(pid) for pid, seen in table.items() if not seen.dead}
            found = {pid for pid, held in marks.items() if held is not None and token in held}
            # Descendants by parent pid, so a child that replaced its environment goes too.
            children: dict[int, list[int]] = {}
            for pid, seen in table.items():
                children.setdefault(seen.parent, []).append(pid)
            stack = list(found)
            while stack:
                for child in children.get(stack.pop(), ()):
                    if child not in found:
                        found.add(child)
                        stack.append(child)
            new = [p for p in found if tried.get(p) != table[p].start and not table[p].dead]
            # A process in the middle of an exec cannot be told yet: a carrier (it is one until
            # the exec ends) outside the cgroup whose parent is dead would be missed; so the
            # scan ends only when every live process could be told.
            unsettled = any(held is None and p not in found for p, held in marks.items())
            if not new:
                if not unsettled or time.monotonic() > settle_by:
                    return
                time.sleep(_POLL)
                continue
            rounds -= 1
            for pid in new:
                start, held = table[pid].start, marks.get(pid)
                # One found by parent only is checked by start time (it has no cookie). A
                # carrier not killed (it began an exec since it was read) is not marked tried:
                # the next round looks at it again.
                if sigkill(pid, start, token if held and token in held else None):
                    killed[pid] = tried[pid] = start

    def _reap(self, killed: dict[int, int]) -> None:
        """Wait until each killed process is gone, reaping those re-parented to us; then reap
        our zombies that were the containment's and exited before the clean-up (identified by
        their session, the program's, or by their cgroup). Never the program itself, which
        its spawner reaps; gives up on one whose reaper is another living process."""
        me = os.getpid()
        waiting = {pid: start for pid, start in killed.items() if pid != self.root}
        deadline = time.monotonic() + REAP_WITHIN
        while waiting and time.monotonic() < deadline:
            for pid, start in list(waiting.items()):
                seen = proc_stat(pid)
                if seen is None or seen.start != start:
                    del waiting[pid]
                elif seen.dead and seen.parent == me:
                    _reap_one(pid)
                elif seen.dead and seen.parent not in waiting and seen.parent != self.root:
                    del waiting[pid]  # a zombie of someone else's, who will reap it
            if waiting:
                time.sleep(_POLL)
        for pid in pids():
            seen = proc_stat(pid)
            if seen is None or not seen.dead or seen.parent != me or pid == self.root:
                continue
            if (self.root is not None and seen.session == self.root) or self._held(pid):
                _reap_one(pid)

    def _held(self, pid: int) -> bool:
        """Whether `pid` is (or was, for a zombie) in the containment's cgroup."""
        if self.cgroup is None:
            return False
        try:
            lines = (reaper_guard.PROC / str(pid) / "cgroup").read_text().splitlines()
        except OSError:
            return False
        return any(
            line.startswith("0::") and line.endswith(f"/{self.cgroup.name}") for line in lines
        )

    def _remove_cgroup(self) -> None:
        assert self.cgroup is not None
        if self._procs is not None:
            os.close(self._procs)
            self._procs = None
        _wait_for(self.cgroup / "cgroup.events", "populated 0")
        # A killed process not yet reaped (the program, which its spawner's watcher reaps in a
        # moment) still holds the cgroup: EBUSY until then.
        deadline = time.monotonic() + REAP_WITHIN
        while True:
            try:
                self.cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    return  # left announced: the guard removes it when we exit
                time.sleep(_POLL)
            else:
                self.cgroup = None
                return


def _reap_one(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _wait_for(events: Path, line: str) -> bool:
    """Wait (bounded) until the cgroup's `events` file has `line`; whether it came."""
    deadline = time.monotonic() + REAP_WITHIN
    while True:
        try:
            if line in events.read_text().splitlines():
                return True
        except OSError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL)

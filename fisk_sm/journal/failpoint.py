"""Failpoints: the process signals itself at an exact journal record, for crash tests.

As databases do, a crash test names the point where the process dies instead of hoping a timer
lands there. `FISK_FAILPOINT` holds `WHEN:TYPE:N[:SIGNAL]`:

- `after:tool_started:2` sends SIGKILL to this process right after the append of its 2nd
  `tool_started` record has returned (the record is in the journal; its tool has not begun);
- `before:assistant:2` sends it right before the 2nd `assistant` record is appended (the model
  has answered, nothing of the answer is journaled: a crash in the middle of the call);
- `after:tool_result:1:SIGTERM` sends SIGTERM instead (a suspend request, under `--checkpoint`).

TYPE is a record type as journaled (`meta`, `assistant`, `tool_started`, `tool_result`, `user`,
`terminal`); N counts the appends of that type made through this process's run, from 1 (a
resumed run counts afresh; the meta of a new session is written before the run starts and is
not counted). A line on stderr names the failpoint and the last seq written before the signal.
`fisk-sm run` installs one when the variable is set (`install`); nothing else reads it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from typing import get_args

import attrs

from fisk_sm.journal.base import Journal
from fisk_sm.journal.records import Record

__all__ = ["ENV", "Failpoint", "FailpointJournal", "install", "parse", "record_type"]

#: The environment variable `fisk-sm run` reads.
ENV = "FISK_FAILPOINT"

_SPEC = re.compile(r"(after|before):([a-z_]+):([1-9][0-9]*)(?::(SIG[A-Z0-9]+))?")


def record_type(record: Record | type[Record]) -> str:
    """The journaled type of a record (`ToolStarted` -> `tool_started`)."""
    cls = record if isinstance(record, type) else type(record)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


_TYPES = frozenset(record_type(cls) for cls in get_args(Record))


@attrs.frozen
class Failpoint:
    """Send `signum` to this process `when` ("after" or "before") the `count`-th append of a
    `record` record."""

    when: str
    record: str
    count: int
    signum: signal.Signals = signal.SIGKILL

    def __str__(self) -> str:
        return f"{self.when}:{self.record}:{self.count}:{self.signum.name}"


def parse(spec: str) -> Failpoint:
    """Parse `WHEN:TYPE:N[:SIGNAL]`; a ValueError names what is wrong."""
    match = _SPEC.fullmatch(spec.strip())
    if match is None:
        raise ValueError(
            f"{ENV}={spec!r}: expected after|before:<record type>:<n>[:<SIGNAL>],"
            " e.g. after:tool_started:2"
        )
    when, record, count, name = match.groups()
    if record not in _TYPES:
        raise ValueError(f"{ENV}={spec!r}: unknown record type {record!r}")
    try:
        signum = signal.Signals[name] if name else signal.SIGKILL
    except KeyError:
        raise ValueError(f"{ENV}={spec!r}: unknown signal {name!r}") from None
    return Failpoint(when, record, int(count), signum)


class FailpointJournal:
    """A `Journal` that delegates to `inner` and fires `failpoint` at its record."""

    def __init__(self, inner: Journal, failpoint: Failpoint) -> None:
        self.inner = inner
        self.failpoint = failpoint
        self._seen = 0

    @property
    def last_seq(self) -> int:
        return self.inner.last_seq

    async def append(self, record: Record) -> None:
        point, hit = self.failpoint, False
        if record_type(record) == point.record:
            self._seen += 1
            hit = self._seen == point.count
        if hit and point.when == "before":
            self._fire()
        await self.inner.append(record)
        if hit and point.when == "after":
            self._fire()

    def _fire(self) -> None:
        sys.stderr.write(f"fisk-sm: failpoint {self.failpoint} at seq {self.last_seq}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), self.failpoint.signum)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> object:
        # Whatever else the loop or the CLI asks of the real journal (its path, ...).
        return getattr(self.inner, name)


def install(journal: Journal, env: Mapping[str, str] | None = None) -> Journal:
    """`journal` wrapped in the failpoint that `FISK_FAILPOINT` names; unchanged if unset."""
    spec = (os.environ if env is None else env).get(ENV, "")
    return FailpointJournal(journal, parse(spec)) if spec else journal

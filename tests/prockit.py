"""What /proc says of a process, for the tests that watch processes die."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` is a live process: a zombie is dead (only its exit status is left).

    A process can be reaped between the open and the read of its ``stat``: Linux then answers
    ESRCH (``ProcessLookupError``), not ENOENT, so every ``OSError`` means gone.
    """
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")

"""The rule for session (run) ids, in the standard library alone.

One copy of the rule: the file store and the JetStream store refuse a bad id with
`InvalidIdError`, and `fisk-sm ctl` (a standard-library client that never imports the journal)
refuses it before it builds a URL. An id names a file and a subject, so it cannot step out of its
directory or span subject tokens.
"""

from __future__ import annotations

import re

__all__ = ["MAX_RUN_ID", "RUN_ID_PATTERN", "run_id_problem"]

#: What a session id looks like.
RUN_ID_PATTERN = "^[a-zA-Z0-9][a-zA-Z0-9_-]*$"
#: The longest session id, in characters.
MAX_RUN_ID = 128

_RUN_ID = re.compile(RUN_ID_PATTERN.strip("^$"))


def run_id_problem(run_id: str) -> str | None:
    """Why `run_id` is not a valid session id (one line), or None when it is one."""
    if len(run_id) <= MAX_RUN_ID and _RUN_ID.fullmatch(run_id) is not None:
        return None
    return (
        f"invalid session id {run_id[: MAX_RUN_ID + 8]!r}: must match "
        f"{RUN_ID_PATTERN} and be at most {MAX_RUN_ID} characters"
    )

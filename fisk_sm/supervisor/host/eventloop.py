"""The event loop a supervisor's process runs on: uvloop where it is installed, else asyncio's.

`fisk-sm supervise` (and each of its workers) drives a thousand runs on one loop; measured side
by side (bench/supervise.py --uvloop), uvloop's loop cost about 0.6× the CPU per run of
asyncio's. `--loop asyncio` (or FISK_SM_LOOP=asyncio) keeps the standard loop; `--loop uvloop`
refuses to start without it. A library user picks their own loop: nothing here is imported by
`fisk_sm` itself. `settle` moves what start-up made (modules, config, resumed runs) out of the
cyclic collector's way, so that its passes do not walk it again and again.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["CHOICES", "ENV", "THRESHOLDS", "LoopUnavailable", "loop_name", "run", "settle"]

T = TypeVar("T")
#: `--loop` values: `auto` is uvloop when it can be imported.
CHOICES = ("auto", "uvloop", "asyncio")
ENV = "FISK_SM_LOOP"


class LoopUnavailable(Exception):
    """`--loop uvloop` on a machine without it (one line for the user)."""


def loop_name(choice: str | None = None) -> str:
    """The loop `choice` (default: $FISK_SM_LOOP, else auto) comes to: uvloop or asyncio."""
    wanted = choice or os.environ.get(ENV) or "auto"
    if wanted not in CHOICES:
        raise LoopUnavailable(f"{ENV}: must be one of {', '.join(CHOICES)}, not {wanted!r}")
    found = importlib.util.find_spec("uvloop") is not None
    if wanted == "uvloop" and not found:
        raise LoopUnavailable("--loop uvloop: uvloop is not installed (pip install uvloop)")
    return "uvloop" if wanted != "asyncio" and found else "asyncio"


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: str) -> T:
    """`asyncio.run(main)` on the loop `name` (from `loop_name`)."""
    with asyncio.Runner(loop_factory=_factory(name)) as runner:
        return runner.run(main)


#: The collector's thresholds while runs are driven: a young pass every 10,000 allocations
#: (not 700), an older one every 20 of those, the oldest every 100 of the older (measured with
#: 1,000 runs: 11 passes instead of about 185, and none of the long ones, which stalled the loop
#: by 15-70 ms of CPU each).
THRESHOLDS = (10_000, 20, 100)


def settle() -> None:
    """After start-up: collect once, freeze what is left (`gc.freeze`) so that the collector's
    later passes see only what the runs make, and space those passes out (`THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)

"""How the commands that replay (`fisk-sm run --replay`, `fisk-sm step --replay`) show where a
replay departed from its recording: the unified diff of `fisk_sm.loop.replay.divergence_diff`,
a line at a time, after the run's "failed: replay diverged at ..." line."""

from __future__ import annotations

from collections.abc import Callable

from fisk_sm.loop.replay import divergence_diff
from fisk_sm.loop.run import Run
from fisk_sm.operator.sanitize import strip_control

__all__ = ["say_divergence"]


def say_divergence(run: Run, say_line: Callable[[str], None]) -> bool:
    """Pass each line of replayed `run`'s divergence diff to `say_line`, controls stripped (the
    diff quotes what the model and the tools sent; its indentation is kept); whether there was
    one (False for a run that did not diverge, or is no replay)."""
    lines = divergence_diff(run).splitlines()
    for line in lines:
        say_line(strip_control(line))
    return bool(lines)

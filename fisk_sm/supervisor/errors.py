"""The supervisor's refusals, as the control API maps them: `NotFound` (404), `Conflict` (409),
and `AlreadyAnswered` (409, naming the answer an approval was given first)."""

from __future__ import annotations

__all__ = ["AlreadyAnswered", "Conflict", "NotFound"]


class NotFound(LookupError):
    """No such run, or no such pending approval (HTTP 404)."""


class Conflict(RuntimeError):
    """The run is in the wrong state for the action (HTTP 409)."""


class AlreadyAnswered(Conflict):
    """The approval has its answer already (given first by another operator, or another
    supervisor's): a later answer is refused, and told which one was recorded."""

    def __init__(self, run_id: str, tool_use_id: str, answer: str) -> None:
        super().__init__(f"approval {tool_use_id} of run {run_id} was already answered: {answer}")
        self.run_id = run_id
        self.tool_use_id = tool_use_id
        self.answer = answer

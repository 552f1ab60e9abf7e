"""State-entry hooks, named by `states/agent_loop.yaml`: they emit events and nothing else."""

from __future__ import annotations

from typing import Any

from fisk_sm.events.types import RunEnded, StateEntered
from fisk_sm.machine.guards import terminal_message

__all__ = ["HOOKS"]


def state_entered(run: Any) -> None:
    """Every entry into every state is one `StateEntered` event."""
    run.harness.events.emit(StateEntered(run.data.run_id, run.state, run.data.iteration))


def run_ended(run: Any) -> None:
    """A terminal state was entered: report how the run ended, with its totals."""
    data = run.data
    u = data.usage
    run.harness.events.emit(
        RunEnded(
            data.run_id,
            run.state,
            terminal_message(run.state, data, run.budget),
            data.answer() if run.state == "completed" else "",
            run.harness.config.llm.model,
            data.llm_calls,
            data.tool_calls,
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_create_tokens,
            run.elapsed(),
            tuple(sorted(data.tool_kinds.items())),
        )
    )


HOOKS = {f.__name__: f for f in (state_entered, run_ended)}

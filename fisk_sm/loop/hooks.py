"""State-entry hooks, named by `states/agent_loop.yaml`: they emit events and nothing else.

`transitions` runs them as the `on_enter` callbacks of the states the table names them for.
An event no sink reads is not built (`fisk_sm.events.types.wants`): `state_entered` runs on
every transition of every run.
"""

from __future__ import annotations

from typing import Any

from fisk_sm.config.states import States
from fisk_sm.events.types import RunEnded, StateEntered, wants
from fisk_sm.machine.guards import terminal_message

__all__ = ["HOOKS"]


def state_entered(run: Any) -> None:
    """Every entry into every state is one `StateEntered` event."""
    events = run.harness.events
    if wants(events, StateEntered):
        data = run.data
        events.emit(StateEntered(run_id=data.run_id, state=run.state, iteration=data.iteration))


def run_ended(run: Any) -> None:
    """A terminal state was entered: report how the run ended, with its totals."""
    data = run.data
    run.harness.events.emit(
        RunEnded(
            run_id=data.run_id,
            state=run.state,
            message=terminal_message(run.state, data, run.budget),
            answer=data.answer() if run.state == States.COMPLETED else "",
            model=run.harness.config.llm.model,
            iteration=data.iteration,
            llm_calls=data.llm_calls,
            tool_calls=data.tool_calls,
            usage=data.usage,
            seconds=run.elapsed(),
            tool_kinds=tuple(sorted(data.tool_kinds.items())),
        )
    )


HOOKS = {f.__name__: f for f in (state_entered, run_ended)}

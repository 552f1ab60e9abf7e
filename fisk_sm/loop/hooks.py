"""State-entry hooks, named by `states/agent_loop.yaml`: they emit events and nothing else.

`transitions` runs them as the `on_enter` callbacks of the states the table names them for.
An event no sink reads is not built (`fisk_sm.events.types.wants`): `state_entered` runs on
every transition of every run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fisk_sm.config.states import States
from fisk_sm.events.types import RunEnded, StateEntered, wants
from fisk_sm.machine.evaluator import Fire
from fisk_sm.machine.guards import terminal_message

if TYPE_CHECKING:
    from fisk_sm.loop.run import Run

__all__ = ["HOOKS"]


def state_entered(run: Run, fire: Fire | None) -> None:
    """Every entry into every state is one `StateEntered` event, naming the transition taken
    (none for the state a run starts or resumes in)."""
    events = run.harness.events
    if wants(events, StateEntered):
        data = run.data
        spec = None if fire is None else fire.taken
        event = StateEntered(
            run_id=data.run_id,
            state=run.state,
            iteration=data.iteration,
            source=None if spec is None else spec.source,
            trigger=None if spec is None else spec.trigger,
            guard=None if spec is None else spec.condition,
        )
        events.emit(event)


def run_ended(run: Run, fire: Fire | None) -> None:
    """A terminal state was entered: report how the run ended, with its totals."""
    data = run.data
    run.harness.events.emit(
        RunEnded(
            run_id=data.run_id,
            state=run.state,
            message=terminal_message(run.state, run),
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

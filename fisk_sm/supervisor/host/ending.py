"""Saying to a supervised chat (`post`: `POST /api/runs/{run_id}/say`) and ending it
(`end_chat`: `POST /api/runs/{run_id}/end`, `fisk-sm ctl end`).

A chat run waits in `awaiting_input` after each turn for what `say` posts to its `Inbox`. The
end of its input is `None` posted to that same inbox: the chat takes it at its prompt, sets
`input_ended`, and the table's `input_ended` exit leads it to `completed` (a terminal record
the journal keeps). Posting it through the inbox, not `Run.end_input`, is what makes an end
asked mid-turn wait for the next prompt: the turn finishes first (its tools, its answer), and a
follow-up posted before the end is still taken before it, in order.

Only a run a task drives here can be ended: a suspended or parked chat is resumed first
(`resume`, or an answer), a run of another supervisor is ended there.
"""

from __future__ import annotations

from fisk_sm.config.states import States
from fisk_sm.loop.actions import Inbox
from fisk_sm.supervisor.errors import Conflict
from fisk_sm.supervisor.view.tracked import ENDED, Tracked

__all__ = ["end_chat", "post"]


def post(tracked: Tracked, text: str) -> Tracked:
    """Post `text`, a follow-up, to the chat `tracked` waiting for its next prompt
    (`awaiting_input`); `Conflict` if it does not wait for one here."""
    run_id, run = tracked.entry.run_id, tracked.run
    if not tracked.live or run is None or run.state != States.AWAITING_INPUT:
        raise Conflict(f"run {run_id} is not waiting for input (state {tracked.state})")
    if not isinstance(run.input, Inbox):  # pragma: no cover - the host gives every chat one
        raise Conflict(f"run {run_id} is not a chat")
    run.input.put(text)
    return tracked


def end_chat(tracked: Tracked) -> Tracked:
    """Ask the chat `tracked` to end as `completed` at its (next) prompt; `Conflict` if it
    is not a chat, has ended, or no task drives it here."""
    run_id, status = tracked.entry.run_id, tracked.status
    run = tracked.run
    # Checked before chat-ness: an aborted or ended run refuses every action alike.
    if status in ("aborted", *ENDED) or (tracked.live and run is not None and run.finished):
        raise Conflict(f"run {run_id} has ended (status {status})")
    source = run.data if tracked.live and run is not None else tracked.snapshot
    chat = source.chat if source is not None else run is not None and run.data.chat
    if not chat:
        raise Conflict(f"run {run_id} is not a chat: only a chat can be ended (abort it)")
    if not tracked.live or run is None:
        raise Conflict(
            f"run {run_id} is not running on this supervisor (status {status}):"
            " resume it first, or end it where it runs"
        )
    if not isinstance(run.input, Inbox):  # pragma: no cover - the supervisor gives every chat one
        raise Conflict(f"run {run_id} takes no input from the supervisor")
    run.input.put(None)
    return tracked

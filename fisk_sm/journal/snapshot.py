"""A run's resumable data, and the frozen snapshot taken of it.

`RunData` is the part of a run that survives a suspend: the conversation, the iteration, the
token usage by tier and the pending tool batch. Everything else (client, tools, journal, events)
is infrastructure, rebuilt from config on every start. `RunData` is mutated in place by the phase
actions, which keeps a step O(1); `Snapshot` is its frozen, JSON-ready copy.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import attrs

from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage

if TYPE_CHECKING:  # the converter is built on first use (`to_json`, `from_json`), not at import
    import cattrs

__all__ = ["Message", "RunData", "Snapshot", "Usage", "tool_uses"]

Message = dict[str, Any]


def tool_uses(message: Message | None) -> list[Message]:
    """The tool_use blocks of an assistant message, in content order."""
    if not message:
        return []
    return [b for b in message.get("content", ()) if b.get("type") == "tool_use"]


@attrs.define
class RunData:
    """The resumable data of one run, mutated in place by the phase actions.

    `iteration` is the number of model calls the run has started (a failed call counts; the
    fold of a journal counts its assistant turns). It is the one iteration number: every event
    and journal record that carries an `iteration` carries this count as it stands when the
    event or record is made. So the first `call` state is entered at 0, and its request, reply
    (`MessageReceived`, the `assistant` record) and every state up to the next `call` are 1.
    The `iteration_cap_reached` guard compares it with `max_iterations`.
    """

    run_id: str
    prompt: str
    messages: list[Message] = attrs.Factory(list)
    iteration: int = 0
    usage: Usage = attrs.Factory(Usage)
    last_usage: Usage = attrs.Factory(Usage)
    llm_calls: int = 0
    tool_calls: int = 0
    turn: Message | None = None
    stop_reason: str | None = None
    pending: list[Message] = attrs.Factory(list)
    results: list[Message] = attrs.Factory(list)
    error: str | None = None
    interrupted: list[str] = attrs.Factory(list)
    tool_kinds: dict[str, int] = attrs.Factory(dict)
    #: The gated call waiting for the operator's answer: run_id, tool_use_id, name, input, tag.
    approval: dict[str, Any] | None = None
    #: The calls of this turn the operator denied, by tool_use_id: why ("" for a plain no).
    denials: dict[str, str] = attrs.Factory(dict)
    #: The tools the operator answered "always" for, for the rest of the run.
    allowed: list[str] = attrs.Factory(list)
    #: A chat run: after each turn it waits for the user's next prompt (`awaiting_input`).
    chat: bool = False
    #: The follow-up prompts of a chat so far; each adds `max_iterations` to the cap.
    follow_ups: int = 0
    #: The chat waits for (or was stopped waiting for) the user's next prompt.
    at_input: bool = False
    #: The user ended the chat at the prompt (`/exit`, end of input) rather than suspending it.
    input_ended: bool = False

    @classmethod
    def begin(cls, run_id: str, prompt: str) -> RunData:
        """A fresh run whose conversation is the prompt alone."""
        return cls(run_id, prompt, [{"role": "user", "content": prompt}])

    def answer(self) -> str:
        """The text of the latest assistant turn (the final answer once completed)."""
        if not self.turn:
            return ""
        return "".join(b.get("text", "") for b in self.turn["content"] if b.get("type") == "text")


@attrs.frozen
class Snapshot:
    """A frozen copy of a run: its state plus its resumable data."""

    state: str
    run_id: str
    prompt: str
    messages: tuple[Message, ...]
    iteration: int
    usage: Usage
    last_usage: Usage
    llm_calls: int
    tool_calls: int
    turn: Message | None
    stop_reason: str | None
    pending: tuple[Message, ...]
    results: tuple[Message, ...]
    error: str | None
    interrupted: tuple[str, ...] = ()
    status: str = "open"
    outcome: str | None = None
    seq: int = 0
    created: str = ""
    fingerprint: dict[str, Any] = attrs.Factory(dict)
    tool_kinds: dict[str, int] = attrs.Factory(dict)
    approval: dict[str, Any] | None = None
    denials: dict[str, str] = attrs.Factory(dict)
    allowed: tuple[str, ...] = ()
    chat: bool = False
    follow_ups: int = 0
    at_input: bool = False
    input_ended: bool = False

    @property
    def completed(self) -> bool:
        """Whether the run ended with a final answer (such a run cannot be resumed)."""
        return self.status == States.COMPLETED

    @property
    def answered(self) -> tuple[str, ...]:
        """The tool_use ids of the pending batch that already have a result."""
        return tuple(r["tool_use_id"] for r in self.results)

    def data(self) -> RunData:
        """A fresh, mutable `RunData` holding this snapshot's data."""
        return RunData(**{name: _copy(getattr(self, name), list) for name in _DATA_FIELDS})

    def to_json(self) -> str:
        """The snapshot as JSON (`Snapshot.from_json` reads it back)."""
        return json.dumps(_converter().unstructure(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        """Read a snapshot written by `to_json`."""
        snapshot: Snapshot = _converter().structure(json.loads(text), cls)
        return snapshot

    @classmethod
    def of(cls, state: str, data: RunData, **extra: Any) -> Snapshot:
        """Copy `data` (lists become tuples, so later steps cannot change it)."""
        copied = {name: _copy(getattr(data, name), tuple) for name in _DATA_FIELDS}
        return cls(state=state, **copied, **extra)


def _copy(value: Any, sequence: type) -> Any:
    """A copy of one field: lists and tuples as `sequence`, dicts as dicts, records as is."""
    if isinstance(value, list | tuple):
        return sequence(value)
    if isinstance(value, dict):
        return dict(value)
    return value


_DATA_FIELDS = tuple(f.name for f in attrs.fields(RunData))


@functools.cache
def _converter() -> cattrs.Converter:
    """The snapshot's cattrs converter, built on the first `to_json` or `from_json`."""
    import cattrs

    return cattrs.Converter()

"""A run's resumable data, and the frozen snapshot taken of it.

`RunData` is the part of a run that survives a suspend: the conversation, the iteration, the
token usage by tier and the pending tool batch. Everything else (client, tools, journal, events)
is infrastructure, rebuilt from config on every start. `RunData` is mutated in place by the phase
actions, which keeps a step O(1); `Snapshot` is its frozen, JSON-ready copy.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

import attrs

# JSON too: cattrs resolves `JSONObject`'s forward reference ("JSON") in this module's namespace
from fisk_sm.config.jsontypes import JSON, JSONObject  # noqa: F401
from fisk_sm.config.states import States
from fisk_sm.events.usage import Usage
from fisk_sm.model.blocks import (
    Block,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_of,
    message_of,
)

if TYPE_CHECKING:  # the converter is built on first use (`to_json`, `from_json`), not at import
    import cattrs

__all__ = ["Message", "PendingApproval", "RunData", "Snapshot", "Usage", "tool_uses"]


def tool_uses(message: Message | None) -> list[ToolUseBlock]:
    """The tool_use blocks of an assistant message, in content order."""
    if message is None or isinstance(message.content, str):
        return []
    return [b for b in message.content if isinstance(b, ToolUseBlock)]


@attrs.frozen
class PendingApproval:
    """A gated call waiting for the operator's answer (journaled as `approval_requested`)."""

    run_id: str
    tool_use_id: str
    name: str
    input: JSONObject
    tag: str


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
    pending: list[ToolUseBlock] = attrs.Factory(list)
    results: list[ToolResultBlock] = attrs.Factory(list)
    error: str | None = None
    interrupted: list[str] = attrs.Factory(list)
    tool_kinds: dict[str, int] = attrs.Factory(dict)
    #: The gated call waiting for the operator's answer.
    approval: PendingApproval | None = None
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
        return cls(run_id, prompt, [Message("user", prompt)])

    def answer(self) -> str:
        """The text of the latest assistant turn (the final answer once completed)."""
        if self.turn is None:
            return ""
        return "".join(b.text for b in self.turn.blocks() if isinstance(b, TextBlock))


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
    pending: tuple[ToolUseBlock, ...]
    results: tuple[ToolResultBlock, ...]
    error: str | None
    interrupted: tuple[str, ...] = ()
    status: str = "open"
    outcome: str | None = None
    seq: int = 0
    created: str = ""
    fingerprint: JSONObject = attrs.Factory(dict)
    tool_kinds: dict[str, int] = attrs.Factory(dict)
    approval: PendingApproval | None = None
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
        return tuple(r.tool_use_id for r in self.results)

    def data(self) -> RunData:
        """A fresh, mutable `RunData` holding this snapshot's data (tuples become lists)."""
        return RunData(
            run_id=self.run_id,
            prompt=self.prompt,
            messages=list(self.messages),
            iteration=self.iteration,
            usage=self.usage,
            last_usage=self.last_usage,
            llm_calls=self.llm_calls,
            tool_calls=self.tool_calls,
            turn=self.turn,
            stop_reason=self.stop_reason,
            pending=list(self.pending),
            results=list(self.results),
            error=self.error,
            interrupted=list(self.interrupted),
            tool_kinds=dict(self.tool_kinds),
            approval=self.approval,
            denials=dict(self.denials),
            allowed=list(self.allowed),
            chat=self.chat,
            follow_ups=self.follow_ups,
            at_input=self.at_input,
            input_ended=self.input_ended,
        )

    def to_json(self) -> str:
        """The snapshot as JSON (`Snapshot.from_json` reads it back)."""
        return json.dumps(_converter().unstructure(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        """Read a snapshot written by `to_json`."""
        snapshot: Snapshot = _converter().structure(json.loads(text), cls)
        return snapshot

    @classmethod
    def of(
        cls,
        state: str,
        data: RunData,
        *,
        status: str = "open",
        outcome: str | None = None,
        seq: int = 0,
        created: str = "",
        fingerprint: JSONObject | None = None,
    ) -> Snapshot:
        """Copy `data` (lists become tuples, so later steps cannot change it; the records in
        them are frozen). Every field of `RunData` is named here and in `data()`:
        tests/test_blocks_roundtrip.py fails if one is left out."""
        return cls(
            state=state,
            run_id=data.run_id,
            prompt=data.prompt,
            messages=tuple(data.messages),
            iteration=data.iteration,
            usage=data.usage,
            last_usage=data.last_usage,
            llm_calls=data.llm_calls,
            tool_calls=data.tool_calls,
            turn=data.turn,
            stop_reason=data.stop_reason,
            pending=tuple(data.pending),
            results=tuple(data.results),
            error=data.error,
            interrupted=tuple(data.interrupted),
            status=status,
            outcome=outcome,
            seq=seq,
            created=created,
            fingerprint={} if fingerprint is None else fingerprint,
            tool_kinds=dict(data.tool_kinds),
            approval=data.approval,
            denials=dict(data.denials),
            allowed=tuple(data.allowed),
            chat=data.chat,
            follow_ups=data.follow_ups,
            at_input=data.at_input,
            input_ended=data.input_ended,
        )


@functools.cache
def _converter() -> cattrs.Converter:
    """The snapshot's cattrs converter, built on the first `to_json` or `from_json`; messages
    and blocks are written in their wire form (`to_json()`) and read back by `block_of`."""
    import cattrs

    converter = cattrs.Converter()
    # open JSON (an approval's input, the fingerprint) is read back as it was written
    json_object = attrs.fields(attrs.resolve_types(PendingApproval)).input.type
    converter.register_structure_hook_func(lambda t: t == json_object, lambda value, _: value)
    converter.register_unstructure_hook(Message, lambda m: m.to_json())
    converter.register_structure_hook(Message, lambda d, _: message_of(d))
    for cls in (ToolUseBlock, ToolResultBlock):
        converter.register_unstructure_hook(cls, lambda b: b.to_json())
        converter.register_structure_hook(cls, _block_as)
    return converter


def _block_as(d: JSONObject, cls: type[ToolUseBlock | ToolResultBlock]) -> Block:
    """A pending call or a result read back from a snapshot's JSON."""
    block = block_of(d)
    if not isinstance(block, cls):
        raise ValueError(f"not a {cls.type} block: {d.get('type')!r}")
    return block

"""Typed events: what a run reports. The loop never renders anything.

Events are frozen attrs records emitted from the state-entry hooks named in the table and from
tool dispatch, to anything with an `emit(event)` method (`Events`). Adapters decide how they
look: `Recorder` keeps them for tests, `fisk_sm.events.adapters.StructlogEvents` logs them, and
`fisk_sm.cli.lineui.LineUI` draws the command line's output.

A sink may also say which kinds it reads, with a `wants(kind) -> bool` method; the loop then
skips building the events nobody reads (a `StateEntered` per transition, the answer text of
each turn). A sink without `wants` receives every event; `wants(sink, kind)` asks any sink.

An `iteration` field is always `RunData.iteration` as the event is made: the number of model
calls the run has started. Token counts travel as one `Usage`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs

from fisk_sm.events.usage import Usage

if TYPE_CHECKING:
    from fisk_sm.config.jsontypes import JSONObject

__all__ = [
    "ApprovalAsked",
    "ApprovalDenied",
    "ApprovalGranted",
    "Event",
    "Events",
    "Fanout",
    "GatedCall",
    "MessageReceived",
    "Recorder",
    "RunEnded",
    "RunResumed",
    "RunStarted",
    "StateEntered",
    "ToolCalled",
    "ToolFinished",
    "Usage",
    "WarningRaised",
    "wants",
]


@attrs.frozen
class Event:
    """Base of every event: the run it belongs to."""

    run_id: str

    @property
    def kind(self) -> str:
        """The event's name in snake case, as logs and JSON streams show it."""
        name = type(self).__name__
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")

    def fields(self) -> dict[str, object]:
        """The event's fields, run_id included; a `Usage` as a dict of its tiers."""
        fields = attrs.asdict(self, recurse=False)
        for name, value in fields.items():
            if isinstance(value, Usage):
                fields[name] = attrs.asdict(value)
        return fields


@attrs.frozen
class RunStarted(Event):
    """A run is about to take its first step."""

    model: str
    tools: tuple[str, ...]
    thinking: bool
    resumed: bool = False


@attrs.frozen
class RunResumed(Event):
    """A session was folded from its journal and continues in `state` at `iteration`."""

    state: str
    iteration: int
    #: The conversation in its wire form (JSON objects, as the journal holds them).
    messages: tuple[JSONObject, ...]
    status: str


@attrs.frozen
class StateEntered(Event):
    """The run entered `state` (one event per entry, the initial state included).

    `iteration` counts the model calls started before the entry: the first `call` is entered
    at 0, and the states after its reply at 1. `source`, `trigger` and `guard` name the
    transition that entered it: the state left, the trigger fired and the condition of the exit
    taken (None for the state's "else" exit); all three are None for the state a run starts or
    resumes in.
    """

    state: str
    iteration: int
    source: str | None = None
    trigger: str | None = None
    guard: str | None = None


@attrs.frozen
class MessageReceived(Event):
    """The model replied; `terminal` is true when this turn ends the run.

    `iteration` is the number of the call that replied (1 for the first); `usage` its tokens.
    """

    iteration: int
    stop_reason: str | None
    terminal: bool
    text: str
    usage: Usage


@attrs.frozen
class ToolCalled(Event):
    """A tool is about to run (not emitted for rejected calls)."""

    name: str
    tool_use_id: str
    #: The call's JSON input, as the model sent it (only passed on: logged, traced).
    input: Mapping[str, object]
    tool_kind: str = ""
    agent: str = ""


@attrs.frozen
class ToolFinished(Event):
    """A tool that ran has returned."""

    name: str
    tool_use_id: str
    output: str
    is_error: bool


@attrs.frozen(kw_only=True)
class GatedCall(Event):
    """Base of the confirm gate's events: the gated call (`tag` is the tag that gates it).

    Every gated call ends in one `ApprovalGranted` or `ApprovalDenied`; an `ApprovalAsked`
    comes first only when someone is actually asked (not for an "always" remembered from
    earlier in the run, nor when there is no operator).
    """

    tool: str
    tool_use_id: str
    #: The call's JSON input, as the model sent it (only passed on: logged, traced).
    arguments: Mapping[str, object]
    tag: str


@attrs.frozen(kw_only=True)
class ApprovalAsked(GatedCall):
    """A gated call is about to be put to the operator."""


@attrs.frozen(kw_only=True)
class ApprovalGranted(GatedCall):
    """A gated call may run: `answer` is "once", "always", or "remembered" (an "always"
    given earlier in the run)."""

    answer: str


@attrs.frozen(kw_only=True)
class ApprovalDenied(GatedCall):
    """A gated call was refused; `reason` says why in a few words ("declined", "no
    operator", or the prompt's failure)."""

    reason: str


@attrs.frozen
class WarningRaised(Event):
    """Something the operator should know that does not stop the run."""

    warning: str
    name: str = ""
    detail: str = ""


@attrs.frozen
class RunEnded(Event):
    """The run reached a terminal state after `iteration` model calls; `usage` is the run's
    total by tier."""

    state: str
    message: str | None
    answer: str
    model: str
    iteration: int
    llm_calls: int
    tool_calls: int
    usage: Usage
    seconds: float
    tool_kinds: tuple[tuple[str, int], ...] = ()


class Events(Protocol):
    """A sink for events. `emit` must not block the loop for long.

    Optionally, `wants(kind: type[Event]) -> bool` says whether the sink reads events of
    `kind`; the loop skips building those it does not (see `wants`).
    """

    def emit(self, event: Event) -> None: ...


def wants(sink: Events, kind: type[Event]) -> bool:
    """Whether `sink` reads events of `kind`: its own `wants` answer, else yes."""
    ask = getattr(sink, "wants", None)
    return True if ask is None else bool(ask(kind))


E = TypeVar("E", bound=Event)


@attrs.define
class Recorder:
    """Keeps every event in order; for tests and debuggers."""

    events: list[Event] = attrs.Factory(list)

    def emit(self, event: Event) -> None:
        """Record `event`."""
        self.events.append(event)

    def wants(self, kind: type[Event]) -> bool:
        """Every kind: a recorder keeps everything."""
        return True

    def of(self, kind: type[E]) -> list[E]:
        """The recorded events of one type, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    def states(self) -> list[str]:
        """The states entered, in order."""
        return [e.state for e in self.of(StateEntered)]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)


@attrs.frozen
class Fanout:
    """Sends each event to several sinks in turn."""

    sinks: tuple[Events, ...]

    def wants(self, kind: type[Event]) -> bool:
        """Whether any of the sinks reads `kind`."""
        return any(wants(sink, kind) for sink in self.sinks)

    def emit(self, event: Event) -> None:
        """Pass `event` to every sink."""
        for sink in self.sinks:
            sink.emit(event)

"""The typed records of the control API, built from its JSON: unknown keys are ignored (a newer
supervisor may add some), a missing or mistyped one is a `BadAnswer` naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from fisk_sm.client.errors import BadAnswer
from fisk_sm.client.sse import data_fields

__all__ = [
    "DROPPED",
    "GAP",
    "Approval",
    "Entry",
    "EventsGap",
    "Run",
    "StreamEvent",
    "Tokens",
    "approval_from",
    "event_from",
    "run_from",
]

#: The stream's note that a slow reader missed events.
DROPPED = "EventsDropped"
#: The stream's note that events after the reader's last id are lost.
GAP = "EventsGap"

T = TypeVar("T")


def _get(obj: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...], where: str) -> T:
    """`obj[key]`, which must be a `kind` (an int is a float too; a bool is no int)."""
    if key not in obj:
        raise BadAnswer(f"{where}.{key}: missing from the supervisor's answer")
    value = obj[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise BadAnswer(f"{where}.{key}: expected {expected}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadAnswer(f"{where}: expected an object, got {type(value).__name__}")
    return value


@attrs.frozen
class Tokens:
    """A run's token counts."""

    input: int
    output: int
    cache_read: int
    cache_creation: int
    total: int


@attrs.frozen
class Approval:
    """A tool call waiting for an operator's answer."""

    run_id: str
    tool_use_id: str
    tool: str
    input: Mapping[str, Any]
    tag: str


@attrs.frozen
class Entry:
    """One entry of a run's transcript (`Client.run`)."""

    role: str
    kind: str
    text: str
    name: str | None = None
    is_error: bool = False


@attrs.frozen
class Run:
    """A run as the API shows it; `transcript` and `path` only from `Client.run`."""

    run_id: str
    name: str
    state: str
    status: str
    iteration: int
    tokens: Tokens
    created: str
    age_seconds: float
    approval: Approval | None
    outcome: str | None
    answer: str
    owner: str | None = None
    transcript: tuple[Entry, ...] = ()
    path: tuple[str, ...] = ()


def approval_from(value: Any, where: str = "approval") -> Approval:
    """An `Approval` from the API's JSON object."""
    obj = _object(value, where)
    return Approval(
        run_id=_get(obj, "run_id", str, where),
        tool_use_id=_get(obj, "tool_use_id", str, where),
        tool=_get(obj, "tool", str, where),
        input=_get(obj, "input", dict, where),
        tag=_get(obj, "tag", str, where),
    )


def _entry(value: Any, where: str) -> Entry:
    obj = _object(value, where)
    name = obj.get("name")
    return Entry(
        role=_get(obj, "role", str, where),
        kind=_get(obj, "kind", str, where),
        text=_get(obj, "text", str, where),
        name=name if isinstance(name, str) else None,
        is_error=obj.get("is_error") is True,
    )


def run_from(value: Any, where: str = "run") -> Run:
    """A `Run` from the API's JSON object (with `transcript` and `path` when it has them)."""
    obj = _object(value, where)
    tokens = _object(_get(obj, "tokens", dict, where), f"{where}.tokens")
    approval: dict[str, Any] | None = _get(obj, "approval", (dict, type(None)), where)
    outcome: str | None = _get(obj, "outcome", (str, type(None)), where)
    owner = obj.get("owner")
    return Run(
        run_id=_get(obj, "run_id", str, where),
        name=_get(obj, "name", str, where),
        state=_get(obj, "state", str, where),
        status=_get(obj, "status", str, where),
        iteration=_get(obj, "iteration", int, where),
        tokens=Tokens(**{k: _get(tokens, k, int, f"{where}.tokens") for k in _TOKENS}),
        created=_get(obj, "created", str, where),
        age_seconds=_get(obj, "age_seconds", float, where),
        approval=None if approval is None else approval_from(approval, f"{where}.approval"),
        outcome=outcome,
        answer=_get(obj, "answer", str, where),
        owner=owner if isinstance(owner, str) else None,
        transcript=tuple(
            _entry(e, f"{where}.transcript[{i}]") for i, e in enumerate(obj.get("transcript") or ())
        ),
        path=tuple(str(s) for s in obj.get("path") or ()),
    )


_TOKENS = ("input", "output", "cache_read", "cache_creation", "total")


@attrs.frozen
class StreamEvent:
    """One event of `GET /api/events`: its name (the event's class name, or a supervisor
    event: RunSubmitted, RunParked, RunUpdated, ...), its id (`<boot>-<seq>`) and its JSON."""

    name: str
    id: str | None
    data: Mapping[str, Any]

    @property
    def run_id(self) -> str | None:
        """The run the event is of (None for a note of the stream's own)."""
        run_id = self.data.get("run_id")
        return run_id if isinstance(run_id, str) else None

    @property
    def lost_events(self) -> bool:
        """Whether events before this one are lost (a gap, or a slow reader's drop): reload
        the runs and approvals."""
        return self.name in (GAP, DROPPED)

    def run(self) -> Run:
        """The run of a RunSubmitted, RunParked or RunUpdated event (whose data is the Run)."""
        return run_from(self.data, self.name)


@attrs.frozen
class EventsGap(StreamEvent):
    """The stream could not resume after `last_event_id` without losing events (they are no
    longer held, or the supervisor restarted): reload the runs and approvals."""

    last_event_id: str = ""
    reason: str = ""


def event_from(event_id: str | None, name: str, data: str) -> StreamEvent:
    """A `StreamEvent` (an `EventsGap` for a gap) from a parsed SSE event."""
    fields = data_fields(data)
    if name == GAP:
        return EventsGap(
            name,
            event_id,
            fields,
            last_event_id=str(fields.get("last_event_id", "")),
            reason=str(fields.get("reason", "")),
        )
    return StreamEvent(name, event_id, fields)

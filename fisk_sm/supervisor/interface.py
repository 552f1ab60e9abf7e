"""The contract between the control API and whatever drives the runs (`HostControl`).

The API (`fisk_sm.supervisor.api`) speaks HTTP and calls a `HostControl`, nothing else of the
supervisor: `fisk_sm.supervisor.host.control.LocalControl` over one in-process supervisor, or a
front that routes each call to the worker process that owns the run. So every value a method
returns is a plain frozen record (`RunRow`, `ShownRun`, `client.records.Approval`, tuples of
str/int/float/None and JSON dicts) that msgspec encodes as msgpack to cross a process pipe, and
that the API turns into its JSON (`to_json`) exactly as the supervisor always answered.

Refusals are the exceptions of `fisk_sm.supervisor.errors` (`NotFound` 404, `Conflict` and
`AlreadyAnswered` 409), a `fisk_sm.config.text.UnencodableText` (400) and, from `submit`, a
`fisk_sm.config.errors.ConfigError` (logged by the API, answered 400).

A leaf: imports no part of the supervisor (tests/test_layers.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, get_args, runtime_checkable

from fisk_sm.client.records import DROPPED, GAP, Approval, Entry, Tokens
from fisk_sm.machine.path import SessionPath

__all__ = [
    "ACTIONS",
    "ANSWER_NAMES",
    "DROPPED",
    "GAP",
    "STATUSES",
    "Action",
    "Answer",
    "Controllable",
    "EventFeed",
    "HostControl",
    "RunRow",
    "ShownRun",
    "SubmitRequest",
    "Subscription",
    "approval_json",
    "entry_json",
    "parse_event_id",
]

#: What a run's `status` is, always one of these (the OpenAPI document's enum).
STATUSES = (
    "queued",
    "running",
    "parked",
    "waiting",
    "suspended",
    "completed",
    "failed",
    "budget_exhausted",
    "iterations_exhausted",
    "aborted",
)

#: An operator's action on a run (`POST /api/runs/{id}/<action>`).
Action = Literal["suspend", "resume", "abort", "end"]
ACTIONS: tuple[Action, ...] = get_args(Action)
#: An operator's answer to a pending approval.
Answer = Literal["once", "always", "deny"]
ANSWER_NAMES: tuple[Answer, ...] = get_args(Answer)

_ID = re.compile(r"([0-9a-fA-F]{1,64})-([0-9]{1,19})")


def parse_event_id(text: str) -> tuple[str, int] | None:
    """`(boot, seq)` of an event id `<hex>-<int>`, or None if `text` is not one."""
    found = _ID.fullmatch(text)
    return None if found is None else (found.group(1).lower(), int(found.group(2)))


def approval_json(approval: Approval) -> dict[str, Any]:
    """The API's `Approval` object."""
    return {
        "run_id": approval.run_id,
        "tool_use_id": approval.tool_use_id,
        "tool": approval.tool,
        "input": approval.input,
        "tag": approval.tag,
    }


def entry_json(entry: Entry) -> dict[str, Any]:
    """The API's transcript `Entry` object: a tool call has its `name`, a result `is_error`."""
    shown: dict[str, Any] = {"role": entry.role, "kind": entry.kind, "text": entry.text}
    if entry.kind == "tool_use":
        shown["name"] = entry.name or ""
    elif entry.kind == "tool_result":
        shown["is_error"] = entry.is_error
    return shown


class SubmitRequest(NamedTuple):
    """A new run (`POST /api/runs`): `config` is a path the API has confined already."""

    prompt: str
    name: str | None = None
    config: str | None = None
    chat: bool = False


class RunRow(NamedTuple):
    """What the API's `Run` object shows of a run, taken at `at`: plain values, cheap to take;
    the JSON is built from them only when someone reads it (`to_json`)."""

    run_id: str
    name: str
    state: str
    status: str
    iteration: int
    tokens: Tokens
    created: float
    approval: Approval | None
    outcome: str | None
    answer: str
    owner: str | None  # a cluster's: the supervisor that drives the run; None: not in one
    at: float  # when the row was taken (`age_seconds` is its age then)

    def to_json(self) -> dict[str, Any]:
        """The API's `Run` object (with `owner` in a cluster)."""
        tokens = self.tokens
        shown = {
            "run_id": self.run_id,
            "name": self.name,
            "state": self.state,
            "status": self.status,
            "iteration": self.iteration,
            "tokens": {
                "input": tokens.input,
                "output": tokens.output,
                "cache_read": tokens.cache_read,
                "cache_creation": tokens.cache_creation,
                "total": tokens.total,
            },
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "age_seconds": round(max(0.0, self.at - self.created), 3),
            "approval": None if self.approval is None else approval_json(self.approval),
            "outcome": self.outcome,
            "answer": self.answer,
        }
        if self.owner is not None:
            shown["owner"] = self.owner
        return shown

    def event_json(self, kind: str) -> dict[str, Any]:
        """The row as the stream's event `kind` (`RunSubmitted`, `RunUpdated`, `RunParked`)."""
        return {"type": kind, **self.to_json()}


class ShownRun(NamedTuple):
    """A run's page (`GET /api/runs/{id}`): its row, the transcript's tail, the states entered."""

    row: RunRow
    transcript: tuple[Entry, ...]
    path: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The API's `Run` object with `transcript` and `path`."""
        entries = [entry_json(entry) for entry in self.transcript]
        return {**self.row.to_json(), "transcript": entries, "path": list(self.path)}


class Subscription(Protocol):
    """One reader of the event stream."""

    def events(self) -> AsyncIterator[tuple[str, str, str]]:
        """(event id, event name, JSON text), as they come, until the stream ends."""
        ...


class EventFeed(Protocol):
    """The event stream: every run's events (`GET /api/events`), each with its id."""

    def subscribe(self, run_id: str | None = None, after: str | None = None) -> Subscription:
        """A reader of one run's events or of all, first those held after the event id `after`
        (a valid one: `parse_event_id`), or an `EventsGap` note if some are lost."""
        ...

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop feeding `subscription` (a reader gone)."""
        ...


class HostControl(Protocol):
    """What the control API asks of the runs' host. Run ids are checked (`check_run_id`) by
    the API before they get here; an unknown one is `NotFound`."""

    @property
    def config_path(self) -> Path | None:
        """The host's agent.yaml (its directory: the default confinement of run configs)."""
        ...

    @property
    def events(self) -> EventFeed:
        """The event stream."""
        ...

    async def submit(self, request: SubmitRequest) -> RunRow:
        """Start a run (a chat with `request.chat`)."""
        ...

    async def listing(self) -> Sequence[RunRow]:
        """Every run, newest first."""
        ...

    async def row(self, run_id: str) -> RunRow:
        """The run's row as this host knows it now (no refresh of other members' runs)."""
        ...

    async def show(self, run_id: str) -> ShownRun:
        """The run with its transcript's tail and the states it entered."""
        ...

    async def session_path(self, run_id: str) -> SessionPath | None:
        """The run's path through the state machine, None if its journal has none."""
        ...

    async def approvals(self) -> Sequence[Approval]:
        """Every pending approval."""
        ...

    async def act(self, run_id: str, action: Action) -> RunRow:
        """Suspend, resume, abort or end (a chat, at its next prompt) the run."""
        ...

    async def say(self, run_id: str, text: str) -> RunRow:
        """Post a follow-up to a chat waiting for its next prompt."""
        ...

    async def answer(self, run_id: str, tool_use_id: str, answer: Answer) -> RunRow:
        """Answer a pending approval, once (a later answer: `AlreadyAnswered`)."""
        ...


@runtime_checkable
class Controllable(Protocol):
    """What hands out a `HostControl` of itself (a `Supervisor`: `build_app(supervisor)`)."""

    def control(self) -> HostControl:
        """A `HostControl` over this host."""
        ...

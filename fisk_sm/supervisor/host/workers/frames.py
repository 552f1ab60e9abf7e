"""The frames between the front and its workers: msgspec structs, sent as msgpack.

On the wire a frame is a 4-byte big-endian length, then that many bytes of msgpack (at most
`MAX_FRAME`): one `Message`, which is a `Call` (with an id, answered by one `Reply` of the same
id), a `Reply`, or a `Note` (no answer). Their bodies are the tagged structs below.

Front to worker: `Hello` (first, once), `Submit`, `Adopt`, `Act`, `Say`, `AnswerCall`, `Show`,
`PathOf`, `RowOf`, `List`, `ListApprovals`, `Shutdown` (calls); `Watch` (a note: which events
the front wants, sent whenever that changes). Worker to front: `Register` and `Mark` (calls: the
front is the one writer of runs.jsonl); `Events` and `Stopped` (notes). A reply's `value` is
plain data (the interface's records, as msgpack arrays and maps); a refusal travels as a
`Refusal` and is raised again on the caller's side as the same kind of exception
(`refusal_of`, `raise_refusal`).
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import msgspec

from fisk_sm.config.errors import ConfigError
from fisk_sm.config.text import UnencodableText
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filestore import InvalidIdError
from fisk_sm.supervisor.errors import AlreadyAnswered, Conflict, NotFound
from fisk_sm.supervisor.host.registry import RegistryEntry

__all__ = [
    "CROSSING",
    "HEADER",
    "MAX_FRAME",
    "Act",
    "Adopt",
    "AnswerCall",
    "Body",
    "Call",
    "Entry",
    "Events",
    "Hello",
    "List",
    "ListApprovals",
    "Mark",
    "Message",
    "Note",
    "PathOf",
    "Refusal",
    "Register",
    "RemoteError",
    "Reply",
    "RowOf",
    "Say",
    "Show",
    "Shutdown",
    "Stopped",
    "Submit",
    "Summary",
    "Watch",
    "WorkerLost",
    "WorkerSpec",
    "decode",
    "encode",
    "entry_of",
    "frame_entry",
    "raise_refusal",
    "refusal_of",
]

#: The largest frame body either side sends or takes (a larger length is a torn stream).
MAX_FRAME = 64 << 20
HEADER = struct.Struct(">I")


class WorkerLost(ConnectionError):
    """The other end of a channel is gone (EOF, a torn frame): no reply will come."""


class RemoteError(RuntimeError):
    """The other end failed on a call with an error that is no refusal (a bug, a disk)."""


class Frame(msgspec.Struct, frozen=True, tag=True):
    """A frame's body; its tag is its class name."""


class Watch(Frame, frozen=True):
    """Which events the front wants: all of them, or those of `runs`."""

    all: bool = False
    runs: frozenset[str] = frozenset()


class WorkerSpec(msgspec.Struct, frozen=True):
    """What a worker is: its index, the agent.yaml, the state directory, its share of the
    concurrency, the directories configs may come from, OpenTelemetry, what the front watches."""

    index: int
    config: str
    state_dir: str
    concurrency: int
    config_dirs: tuple[str, ...] = ()
    otel: bool = False
    watch: Watch = Watch()


class Entry(msgspec.Struct, frozen=True):
    """A registry entry (`RegistryEntry`) as it crosses the pipe."""

    run_id: str
    name: str
    config: str
    created: float
    disposition: str


def entry_of(entry: Entry) -> RegistryEntry:
    """The registry entry of a frame's `Entry`."""
    return RegistryEntry(**msgspec.structs.asdict(entry))


def frame_entry(entry: RegistryEntry) -> Entry:
    """A registry entry as a frame's `Entry`."""
    return Entry(**attrs.asdict(entry))


class Hello(Frame, frozen=True):
    spec: WorkerSpec


class Submit(Frame, frozen=True):
    run_id: str
    prompt: str
    name: str | None = None
    config: str | None = None
    chat: bool = False


class Adopt(Frame, frozen=True):
    """Take these runs over (a dead worker's, or a start's): resume those the crash rules
    resume, list the rest. The reply: the ids resumed."""

    entries: tuple[Entry, ...]


class Act(Frame, frozen=True):
    run_id: str
    action: str  # suspend, resume, abort, end


class Say(Frame, frozen=True):
    run_id: str
    text: str


class AnswerCall(Frame, frozen=True):
    run_id: str
    tool_use_id: str
    answer: str  # once, always, deny


class Show(Frame, frozen=True):
    run_id: str


class PathOf(Frame, frozen=True):
    run_id: str


class RowOf(Frame, frozen=True):
    run_id: str


class List(Frame, frozen=True):
    pass


class ListApprovals(Frame, frozen=True):
    pass


class Shutdown(Frame, frozen=True):
    pass


class Summary(msgspec.Struct, frozen=True):
    """A worker's answer to `Shutdown`: the runs it marked, what it leaves."""

    marked: tuple[str, ...] = ()
    resuming: int = 0
    parked: int = 0
    suspended: int = 0


class Register(Frame, frozen=True):
    """A new run for runs.jsonl (the reply: its `Entry`, durable; a known id's as it is)."""

    run_id: str
    name: str
    config: str


class Mark(Frame, frozen=True):
    """A disposition of runs for runs.jsonl, durable before the reply."""

    disposition: str
    run_ids: tuple[str, ...]


class Events(Frame, frozen=True):
    """Events of the worker's runs, in order: (run_id, name, JSON text)."""

    items: tuple[tuple[str, str, str], ...]


class Stopped(Frame, frozen=True):
    """The task driving `run_id` ended."""

    run_id: str


Body = (
    Hello
    | Submit
    | Adopt
    | Act
    | Say
    | AnswerCall
    | Show
    | PathOf
    | RowOf
    | List
    | ListApprovals
    | Shutdown
    | Watch
    | Register
    | Mark
    | Events
    | Stopped
)


class Refusal(msgspec.Struct, frozen=True):
    """An exception of the callee, to raise again at the caller."""

    kind: str
    message: str
    run_id: str = ""
    tool_use_id: str = ""
    answer: str = ""


class Call(msgspec.Struct, frozen=True, tag=True):
    id: int
    body: Body


class Reply(msgspec.Struct, frozen=True, tag=True):
    id: int
    value: Any = None
    error: Refusal | None = None


class Note(msgspec.Struct, frozen=True, tag=True):
    body: Body


Message = Call | Reply | Note

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    """`message` as a frame: its length, then its msgpack."""
    body = _encoder.encode(message)
    if len(body) > MAX_FRAME:
        raise ValueError(f"a frame of {len(body)} bytes is over {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """The message of a frame's body (`msgspec.DecodeError` if it is not one)."""
    return _decoder.decode(body)


class _RemoteConfigError(ConfigError):
    def __init__(self, message: str) -> None:  # pylint: disable=super-init-not-called
        ValueError.__init__(self, message)
        self.source, self.field, self.problem = "", "", message


#: The refusals that cross, by kind; the most specific class first.
_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("already_answered", AlreadyAnswered),
    ("not_found", NotFound),
    ("conflict", Conflict),
    ("unencodable", UnencodableText),
    ("config", ConfigError),
    ("invalid_id", InvalidIdError),
    ("value", ValueError),
)


#: What a callee's failure may be to cross as a refusal (a refusal, a journal's or a disk's
#: error); anything else is a bug, which ends the channel instead.
CROSSING = (LookupError, ValueError, RuntimeError, OSError, JournalError)


def refusal_of(exc: Exception) -> Refusal:
    """`exc` as a `Refusal` (kind "error" for one that is not a refusal)."""
    for kind, cls in _KINDS:
        if isinstance(exc, cls):
            if isinstance(exc, AlreadyAnswered):
                return Refusal(kind, str(exc), exc.run_id, exc.tool_use_id, exc.answer)
            return Refusal(kind, str(exc))
    return Refusal("error", f"{type(exc).__name__}: {exc}")


def raise_refusal(refusal: Refusal) -> None:
    """Raise `refusal` as the exception it was."""
    kind, message = refusal.kind, refusal.message
    if kind == "already_answered":
        raise AlreadyAnswered(refusal.run_id, refusal.tool_use_id, refusal.answer)
    if kind == "config":
        raise _RemoteConfigError(message)
    for known, cls in _KINDS:
        if known == kind:
            raise cls(message)
    raise RemoteError(message)

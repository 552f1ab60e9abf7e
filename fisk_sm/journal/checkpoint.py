"""Checkpoints: a resume that decodes only what a journal gained since it was last read.

A session's checkpoint is a file beside its journal, `<id>.ckpt`. It holds, for the journal's
first `size` bytes (up to a turn boundary: right after an assistant or a user record, where the
fold holds nothing of an open turn but the turn itself), their XXH3-64 digest and the fold's
facts at that point: the counters and usage, the last turn and terminal record, and where each
message of the conversation lies in those bytes, down to the span of its JSON value in its line
(`fisk_sm.journal.wirebytes`).

A resume (`FileStore.open`, then `resume_fold`) that finds a checkpoint whose size and digest
match the journal's bytes trusts those bytes as checked when the checkpoint was written: it
checks them with one hash pass, decodes the meta and the lines after the checkpoint (each
checked as ever), folds on from the checkpoint's facts, and keeps each earlier message as its
bytes: the next request sends them as they are (`Message.raw`), and they are decoded only if
something reads the message (`fisk_sm.model.later`). The few that cannot be sent so (a merged
user message, a line msgspec refuses) are read by the fold. Anything else (no checkpoint, one
that does not parse, of another version, or whose size or digest does not match: a torn, cut
or corrupted journal, a flipped byte) falls back to reading every line, to the same records
and the same errors as without checkpoints.

The journal is unchanged: a checkpoint is a cache of a function of the journal's bytes, so a lost,
stale, torn or foreign one costs time, never data, and an older fisk-sm reads the journal as it
always did (it never opens this file). `resume_fold` writes a new one when the journal has grown
by `EVERY` records past the last (or has none): in the worker thread that resumes the session,
by a rename, without fsync (a checkpoint a crash tore does not parse, or does not match).
"""

from __future__ import annotations

import array
import itertools
import os
import sys
import zlib
from pathlib import Path

import msgspec
from xxhash import xxh3_64_intdigest

from fisk_sm.config.table import Table
from fisk_sm.events.usage import Usage
from fisk_sm.journal.fold import Folding
from fisk_sm.journal.records import Assistant, Meta, Record, Terminal, ToolResult, User
from fisk_sm.journal.statedir import open_regular
from fisk_sm.journal.wirebytes import (
    MESSAGE,
    MIXED,
    ONE,
    PART,
    PROMPT,
    RESULT,
    RESULTS,
    Loader,
    value_span,
)
from fisk_sm.model.later import later_all

__all__ = [
    "EVERY",
    "SUFFIX",
    "Checkpoint",
    "checkpoint_path",
    "load_checkpoint",
    "restore",
    "take",
    "write_checkpoint",
]

#: A checkpoint's file is its journal's, with this suffix instead of `.json`.
SUFFIX = ".ckpt"
#: 2: each part has the span of its value (`fisk_sm.journal.wirebytes`); a checkpoint of 1 is
#: not read (the journal is, line by line, and a new checkpoint written).
VERSION = 2
#: Records past the last checkpoint (or in a journal without one) before a new one is written.
EVERY = 64
#: The roles a checkpoint can name, one letter each (a message of another role: no checkpoint).
_ROLES = {"user": "u", "assistant": "a"}
_ROLE_OF = {letter: role for role, letter in _ROLES.items()}
#: The roles' letters as words (`str.translate`), a space after each.
_NAMES = str.maketrans({letter: f"{role} " for letter, role in _ROLE_OF.items()})


class Checkpoint(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The fold of a journal's first `size` bytes (see the module), as the file holds it."""

    version: int
    size: int
    #: The XXH3-64 of the journal's first `size` bytes (version 1 held their CRC-32: xxh3
    #: reads 2.6 MB in 0.05 ms, against 0.6 ms, and a resume checks them every time).
    digest: int
    #: The seq of the last record it covers (its boundary: an assistant or a user record).
    seq: int
    llm_calls: int
    tool_calls: int
    follow_ups: int
    usage: tuple[int, int, int, int]
    last_usage: tuple[int, int, int, int]
    tool_kinds: dict[str, int]
    allowed: list[str]
    #: The seq of the last assistant record (0: none) and the index of its message, its stop
    #: reason, and whether its turn is still open (no user record since).
    turn: int
    turn_message: int
    stop_reason: str | None
    open_turn: bool
    #: The last terminal record: seq, reason, message.
    terminal: tuple[int, str, str | None] | None
    #: Each message's role, one letter (`_ROLES`).
    roles: str
    #: The messages that cannot be sent as the journal's bytes (`wirebytes.Loader.pieces`), by
    #: index: `restore` reads them at once.
    decoded: list[int]
    #: Each message's parts, as 64-bit little-endian integers (`_array`): a head,
    #: `count * 4 + how` (ONE, RESULTS, MIXED), then `count` parts of `PART`: the seq of the
    #: record, the start and end of its line, MESSAGE, RESULT or PROMPT, and the span of the
    #: value the message takes from the line (0, 0: none; `wirebytes.value_span`).
    table: bytes
    #: Where each message's entry starts in `table` (the same integers).
    at: bytes
    #: The CRC-32 of `table` and `at`: a table torn or changed since it was written is not read.
    seal: int


_decoder = msgspec.json.Decoder(Checkpoint)
_encoder = msgspec.json.Encoder()


def checkpoint_path(journal: Path) -> Path:
    """Where the checkpoint of `journal` lives."""
    return journal.with_suffix(SUFFIX)


def load_checkpoint(journal: Path, data: bytes) -> Checkpoint | None:
    """The journal's checkpoint if it holds for `data`, else None (never raises)."""
    try:  # a planted symlink or FIFO is refused as the journal's are (`open_regular`)
        fd = open_regular(checkpoint_path(journal), os.O_RDONLY)
        try:
            # never near the size of its journal (some 40 bytes a record, against hundreds)
            limit = 2 * len(data) + 4096
            raw = os.read(fd, limit + 1)
        finally:
            os.close(fd)
        found = _decoder.decode(raw) if len(raw) <= limit else None
    except (OSError, msgspec.DecodeError):
        return None
    if found is None:
        return None
    size = found.size
    if found.version != VERSION or not 0 < size <= len(data) or data[size - 1] != 0x0A:
        return None
    if xxh3_64_intdigest(memoryview(data)[:size]) != found.digest:
        return None
    return found if _consistent(found) else None


def _consistent(found: Checkpoint) -> bool:
    """Whether the checkpoint's table is one this module wrote, whole (its seal holds). A
    checkpoint is trusted like the journal beside it, in the same private directory: a hand-made
    one whose table does not read, or whose messages `restore` reads do not, falls back to
    reading every line (`Records.fold`); the spans of the others are sent as they point, like
    any other fact of a sealed table."""
    table = _array(found.table)
    if table is None or len(table) <= PART or not found.roles or set(found.roles) - set(_ROLE_OF):
        return False
    if zlib.crc32(found.at, zlib.crc32(found.table)) != found.seal:
        return False
    if len(found.at) != 8 * len(found.roles):
        return False
    return table[1] == 1 and (found.turn == 0 or 0 <= found.turn_message < len(found.roles))


def _array(raw: bytes) -> array.array[int] | None:
    """The 64-bit integers of `raw` (little-endian, whatever the machine), or None."""
    if len(raw) % 8:
        return None
    table = array.array("q")
    table.frombytes(raw)
    if _BIG:
        table.byteswap()
    return table


def _packed(table: array.array[int]) -> bytes:
    """`table` as `_array` reads it."""
    if _BIG:
        table = array.array("q", table)
        table.byteswap()
    return table.tobytes()


_BIG = sys.byteorder == "big"


def _tiers(usage: Usage) -> tuple[int, int, int, int]:
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_create_tokens,
    )


def take(
    folding: Folding, seq: int, data: bytes, base: Checkpoint | None, tail: list[Record]
) -> Checkpoint | None:
    """The checkpoint of `data` up to record `seq`, the turn boundary `folding` just passed,
    folded from `base` (None: from the meta) and the records of `tail`; None if a message has
    a role a checkpoint cannot name."""
    run, flat = folding.data, folding.sources
    assert flat is not None  # tracked
    sources, bounds = flat.tolist(), [*folding.starts.tolist(), len(flat)]
    try:
        roles = "".join([_ROLES[m.role] for m in run.messages])
    except KeyError:
        return None
    spots = _spots(base) if base is not None else {1: (1, 0, 0, PROMPT, 0, 0)}
    start = base.size if base is not None else data.index(b"\n") + 1
    find, field_of = data.index, _FIELD_OF.get
    for record in tail:
        if record.seq > seq:
            break
        end = find(b"\n", start)
        field = field_of(type(record))
        if field is not None:
            spots[record.seq] = (
                record.seq,
                start,
                end,
                field,
                *value_span(data, start, end, record),
            )
        start = end + 1
    table, at, decoded = array.array("q"), array.array("q"), []
    extend, mark = table.extend, at.append
    for index, (first, after) in enumerate(itertools.pairwise(bounds)):
        mark(len(table))
        entries = [spots[part] for part in sources[first:after]]
        if len(entries) == 1:
            how = _HOW[entries[0][3]]
        else:
            how = RESULTS if all(entry[3] == RESULT for entry in entries) else MIXED
        table.append(4 * len(entries) + how)  # (4: the head's count, whatever PART is)
        for entry in entries:
            extend(entry)
        if how == MIXED or not all(entry[5] for entry in entries):
            decoded.append(index)
    turn, terminal = folding.turn_seq, folding.terminal
    turn_message = next(
        (
            i
            for i in range(len(bounds) - 2, -1, -1)
            if bounds[i + 1] - bounds[i] == 1 and sources[bounds[i]] == turn
        ),
        -1,
    )
    return Checkpoint(
        version=VERSION,
        size=start,
        digest=xxh3_64_intdigest(memoryview(data)[:start]),
        seq=seq,
        llm_calls=run.llm_calls,
        tool_calls=run.tool_calls,
        follow_ups=run.follow_ups,
        usage=_tiers(run.usage),
        last_usage=_tiers(run.last_usage),
        tool_kinds=dict(run.tool_kinds),
        allowed=list(run.allowed),
        turn=turn,
        turn_message=turn_message,
        stop_reason=run.stop_reason,
        open_turn=folding.turn is not None,
        terminal=(terminal.seq, terminal.reason, terminal.message) if terminal else None,
        roles=roles,
        decoded=decoded,
        table=(raw := _packed(table)),
        at=(starts := _packed(at)),
        seal=zlib.crc32(starts, zlib.crc32(raw)),
    )


#: The part of a message each record holds, by its type (others hold none).
_FIELD_OF: dict[type, int] = {Assistant: MESSAGE, User: MESSAGE, ToolResult: RESULT}
#: How a message of one part is read, by that part.
_HOW = {MESSAGE: ONE, RESULT: RESULTS, PROMPT: MIXED}


def _spots(base: Checkpoint) -> dict[int, tuple[int, ...]]:
    """Each part of a checkpoint's messages, by the seq of its record (its `PART` integers)."""
    table, spots, position = _array(base.table), {}, 0
    assert table is not None  # checked when read
    while position < len(table):
        count = table[position] >> 2
        parts = table[position + 1 : position + 1 + PART * count]
        for part in zip(*[iter(parts)] * PART, strict=True):
            spots[part[0]] = part
        position += 1 + PART * count
    return spots


def restore(base: Checkpoint, meta: Meta, table: Table | None, data: bytes, track: bool) -> Folding:
    """A fold standing where `base` was taken (its messages read from `data` on first use)."""
    folding = Folding(meta, table, track=track)
    run = folding.data
    parts = _array(base.table)
    assert parts is not None  # checked when read
    at = _array(base.at)
    assert at is not None  # checked when read
    prompt = parts[0] == 4 + MIXED  # the first message is the prompt alone, as it mostly is
    roles = base.roles[prompt:].translate(_NAMES).split()
    loader = Loader(data, parts, meta.prompt)
    later = later_all(loader.load, roles, at[prompt:], loader.pieces)
    run.messages = messages = [run.messages[0], *later] if prompt else later
    for index in base.decoded:
        messages[index].to_json()  # read now (the resume's worker thread), not by a request
    run.llm_calls = run.iteration = base.llm_calls
    run.tool_calls, run.follow_ups = base.tool_calls, base.follow_ups
    run.usage, run.last_usage = Usage(*base.usage), Usage(*base.last_usage)
    run.tool_kinds, run.allowed = dict(base.tool_kinds), list(base.allowed)
    run.stop_reason = base.stop_reason
    if base.turn:
        run.turn = messages[base.turn_message]
    folding.turn_seq = base.turn
    if base.open_turn:
        # Only whether a turn is open matters to the fold from here (not its record).
        folding.turn = Assistant(base.turn, base.llm_calls, {}, base.stop_reason)
    if base.terminal is not None:
        folding.terminal = Terminal(*base.terminal)
    folding.last_seq = base.seq
    if track:
        folding.sources, folding.starts = _sources(parts)
    return folding


def _sources(table: array.array[int]) -> tuple[array.array[int], array.array[int]]:
    """The seqs each message is read from, as `Folding.sources` and `Folding.starts` hold them."""
    sources, starts, position = array.array("q"), array.array("q"), 0
    while position < len(table):
        count = table[position] >> 2
        starts.append(len(sources))
        sources.extend(table[position + 1 : position + 1 + PART * count : PART])
        position += 1 + PART * count
    return sources, starts


def write_checkpoint(journal: Path, checkpoint: Checkpoint) -> bool:
    """Write `checkpoint` for `journal` (a new file renamed over the old, no fsync: see the
    module); False if the directory would not take it (a checkpoint is only ever a shortcut)."""
    target = checkpoint_path(journal)
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        fd = open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            view = memoryview(_encoder.encode(checkpoint))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        temporary.replace(target)
    except OSError:
        temporary.unlink(missing_ok=True)
        return False
    return True

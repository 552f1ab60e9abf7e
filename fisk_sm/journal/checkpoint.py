"""Checkpoints: a resume that decodes only what a journal gained since it was last read.

A session's checkpoint is a file beside its journal, `<id>.ckpt`. It holds, for the journal's
first `size` bytes (up to a turn boundary: right after an assistant or a user record, where the
fold holds nothing of an open turn but the turn itself), their CRC-32 and the fold's facts at
that point: the counters and usage, the last turn and terminal record, and where each message of
the conversation lies in those bytes.

A resume (`FileStore.open`, then `resume_fold`) that finds a checkpoint whose size and checksum
match the journal's bytes trusts those bytes as checked when the checkpoint was written: it
checks them with one checksum pass, decodes the meta and the lines after the checkpoint (each
checked as ever), folds on from the checkpoint's facts, and keeps each earlier message as its
bytes, read once on first use (`Message.later_all`; `resume_fold` reads them all in its worker
thread). Anything else (no checkpoint, one that does not parse, of another version, or whose
size or checksum does not match: a torn, cut or corrupted journal, a flipped byte) falls back to
reading every line, to the same records and the same errors as without checkpoints.

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

from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.config.table import Table
from fisk_sm.events.usage import Usage
from fisk_sm.journal.decode import _loads
from fisk_sm.journal.fold import Folding
from fisk_sm.journal.records import Assistant, Meta, Record, Terminal, ToolResult, User
from fisk_sm.journal.statedir import open_regular
from fisk_sm.model.blocks import Block, Message, TextBlock, block_of, message_of

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
VERSION = 1
#: Records past the last checkpoint (or in a journal without one) before a new one is written.
EVERY = 64
#: A message's part: the line's `message` (an assistant or a user record), its `result` (a tool
#: result), or the prompt (the meta's).
MESSAGE, RESULT, PROMPT = 0, 1, 2
_FIELDS = ("message", "result")
#: How a message is read from its parts: one record's message, a turn's results, or any other
#: mix (a user message merged from several records, the prompt among them).
ONE, RESULTS, MIXED = 0, 1, 2
#: The roles a checkpoint can name, one letter each (a message of another role: no checkpoint).
_ROLES = {"user": "u", "assistant": "a"}
_ROLE_OF = {letter: role for role, letter in _ROLES.items()}


class Checkpoint(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The fold of a journal's first `size` bytes (see the module), as the file holds it."""

    version: int
    size: int
    crc: int
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
    #: Each message's parts, as 64-bit little-endian integers (`_array`): a head,
    #: `count * 4 + how` (ONE, RESULTS, MIXED), then `count` parts of four: the seq of the
    #: record, the start and end of its line, and MESSAGE, RESULT or PROMPT.
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
    if zlib.crc32(memoryview(data)[:size]) != found.crc:
        return None
    return found if _consistent(found) else None


def _consistent(found: Checkpoint) -> bool:
    """Whether the checkpoint's table is one this module wrote, whole (its seal holds). A
    checkpoint is trusted like the journal beside it, in the same private directory: a hand-made
    one whose table does not read falls back to reading every line (`Records.fold`), and one that
    points at the wrong lines fails the resume when the messages are read, naming the file."""
    table = _array(found.table)
    if table is None or len(table) < 5 or not found.roles or set(found.roles) - set(_ROLE_OF):
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
    spots = _spots(base) if base is not None else {1: (1, 0, 0, PROMPT)}
    start = base.size if base is not None else data.index(b"\n") + 1
    find, field_of = data.index, _FIELD_OF.get
    for record in tail:
        if record.seq > seq:
            break
        end = find(b"\n", start)
        field = field_of(type(record))
        if field is not None:
            spots[record.seq] = (record.seq, start, end, field)
        start = end + 1
    table, at = array.array("q"), array.array("q")
    extend, mark = table.extend, at.append
    for first, after in itertools.pairwise(bounds):
        mark(len(table))
        if after - first == 1:
            entry = spots[sources[first]]
            extend((4 + _HOW[entry[3]], *entry))
            continue
        entries = [spots[part] for part in sources[first:after]]
        how = RESULTS if all(entry[3] == RESULT for entry in entries) else MIXED
        table.append(4 * len(entries) + how)
        for entry in entries:
            extend(entry)
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
        crc=zlib.crc32(data[base.size if base else 0 : start], base.crc if base else 0),
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
        table=(raw := _packed(table)),
        at=(starts := _packed(at)),
        seal=zlib.crc32(starts, zlib.crc32(raw)),
    )


#: The part of a message each record holds, by its type (others hold none).
_FIELD_OF: dict[type, int] = {Assistant: MESSAGE, User: MESSAGE, ToolResult: RESULT}
#: How a message of one part is read, by that part.
_HOW = {MESSAGE: ONE, RESULT: RESULTS, PROMPT: MIXED}


def _spots(base: Checkpoint) -> dict[int, tuple[int, int, int, int]]:
    """Each part of a checkpoint's messages, by the seq of its record: seq, start, end, field."""
    table, spots, position = _array(base.table), {}, 0
    assert table is not None  # checked when read
    while position < len(table):
        count = table[position] >> 2
        parts = table[position + 1 : position + 1 + 4 * count]
        for seq, start, end, field in zip(*[iter(parts)] * 4, strict=True):
            spots[seq] = (seq, start, end, field)
        position += 1 + 4 * count
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
    roles = map(_ROLE_OF.__getitem__, base.roles[prompt:])
    later = Message.later_all(_Loader(data, parts, meta.prompt).load, roles, at[prompt:])
    run.messages = messages = [run.messages[0], *later] if prompt else later
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
        sources.extend(table[position + 1 : position + 1 + 4 * count : 4])
        position += 1 + 4 * count
    return sources, starts


class _Loader:
    """Reads the wire form of a checkpoint's message from the journal's bytes."""

    __slots__ = ("data", "prompt", "table")

    def __init__(self, data: bytes, table: array.array[int], prompt: str) -> None:
        self.data, self.table, self.prompt = data, table, prompt

    def load(self, position: int) -> JSONObject:
        """The wire form of the message whose entry is at `position` of the table."""
        data, table = self.data, self.table
        head = table[position]
        count, how = head >> 2, head & 3
        spans = [table[i + 1 : i + 3] for i in range(position + 1, position + 1 + 4 * count, 4)]
        if how == ONE:
            start, end = spans[0]
            message = _loads(data[start:end])["message"]
            return {"role": message["role"], "content": message["content"]}
        if how == RESULTS:
            return {"role": "user", "content": [_loads(data[s:e])["result"] for s, e in spans]}
        blocks: list[Block] = []  # a user message merged from several records (`merge_user`)
        fields = table[position + 4 : position + 1 + 4 * count : 4]
        for (start, end), field in zip(spans, fields, strict=True):
            if field == PROMPT:
                blocks.append(TextBlock(self.prompt, None))
                continue
            value = _loads(data[start:end])[_FIELDS[field]]
            blocks.extend(message_of(value).blocks() if field == MESSAGE else (block_of(value),))
        return Message("user", tuple(blocks)).to_json()


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

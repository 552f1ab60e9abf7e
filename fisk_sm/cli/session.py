"""`fisk-sm session ...`: list, show, remove and fork the sessions of a store.

The store is the file backend under `--state-dir`, else the one `-c agent.yaml` configures: its
directory, or its JetStream stream (`sessions.backend: jetstream`), which `session init-stream`
creates. Without either, the agent.yaml of the current directory is used when there is one, so
that `session ls` next to an agent lists that agent's sessions; else the XDG default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fisk_sm.cli.lineui import transcript_lines
from fisk_sm.cli.run import UsageError, session_store, store_for, uses_jetstream
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.journal.filestore import FileStore, SessionInfo
from fisk_sm.journal.jetstream import JetStreamStore, configured_url
from fisk_sm.journal.jetstream_stream import init_stream
from fisk_sm.journal.parsing import fold_journal
from fisk_sm.journal.records import Assistant, Record, Terminal, ToolResult, ToolStarted
from fisk_sm.journal.snapshot import tool_uses
from fisk_sm.machine.path import PathError, SessionPath, session_path
from fisk_sm.model.blocks import ToolUseBlock, message_of
from fisk_sm.operator.sanitize import sanitize, say, strip_control

__all__ = [
    "HERE",
    "cmd_session",
    "config_here",
    "record_line",
    "session_paths",
    "session_records",
    "shown_status",
]

#: The agent.yaml that the session commands use, without `--state-dir` or `-c`, when it is in
#: the current directory.
HERE = Path("agent.yaml")


Store = FileStore | JetStreamStore


async def _load(store: Store, run_id: str) -> tuple[Path, list[Record]]:
    """The journal of `run_id` and how errors name it; one that does not fold is refused here,
    naming its file, so that what reads it next (a report, a path) has a readable session."""
    if isinstance(store, JetStreamStore):
        label, records = store.label(run_id), await store.load_async(run_id)
    else:
        label, records = store.path(run_id), await asyncio.to_thread(store.load, run_id)
    fold_journal(label, records)
    return label, records


async def _stream_records(
    config: AgentConfig, ids: Sequence[str]
) -> list[tuple[Path, list[Record]]]:
    async with session_store(None, config) as store:
        return [await _load(store, run_id) for run_id in ids]


def config_here(state_dir: Path | None, config: Path | None) -> Path | None:
    """The agent.yaml whose sessions are meant: `-c`'s; else, with no `--state-dir` either, the
    current directory's agent.yaml if there is one (a user next to an agent means its
    sessions, not the XDG default's); else none."""
    if config is not None or state_dir is not None:
        return config
    return HERE if HERE.is_file() else None


def _records(
    state_dir: Path | None, path: Path | None, ids: Sequence[str]
) -> list[tuple[Path, list[Record]]]:
    """The journals `ids` from the store `--state-dir`, else `-c agent.yaml` (or ./agent.yaml),
    names, each with its label (a file store is read on this thread: the caller may be on an
    event loop)."""
    path = config_here(state_dir, path)
    config = load_config(path) if path else None
    if config is not None and uses_jetstream(state_dir, config):
        return asyncio.run(_stream_records(config, ids))
    store = store_for(state_dir, config)
    found = []
    for run_id in ids:
        label, records = store.path(run_id), store.load(run_id)
        fold_journal(label, records)
        found.append((label, records))
    return found


def session_records(state_dir: Path | None, config: Path | None, run_id: str) -> list[Record]:
    """The journal of session `run_id`, read without locking it from the store that
    `--state-dir`, else `-c agent.yaml`, else the default names; refused (naming the file)
    unless it folds."""
    return _records(state_dir, config, [run_id])[0][1]


def session_paths(
    state_dir: Path | None, config: Path | None, ids: Sequence[str]
) -> list[SessionPath]:
    """The paths of sessions `ids`, derived from their journals in that store; a journal that
    is not a path through the machine is refused in one line naming its file."""
    paths = []
    for label, records in _records(state_dir, config, ids):
        try:
            paths.append(session_path(records))
        except PathError as exc:
            raise PathError(f"{label}: {exc}") from None
    return paths


def _tool_uses(message: JSONObject) -> list[ToolUseBlock]:
    """The calls of a journaled turn; none if it is not a message (the fold names that)."""
    try:
        return tool_uses(message_of(message))
    except ValueError:
        return []


def record_line(record: Record) -> str:
    """One journal record as `session show` lists it, after its seq: `assistant (tool_use:
    add)`, `tool_result toolu_1 error`, `terminal suspended`."""
    kind = type(record).__name__
    if isinstance(record, Assistant):
        names = [use.name for use in _tool_uses(record.message)]
        detail = f"{record.stop_reason}: {', '.join(names)}" if names else record.stop_reason
        return f"assistant ({detail})"
    if isinstance(record, ToolStarted):
        return f"tool_started {record.name} ({record.tool_use_id})"
    if isinstance(record, ToolResult):
        return f"tool_result {record.tool_use_id}{' error' if record.is_error else ''}"
    if isinstance(record, Terminal):
        return f"terminal {record.reason}{f' ({record.message})' if record.message else ''}"
    return {"Meta": "meta", "User": "user"}.get(kind, kind)


def shown_status(info: SessionInfo) -> str:
    """The status `session ls` shows: a live session (its lock is held) is `running (live)`,
    an open one whose lock is free `open (owner gone)` (its process died: resume it)."""
    if info.owner == "live":
        return "running (live)"
    if info.owner == "gone":
        return "open (owner gone)"
    return info.status


def cmd_session(args: argparse.Namespace) -> int:
    """Dispatch `session ls|show|rm|fork|init-stream`."""
    args.config = config_here(args.state_dir, args.config)
    config = load_config(args.config) if args.config else None
    if args.session_command == "init-stream":
        return asyncio.run(_init_stream(config))
    return asyncio.run(_session(args, config))


async def _init_stream(config: AgentConfig | None) -> int:
    if config is None or config.harness.sessions.backend != "jetstream":
        raise UsageError("session init-stream needs -c agent.yaml with sessions.backend jetstream")
    options, url = config.harness.sessions.options, configured_url(config)
    made = await init_stream(url, stream=options.stream, prefix=options.prefix)
    what = "created" if made else "already exists with the right settings"
    say(f"stream {options.stream} {what} (subjects {options.prefix}.>) on {url}")
    return 0


async def _session(args: argparse.Namespace, config: AgentConfig | None) -> int:
    async with session_store(args.state_dir, config) as store:
        if isinstance(store, JetStreamStore):
            if args.session_command == "ls":
                say(f"sessions in stream {store.stream} on {store.url} ({_source(args, config)})")
            return await _jetstream_command(args, store)
        if args.session_command == "ls":
            say(f"sessions in {store.directory.absolute()} ({_source(args, config)})")
        return await asyncio.to_thread(_file_command, args, store)


def _source(args: argparse.Namespace, config: AgentConfig | None) -> str:
    """Where the store came from, as the listing's header says it."""
    if args.state_dir is not None:
        return "from --state-dir"
    if config is None:
        return "the default: no --state-dir, -c or ./agent.yaml"
    named = f"./{HERE}" if args.config == HERE else f"-c {args.config}"
    if config.harness.sessions.backend == "file" and config.sessions_directory is None:
        return f"the default: {named} sets no sessions directory"
    return f"from {named}"


async def _jetstream_command(args: argparse.Namespace, store: JetStreamStore) -> int:
    if args.session_command == "ls":
        return _list(args, await store.list_async(), store.label)
    if args.session_command == "show":
        return _show(args, store.label(args.id), await store.load_async(args.id))
    if args.session_command == "rm":
        await store.snapshot_async(args.id)  # a missing or damaged session is an error
        await store.delete_async(args.id)
        say(f"removed {args.id}")
        return 0
    await store.snapshot_async(args.id)
    await store.fork_async(args.id, args.at, args.name)
    say(f"forked {args.id} at seq {args.at} as {args.name}")
    return 0


def _file_command(args: argparse.Namespace, store: FileStore) -> int:
    if args.session_command == "ls":
        return _list(args, store.list(), lambda run_id: store.directory / f"{run_id}.json")
    if args.session_command == "show":
        return _show(args, store.path(args.id), store.load(args.id))
    # `rm` and `fork` act only on a session that `ls` lists as good: a damaged one (a planted
    # FIFO or directory, a foreign file, a journal that does not fold) is named, never removed
    # or copied; the error line says which file to look at.
    if args.session_command == "rm":
        store.snapshot(args.id)
        store.delete(args.id)
        say(f"removed {args.id}")
        return 0
    store.snapshot(args.id)
    store.fork(args.id, args.at, args.name)
    say(f"forked {args.id} at seq {args.at} as {args.name}")
    return 0


def _list(
    args: argparse.Namespace, sessions: list[SessionInfo], label: Callable[[str], Path]
) -> int:
    """The table (or JSON) on stdout; each damaged session is also named on stderr, one line
    each, so that a script sees which file to look at while the listing goes on (exit 0)."""
    for s in sessions:
        if s.problem:
            say(f"fisk-sm: {label(s.run_id)}: {s.problem}")
    out = sys.stdout
    if args.json:
        rows = [
            {
                "id": s.run_id,
                "model": s.model,
                "status": s.status,
                "updated": s.updated,
                "prompt": s.prompt,
                "problem": s.problem,
                "owner": s.owner,
                "shown": shown_status(s),
            }
            for s in sessions
        ]
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    out.write(f"{'ID':<32} {'MODEL':<24} {'STATUS':<20} {'UPDATED':<20} PROMPT\n")
    for s in sessions:
        updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.updated))
        if s.problem:  # a damaged session: say why in place of its prompt
            updated, prompt = "-", sanitize(s.problem, 200)
        else:
            prompt = sanitize(s.prompt, 50)
        cells = (sanitize(s.run_id, 200), sanitize(s.model, 24), shown_status(s))
        out.write(f"{cells[0]:<32} {cells[1]:<24} {cells[2]:<20} {updated:<20} {prompt}\n")
    return 0


def _show(args: argparse.Namespace, label: Path, records: list[Record]) -> int:
    out = sys.stdout
    snap = fold_journal(label, records)
    u = snap.usage
    # Everything here was read from a journal: no control sequence reaches the terminal.
    out.write(
        strip_control(
            f"session:        {snap.run_id}\n"
            f"status:         {snap.status}{f' ({snap.outcome})' if snap.outcome else ''}\n"
            f"model:          {snap.fingerprint.get('model', '')}\n"
            f"created:        {snap.created}\n"
            f"iterations:     {snap.iteration}\n"
            f"resumes in:     {snap.state}\n"
            f"llm calls:      {snap.llm_calls}\n"
            f"tool calls:     {snap.tool_calls}\n"
            f"tokens:         in {u.input_tokens} out {u.output_tokens}"
            f" cache read {u.cache_read_tokens} cache create {u.cache_create_tokens}\n"
            f"records:        {snap.seq}\n"
            f"prompt:         {sanitize(snap.prompt, 2000)}\n"
        )
    )
    # The seq numbers are what `session fork --at SEQ` takes.
    width = len(str(records[-1].seq))
    out.write("records (seq):\n")
    out.writelines(f"  {r.seq:>{width}} {sanitize(record_line(r), 200)}\n" for r in records)
    if args.transcript:
        out.write("transcript:\n")
        out.writelines(f"  {line}\n" for line in transcript_lines(snap.messages))
    return 0

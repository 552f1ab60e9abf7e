"""bench/journal.py at scale: durable records/s across many runs (figure 4), and LangGraph's
get_state on the resumed conversation (the baseline of figure 3).

Each of R runs owns a real `FileStore` session and appends K records through its `FileJournal`,
awaiting each append's durability before the next, as a run's loop does; all R run on one event
loop at once. The group-commit writer is measured in several configurations, each against
baselines taken in the same process on the same directory:

* one run appending its R*K/10 records alone (the latency of one commit, serially);
* a hand-written loop: `os.write` + `os.fsync` per record, one file after another.
"""

from __future__ import annotations

import asyncio
import operator
import os
import shutil
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from fisk_sm.journal import filejournal
from fisk_sm.journal.filejournal import FileJournal
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Meta, Record, ToolResult, ToolStarted, encode
from fisk_sm.journal.writer import FSYNC_THREADS, GroupCommitWriter

#: (label, GroupCommitWriter keyword arguments); the first is the default configuration.
WRITERS: tuple[tuple[str, dict[str, Any]], ...] = (
    (f"writer, {FSYNC_THREADS} fsync threads (default)", {}),
    ("writer, 1 thread (fsyncs one by one)", {"threads": 1}),
    ("writer, 32 fsync threads", {"threads": 32}),
    ("writer, syncfs per batch", {"syncfs": True}),
)
OUTPUT = "x" * 600  # a tool result of about 700 bytes on disk


def records(run_id: str, count: int) -> list[Record]:
    """`count` records after the meta: intent, result, intent, result, ..."""
    out: list[Record] = []
    for seq in range(2, count + 2):
        tool_use_id = f"toolu_{run_id}_{seq // 2}"
        if seq % 2 == 0:
            out.append(ToolStarted(seq, tool_use_id, "echo"))
        else:
            result = {"type": "tool_result", "tool_use_id": tool_use_id, "content": OUTPUT}
            out.append(ToolResult(seq, tool_use_id, result))
    return out


@contextmanager
def using(writer: GroupCommitWriter) -> Iterator[None]:
    """Make `writer` the one `FileJournal.append` hands its records to."""
    original = filejournal.shared_writer
    filejournal.shared_writer = lambda: writer
    try:
        yield
    finally:
        filejournal.shared_writer = original


async def open_runs(store: FileStore, runs: int, tag: str) -> list[FileJournal]:
    metas = [Meta.new(f"{tag}-{i}", {"model": "bench"}, "go") for i in range(runs)]
    return list(await asyncio.gather(*(store.create_async(meta) for meta in metas)))


async def append_all(journal: FileJournal, batch: list[Record]) -> None:
    for record in batch:
        await journal.append(record)


async def concurrent_rate(store: FileStore, runs: int, per_run: int, tag: str) -> float:
    """Records/s of `runs` journals appending `per_run` records each, all at once."""
    journals = await open_runs(store, runs, tag)
    work = [records(journal.path.stem, per_run) for journal in journals]
    start = time.perf_counter()
    await asyncio.gather(*(append_all(j, w) for j, w in zip(journals, work, strict=True)))
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(journal.close() for journal in journals))
    return runs * per_run / elapsed


def hand_rate(directory: Path, files: int, per_file: int) -> float:
    """Records/s of `os.write` + `os.fsync` per record, file after file (no threads)."""
    directory.mkdir()
    lines = [(encode(r) + "\n").encode() for r in records("hand", per_file)]
    start = time.perf_counter()
    for i in range(files):
        fd = os.open(directory / f"h{i}.json", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for line in lines:
            os.write(fd, line)
            os.fsync(fd)
        os.close(fd)
    return files * per_file / (time.perf_counter() - start)


async def durable_many(root: Path, runs: int, per_run: int, repeats: int) -> dict[str, float]:
    """Print figure 4; returns the median records/s by configuration."""
    print(f"\n4. durable records/s, {runs} concurrent runs x {per_run} records each")
    print("   (each append awaited until fsynced; medians of interleaved repeats)")
    samples: dict[str, list[float]] = {}
    serial_records = max(20, runs * per_run // 10)
    for rep in range(repeats):
        for label, options in WRITERS:
            store = FileStore(root / f"many-{rep}-{len(samples)}-{label[:10].replace(' ', '')}")
            with using(GroupCommitWriter(**options)):
                rate = await concurrent_rate(store, runs, per_run, "r")
            samples.setdefault(label, []).append(rate)
            shutil.rmtree(store.directory)
        store = FileStore(root / f"serial-{rep}")
        with using(GroupCommitWriter()):
            rate = await concurrent_rate(store, 1, serial_records, "s")
        samples.setdefault("baseline: one run alone, serial appends", []).append(rate)
        shutil.rmtree(store.directory)
        hand = root / f"hand-{rep}"
        files = max(1, serial_records // per_run)
        rate = hand_rate(hand, files, per_run)
        samples.setdefault("baseline: hand write+fsync per record", []).append(rate)
        shutil.rmtree(hand)
    medians = {label: statistics.median(rates) for label, rates in samples.items()}
    hand = medians["baseline: hand write+fsync per record"]
    for label, rate in medians.items():
        print(f"   {label:<44} {rate:>9,.0f} records/s  ({rate / hand:5.1f}x hand)")
    return medians


# --- LangGraph's get_state on the same conversation (figure 3's baseline) ------------------------


def langgraph_get_state(
    messages: list[dict[str, Any]],
    db: Path,
    rounds: int,
    then: Callable[[list[dict[str, Any]]], object] | None = None,
) -> dict[str, float]:
    """Median seconds of `graph.get_state(config)` for a thread whose last checkpoint holds
    `messages`, with a file-backed `SqliteSaver` and an `InMemorySaver`; {} without langgraph.
    With `then`, each sample also times `then(the state's messages)`, under names of their own
    (`<saver> + then`)."""
    try:
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return {}
    savers: dict[str, Any] = {}
    connection = sqlite3.connect(db, check_same_thread=False)
    try:  # the file-backed saver, the fair one, is a package of its own
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        print("   (langgraph-checkpoint-sqlite is not installed: no SqliteSaver figure)")
    else:
        savers["SqliteSaver (file)"] = SqliteSaver(connection)
    savers["InMemorySaver"] = InMemorySaver()
    graph = StateGraph(State)
    graph.add_node("call", lambda state: {})
    graph.add_edge(START, "call")
    graph.add_edge("call", END)
    out: dict[str, float] = {}
    for name, saver in savers.items():
        compiled = graph.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "resume"}}
        # One checkpoint holding the whole history: get_state reads the latest one only.
        compiled.update_state(config, {"messages": messages, "iteration": 1000}, as_node="call")
        if len(compiled.get_state(config).values["messages"]) != len(messages):
            raise RuntimeError("LangGraph did not keep the conversation")
        times, after = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            compiled.get_state(config)
            times.append(time.perf_counter() - start)
        while then is not None and len(after) < rounds:  # apart: its garbage stays out
            start = time.perf_counter()
            then(compiled.get_state(config).values["messages"])
            after.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
        if after:
            out[f"{name} + then"] = statistics.median(after)
    connection.close()
    return out


class State(TypedDict):
    """The LangGraph state: the conversation, appended by reducer, and a counter."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    iteration: int

"""Checkpointed runs: start a session in a store, or resume one through the resume gate.

A session's journal lives in a store: a `FileStore` or a `JetStreamStore` (the `SessionStore`
protocol). Starting one writes the meta record (with the resume fingerprint) before anything
else. Resuming one opens the journal (a file's: taking the lock, truncating a torn last line; a
stream's: no lock, its first append is fenced), folds it, refuses a completed session, a
provider change or (without `force`) any drift of the configuration, and continues from the
folded state. A fixed reminder is added to the system prompt of a resumed run; it is not part
of the fingerprint.

Both are coroutines because a supervisor calls them on the event loop that drives its other
runs: the SDK's import and client, the lock, the file, its fsyncs and the fold all happen in
worker threads, never on the loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fisk_sm.config.agent import AgentConfig
from fisk_sm.events.types import RunResumed, wants
from fisk_sm.journal.base import SessionJournal, SessionStore
from fisk_sm.journal.parsing import resume_fold
from fisk_sm.journal.records import Meta
from fisk_sm.journal.snapshot import RunData
from fisk_sm.loop.fingerprint import check_resume, fingerprint
from fisk_sm.loop.harness import Harness, RunOptions
from fisk_sm.loop.run import Run, new_run_id
from fisk_sm.model.clients import warm_up

if TYPE_CHECKING:
    from fisk_sm.machine.evaluator import LoopMachine
    from fisk_sm.machine.guards import Facts

__all__ = ["RESUME_REMINDER", "resume_session", "start_session"]

RESUME_REMINDER = (
    "This run was suspended and has now been resumed. Results of tools that ran before the"
    " resume may be stale: check again before relying on them."
)


async def _harness(config: AgentConfig, options: RunOptions | None) -> Harness:
    options = options or RunOptions()
    if options.journal is not None:
        raise ValueError("a session's journal is its file in the store: leave options.journal out")
    if options.model is None:
        await warm_up(config.llm)  # so building the model below finds its client ready
    harness = Harness.build(config, options)
    try:
        await harness.start_mcp_servers()  # their tools are in the fingerprint
    except BaseException:
        await harness.aclose()
        raise
    return harness


def _use(harness: Harness, journal: SessionJournal) -> None:
    """Make `journal` the harness's; a `retry` tool's intent record then needs no fsync."""
    journal.deferred_intents = frozenset(
        name for name, tool in harness.tools.tools.items() if tool.crash_policy == "retry"
    )
    harness.journal = journal


async def start_session(
    config: AgentConfig,
    prompt: str,
    store: SessionStore,
    options: RunOptions | None = None,
    *,
    run_id: str | None = None,
    chat: bool = False,
    machine: LoopMachine[Facts] | None = None,
) -> Run:
    """Create a session in `store` (its meta record is durable on return) and its run; a
    `chat` session's meta says so (`interactive`). `machine` (from `machine_for`) runs it by
    another table; the loop's by default."""
    harness = await _harness(config, options)
    run_id = run_id or new_run_id()
    meta = Meta.new(run_id, fingerprint(harness), prompt, interactive=chat)
    try:
        journal = await store.create_async(meta)
    except BaseException:
        await harness.aclose()
        raise
    _use(harness, journal)
    data = RunData.begin(run_id, prompt)
    data.chat = chat
    return Run(data, harness, seq=1, machine=machine)


async def resume_session(
    config: AgentConfig,
    run_id: str,
    store: SessionStore,
    options: RunOptions | None = None,
    *,
    force: bool = False,
    machine: LoopMachine[Facts] | None = None,
) -> Run:
    """Resume session `run_id`; raises `ResumeRefused` or a journal error if it cannot.
    A session made by another table's machine (`machine_for`) is folded and resumed by it.

    The journal is opened once: the lock is taken, the file parsed (a torn last line is
    truncated) and folded, and only then is the resume gate asked; a refusal releases the lock.
    """
    harness = await _harness(config, options)
    try:
        journal = await store.open_async(run_id)
        harness.journal = journal  # from here on, closing the harness releases the lock
        # Folding a long journal takes milliseconds of CPU: a worker thread's, not the loop's.
        table = machine.table if machine is not None else None
        snapshot = await asyncio.to_thread(resume_fold, journal.path, journal.records, table)
        check_resume(
            run_id,
            snapshot.fingerprint,
            fingerprint(harness),
            completed=snapshot.completed,
            force=force,
            harness=harness,
        )
    except BaseException:
        await harness.aclose()
        raise
    _use(harness, journal)
    harness.context = (*harness.context, {"type": "text", "text": RESUME_REMINDER})
    run = Run.restore(snapshot, harness, machine=machine)
    run.resumed = True
    if wants(harness.events, RunResumed):  # (its wire form reads every message of the history)
        harness.events.emit(
            # events leave the process as JSON: the conversation goes in its wire form
            RunResumed(
                run_id,
                snapshot.state,
                snapshot.iteration,
                tuple(m.to_json() for m in snapshot.messages),
                snapshot.status,
            )
        )
    return run

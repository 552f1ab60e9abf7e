"""Checkpointed runs: start a session in a store, or resume one through the resume gate.

A session's journal lives in a `FileStore`. Starting one writes the meta record (with the resume
fingerprint) before anything else. Resuming one loads the journal without a lock, refuses a
completed session, a provider change or (without `force`) any drift of the configuration, then
opens the journal (taking the lock, truncating a torn last line), folds it and continues from the
folded state. A fixed reminder is added to the system prompt of a resumed run; it is not part of
the fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fisk_sm.config.agent import AgentConfig
from fisk_sm.events.types import Events, RunResumed
from fisk_sm.journal.filestore import FileStore, fold_journal
from fisk_sm.journal.records import Meta
from fisk_sm.journal.snapshot import RunData
from fisk_sm.loop.fingerprint import check_resume, fingerprint
from fisk_sm.loop.harness import Harness
from fisk_sm.loop.run import Run, new_run_id
from fisk_sm.model.anthropic import ModelClient
from fisk_sm.operator.prompter import Prompter
from fisk_sm.tools.base import Tool

__all__ = ["RESUME_REMINDER", "resume_session", "start_session"]

RESUME_REMINDER = (
    "This run was suspended and has now been resumed. Results of tools that ran before the"
    " resume may be stale: check again before relying on them."
)


def _harness(
    config: AgentConfig,
    model: ModelClient | None,
    tools: Iterable[Tool],
    events: Events | None,
    should_suspend: Callable[[], bool] | None,
    prompter: Prompter | None,
) -> Harness:
    return Harness.build(
        config,
        model=model,
        tools=tools,
        events=events,
        should_suspend=should_suspend,
        prompter=prompter,
    )


def start_session(
    config: AgentConfig,
    prompt: str,
    store: FileStore,
    *,
    run_id: str | None = None,
    model: ModelClient | None = None,
    tools: Iterable[Tool] = (),
    events: Events | None = None,
    should_suspend: Callable[[], bool] | None = None,
    prompter: Prompter | None = None,
) -> Run:
    """Create a session in `store` (its meta record is durable on return) and its run."""
    harness = _harness(config, model, tools, events, should_suspend, prompter)
    run_id = run_id or new_run_id()
    harness.journal = store.create(Meta.new(run_id, fingerprint(harness), prompt))
    return Run(RunData.begin(run_id, prompt), harness, seq=1)


def resume_session(
    config: AgentConfig,
    run_id: str,
    store: FileStore,
    *,
    force: bool = False,
    model: ModelClient | None = None,
    tools: Iterable[Tool] = (),
    events: Events | None = None,
    should_suspend: Callable[[], bool] | None = None,
    prompter: Prompter | None = None,
) -> Run:
    """Resume session `run_id`; raises `ResumeRefused` or a journal error if it cannot.

    The journal is opened once: the lock is taken, the file parsed (a torn last line is
    truncated) and folded, and only then is the resume gate asked; a refusal releases the lock.
    """
    harness = _harness(config, model, tools, events, should_suspend, prompter)
    journal = store.open(run_id)
    try:
        snapshot = fold_journal(journal.path, journal.records)
        check_resume(
            run_id,
            snapshot.fingerprint,
            fingerprint(harness),
            completed=snapshot.completed,
            force=force,
        )
    except BaseException:
        journal.close_sync()
        raise
    harness.journal = journal
    harness.context = (*harness.context, {"type": "text", "text": RESUME_REMINDER})
    run = Run.restore(snapshot, harness)
    run.resumed = True
    harness.events.emit(
        RunResumed(run_id, snapshot.state, snapshot.iteration, snapshot.messages, snapshot.status)
    )
    return run

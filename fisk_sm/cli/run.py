"""`fisk-sm run`: drive one run from the command line, with signals and sessions.

With `--checkpoint` (or `--resume`) the first SIGINT or SIGTERM requests a suspend, which takes
effect at the next loop boundary, never mid-tool; the process then prints how to resume and exits
0. A second signal aborts at once: every record already journaled stays, and a tool that was
running is handled by its crash policy on resume. Without a journal, a signal aborts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TextIO

from fisk_sm.cli.lineui import LineUI
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.states import States
from fisk_sm.events.adapters import JsonLinesEvents
from fisk_sm.events.linewriter import shared_line_writer
from fisk_sm.events.types import Events, Fanout
from fisk_sm.journal import failpoint
from fisk_sm.journal.filestore import FileStore, JournalIOError, check_run_id, default_directory
from fisk_sm.loop.harness import Harness, NoModel, RunOptions
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.clients import warm_up
from fisk_sm.operator.prompter import TerminalPrompter
from fisk_sm.operator.sanitize import say
from fisk_sm.tools.base import Tool

__all__ = ["EXIT_ABORTED", "EXIT_IO", "UsageError", "cmd_run", "store_for"]

DEFAULT_PROMPT = "assist the user"
EXIT_ABORTED = 130
#: An I/O failure (a full disk, a read-only state dir), as in sysexits.h.
EXIT_IO = 74


class UsageError(Exception):
    """Bad flags or arguments; exit 2 with one line."""


def store_for(state_dir: Path | None, config: AgentConfig | None) -> FileStore:
    """The session store: `--state-dir`, else the config's directory, else the XDG default."""
    configured = config.sessions_directory if config is not None else None
    return FileStore(state_dir or configured or default_directory())


def _check_flags(args: argparse.Namespace) -> None:
    if args.resume and args.prompt:
        raise UsageError("--resume continues a session; it takes no prompt")
    if args.resume and args.checkpoint:
        raise UsageError(
            "--resume and --checkpoint cannot be combined (a resumed run is journaled)"
        )
    if args.name is not None and not args.checkpoint:
        raise UsageError("--name needs --checkpoint")
    if args.name is not None:
        check_run_id(args.name)  # an empty or bad name is refused, never replaced
    if args.force and not args.resume:
        raise UsageError("--force needs --resume")
    if args.state_dir and not (args.checkpoint or args.resume):
        raise UsageError("--state-dir needs --checkpoint or --resume")


def cmd_run(args: argparse.Namespace) -> int:
    """Run, checkpoint or resume an agent."""
    _check_flags(args)
    config = load_config(args.config)
    stream: TextIO | None = None
    lines: JsonLinesEvents | None = None
    sinks: list[Events] = [LineUI(trace=args.trace)]
    if args.events:
        # The events hold the whole conversation: 0600 whatever the umask.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        stream = os.fdopen(os.open(args.events, flags, 0o600), "a", encoding="utf-8")
        lines = JsonLinesEvents(stream)
        sinks.append(lines)
    early = _EarlySignals(journaled=bool(args.resume or args.checkpoint))
    try:
        return asyncio.run(_main(args, config, Fanout(tuple(sinks)), early))
    finally:
        # The run is over: a signal now must not turn a clean exit into a killed process.
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        if stream is not None:
            try:
                if lines is not None:
                    lines.close()  # the lines are written off the loop: all of them, first
            finally:
                stream.close()


SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _EarlySignals:
    """Signals that arrive before the run loop takes them over (while the session is created,
    remote tools imported, ...). For a journaled run the first one is remembered as a suspend
    request; otherwise, or on a second one, the command stops at once."""

    def __init__(self, *, journaled: bool) -> None:
        self.journaled = journaled
        self.count = 0
        for signum in SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if not self.journaled or self.count > 1:
            raise KeyboardInterrupt
        _say("suspending at the next loop boundary (signal again to abort)")


async def _main(
    args: argparse.Namespace, config: AgentConfig, events: Events, early: _EarlySignals
) -> int:
    """Import remote tools (if any), build or resume the run, and drive it."""
    prompter = TerminalPrompter()
    remote: list[Tool] = []
    close_remote = None
    if config.remote_tools:
        from fisk_sm.tools.remote import connect_remote_tools  # nats is needed only here

        # Only the names the run's own tools take: a harness that needs no model client.
        local = Harness.build(config, RunOptions(model=NoModel(), prompter=prompter))
        remote, close_remote = await connect_remote_tools(config, local.tools.tools)
    try:
        options = RunOptions(events=events, prompter=prompter, tools=remote)
        if args.resume:
            store = store_for(args.state_dir, config)
            run = await resume_session(config, args.resume, store, options, force=args.force)
        elif args.checkpoint:
            prompt = " ".join(args.prompt).strip() or DEFAULT_PROMPT
            store = store_for(args.state_dir, config)
            run = await start_session(config, prompt, store, options, run_id=args.name)
            _say(f"session: {run.data.run_id}")
        else:
            prompt = " ".join(args.prompt).strip() or DEFAULT_PROMPT
            await warm_up(config.llm)  # the SDK's import and client, off the loop
            run = Run.create(config, prompt, options)
        run.harness.journal = failpoint.install(run.harness.journal)  # FISK_FAILPOINT
        return await _drive(run, args, journaled=early.journaled, signals=early.count)
    finally:
        if close_remote is not None:
            await close_remote()


def _say(text: str) -> None:
    say(text)


async def _drive(run: Run, args: argparse.Namespace, *, journaled: bool, signals: int) -> int:
    task = asyncio.ensure_future(run.run())
    if signals:
        run.request_suspend()  # a signal came while the run was being set up

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if journaled and signals == 1:
            run.request_suspend()
            _say("suspending at the next loop boundary (signal again to abort)")
        else:
            task.cancel()

    loop = asyncio.get_running_loop()
    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    try:
        state = await task
    except JournalIOError as exc:
        _say(f"fisk-sm: {exc}")
        _say(
            f"the journal is intact up to seq {run.harness.journal.last_seq};"
            f" once the disk is fixed, {_resume_hint(run, args)}"
        )
        return EXIT_IO
    except asyncio.CancelledError:
        _say("aborted; every completed step is in the journal" if journaled else "aborted")
        if journaled:
            _say(_resume_hint(run, args))
        # A tool still running in a worker thread must not hold the exit: the journal is
        # already durable, and the crash policy handles that tool on resume. The event lines
        # queued so far are written first (briefly blocking the loop: it is about to end).
        sys.stdout.flush()
        shared_line_writer().drain(timeout=2.0)
        os._exit(EXIT_ABORTED)
    finally:
        # The run is over: from here to the exit a signal must not kill a clean finish.
        # (remove_signal_handler restores the default disposition; "ignore" follows at once.)
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)
        await run.aclose()  # the session's lock and the model's client
    if state == States.SUSPENDED:
        _say(f"suspended; {_resume_hint(run, args)}")
    return 0 if state in (States.COMPLETED, States.SUSPENDED) else 1


def _resume_hint(run: Run, args: argparse.Namespace) -> str:
    state_dir = f" --state-dir {args.state_dir}" if args.state_dir else ""
    return f"resume with: fisk-sm run -c {args.config}{state_dir} --resume {run.data.run_id}"

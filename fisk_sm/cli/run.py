"""`fisk-sm run`: drive one run from the command line, with signals and sessions.

With `--checkpoint` (or `--resume`) the first SIGINT or SIGTERM requests a suspend now
(`Run.request_suspend(now=True)`): a model call in flight is cancelled (nothing of it is
journaled; the resume calls again), a running tool finishes and the suspend takes effect at the
next loop boundary, never mid-tool; the process then prints how to resume and exits 0. A second
signal aborts at once: every record already journaled stays, and a tool that was running is
handled by its crash policy on resume. Without a journal, a signal aborts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from fisk_sm.cli.divergence import say_divergence
from fisk_sm.cli.lineui import LineUI
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.states import States
from fisk_sm.config.text import UnencodableText, refuse_unencodable
from fisk_sm.events.adapters import JsonLinesEvents
from fisk_sm.events.linewriter import shared_line_writer
from fisk_sm.events.types import Events, Fanout
from fisk_sm.journal import failpoint
from fisk_sm.journal.filestore import FileStore, JournalIOError, check_run_id, default_directory
from fisk_sm.journal.jetstream import JetStreamStore, connect_configured
from fisk_sm.loop.harness import Harness, NoModel, RunOptions
from fisk_sm.loop.replay import replay
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.clients import warm_up
from fisk_sm.operator.prompter import Prompter, TerminalPrompter
from fisk_sm.operator.sanitize import say
from fisk_sm.tools.base import Tool

if TYPE_CHECKING:
    from fisk_sm.events.otel import OtlpExport
    from fisk_sm.model.anthropic import ModelClient

__all__ = [
    "EXIT_ABORTED",
    "EXIT_IO",
    "UsageError",
    "add_run_arguments",
    "build_run",
    "check_flags",
    "cmd_run",
    "opened_run",
    "replay_run",
    "resume_hint",
    "session_store",
    "store_for",
    "telemetry_export",
]

DEFAULT_PROMPT = "assist the user"
EXIT_ABORTED = 130
#: An I/O failure (a full disk, a read-only state dir), as in sysexits.h.
EXIT_IO = 74


class UsageError(Exception):
    """Bad flags or arguments; exit 2 with one line."""


def store_for(state_dir: Path | None, config: AgentConfig | None) -> FileStore:
    """The file store: `--state-dir`, else the config's directory, else the XDG default."""
    configured = config.sessions_directory if config is not None else None
    return FileStore(state_dir or configured or default_directory())


def uses_jetstream(state_dir: Path | None, config: AgentConfig | None) -> bool:
    """Whether sessions live in JetStream: the config says so and no `--state-dir` overrides
    it (REFERENCE §3.7: `--config` selects the configured backend)."""
    return (
        state_dir is None and config is not None and config.harness.sessions.backend == "jetstream"
    )


@contextlib.asynccontextmanager
async def session_store(
    state_dir: Path | None, config: AgentConfig | None
) -> AsyncIterator[FileStore | JetStreamStore]:
    """The store sessions live in: the configured JetStream stream (connected, and closed when
    the block ends), else the file store of `store_for`."""
    if not uses_jetstream(state_dir, config):
        yield store_for(state_dir, config)
        return
    assert config is not None  # uses_jetstream checked it
    store = await connect_configured(config)
    try:
        yield store
    finally:
        await store.close()


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that drive a run (`run`, `step`): the agent, the prompt, and
    how the run is built (`build_run`): new, checkpointed, resumed or replayed."""
    parser.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml to run")
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="journal the run as a session (printed at start) so that it can be resumed",
    )
    parser.add_argument("--name", metavar="ID", help="the session id (with --checkpoint)")
    parser.add_argument("--resume", metavar="ID", help="resume session ID (takes no prompt)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --resume: continue even though the configuration changed (not the provider)",
    )
    parser.add_argument(
        "--replay",
        metavar="ID",
        help="run session ID again from its journal, without calling the model (takes no prompt)",
    )
    parser.add_argument(
        "--replay-tools",
        choices=("recorded", "live"),
        help="with --replay: answer the tools from the journal (recorded, the default)"
        " or run them again (live)",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="the sessions directory (default: XDG state)"
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="export OpenTelemetry traces over OTLP/HTTP (where: OTEL_EXPORTER_OTLP_ENDPOINT;"
        " needs fisk-sm[otel])",
    )
    parser.add_argument("prompt", nargs="*", help=f"the prompt (default: {DEFAULT_PROMPT!r})")


def check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together (`UsageError`)."""
    _check_replay_flags(args)
    try:  # argv that is not UTF-8 arrives surrogate-escaped: refused, never sent or journaled
        refuse_unencodable(" ".join(args.prompt), "prompt")
    except UnencodableText as exc:
        raise UsageError(str(exc)) from None
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
    if args.state_dir and not (args.checkpoint or args.resume or args.replay):
        raise UsageError("--state-dir needs --checkpoint, --resume or --replay")


def _check_replay_flags(args: argparse.Namespace) -> None:
    if args.replay_tools is not None and not args.replay:
        raise UsageError("--replay-tools needs --replay")
    if not args.replay:
        return
    check_run_id(args.replay)
    if args.prompt:
        raise UsageError("--replay runs the recorded prompt; it takes no prompt")
    for flag, given in (
        ("--resume", args.resume),
        ("--checkpoint", args.checkpoint),
        ("--force", args.force),
    ):
        if given:
            raise UsageError(f"--replay and {flag} cannot be combined")


async def replay_run(
    args: argparse.Namespace,
    config: AgentConfig,
    options: RunOptions | None = None,
    store: FileStore | JetStreamStore | None = None,
) -> Run:
    """The run that replays session `args.replay` of `store` (default: `store_for`): the
    recorded replies, checked request by request, and the recorded tool results unless
    `args.replay_tools` is "live". No SDK client is built; the journal is read, never locked or
    changed, and the replay's own records stay in memory."""
    store = store or store_for(args.state_dir, config)
    if isinstance(store, JetStreamStore):
        records = await store.load_async(args.replay)
    else:
        records = await asyncio.to_thread(store.load, args.replay)
    live = getattr(args, "replay_tools", None) == "live"
    return replay(config, records, options, live_tools=live)


def cmd_run(args: argparse.Namespace) -> int:
    """Run, checkpoint or resume an agent."""
    check_flags(args)
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
    async with opened_run(args, config, events) as run:
        code = await _drive(run, args, journaled=early.journaled, signals=early.count)
        say_divergence(run, _say)  # after the replay's "failed:" line
        return code


@contextlib.asynccontextmanager
async def opened_run(
    args: argparse.Namespace,
    config: AgentConfig,
    events: Events,
    prompter: Prompter | None = None,
    model: ModelClient | None = None,
) -> AsyncIterator[Run]:
    """The run `args` asks for (`build_run`), with config's remote tools connected and its
    traces exported (`--otel`, `telemetry.otel`) until the block ends; the commands that drive
    a run (`run`, `step`, `tui`) share it. Its operator is `prompter` (default: the terminal),
    its model `model` (default: the config's). The caller closes the run."""
    prompter = prompter or TerminalPrompter()
    remote: list[Tool] = []
    close_remote = None
    export = await asyncio.to_thread(telemetry_export, config, flag=args.otel)
    if export is not None:
        events = Fanout((events, export.events))
    try:
        if config.remote_tools:
            from fisk_sm.tools.remote import connect_remote_tools  # nats is needed only here

            # Only the names the run's own tools take: a harness that needs no model client.
            local = Harness.build(config, RunOptions(model=NoModel(), prompter=prompter))
            remote, close_remote = await connect_remote_tools(config, local.tools.tools)
        options = RunOptions(events=events, prompter=prompter, tools=remote, model=model)
        if args.replay or args.resume or args.checkpoint:
            async with session_store(args.state_dir, config) as store:
                yield await build_run(args, config, options, store)
        else:
            yield await build_run(args, config, options)
    finally:
        if close_remote is not None:
            await close_remote()
        if export is not None:
            await asyncio.to_thread(export.shutdown)  # flushes the spans: it may take a while


def telemetry_export(config: AgentConfig, *, flag: bool) -> OtlpExport | None:
    """The OTLP export of traces that `--otel` (`flag`) or `telemetry.otel` asks for, else None;
    `UsageError` when it is asked for and the `fisk-sm[otel]` extra is not installed."""
    if not (flag or config.telemetry.otel):
        return None
    try:
        from fisk_sm.events.otel import otlp_export  # the opentelemetry packages: only here
    except ImportError:
        asked = "--otel" if flag else "telemetry.otel (agent.yaml)"
        raise UsageError(f"{asked} needs OpenTelemetry: pip install 'fisk-sm[otel]'") from None
    return otlp_export(
        capture_content=True if config.telemetry.capture_content else None,
        agent_name=config.identity,
        provider=config.llm.provider,
    )


async def build_run(
    args: argparse.Namespace,
    config: AgentConfig,
    options: RunOptions,
    store: FileStore | JetStreamStore | None = None,
) -> Run:
    """Build, start or resume the run the flags (`add_run_arguments`) ask for; a session lives
    in `store` (default: the file store of `store_for`), which must stay open while it runs."""
    store = store or store_for(args.state_dir, config)
    if args.replay:
        run = await replay_run(args, config, options, store)
        _say(f"replaying session: {args.replay}")
    elif args.resume:
        run = await resume_session(config, args.resume, store, options, force=args.force)
        if run.data.chat:  # it waits for prompts that only `fisk-sm chat` reads
            await run.aclose()
            raise UsageError(
                f'session "{args.resume}" is a chat: resume it with'
                f" fisk-sm chat -c {args.config} --resume {args.resume}"
            )
    elif args.checkpoint:
        prompt = " ".join(args.prompt).strip() or DEFAULT_PROMPT
        run = await start_session(config, prompt, store, options, run_id=args.name)
        _say(f"session: {run.data.run_id}")
    else:
        prompt = " ".join(args.prompt).strip() or DEFAULT_PROMPT
        await warm_up(config.llm)  # the SDK's import and client, off the loop
        run = Run.create(config, prompt, options)
    run.harness.journal = failpoint.install(run.harness.journal)  # FISK_FAILPOINT
    return run


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
            run.request_suspend(now=True)  # a model call in flight is cut; a tool finishes
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
            f" once the disk is fixed, {resume_hint(run, args)}"
        )
        return EXIT_IO
    except asyncio.CancelledError:
        _say("aborted; every completed step is in the journal" if journaled else "aborted")
        if journaled:
            _say(resume_hint(run, args))
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
        _say(f"suspended; {resume_hint(run, args)}")
    return 0 if state in (States.COMPLETED, States.SUSPENDED) else 1


def resume_hint(run: Run, args: argparse.Namespace) -> str:
    """How to resume the session of `run`, as a command line."""
    state_dir = f" --state-dir {args.state_dir}" if args.state_dir else ""
    return f"resume with: fisk-sm run -c {args.config}{state_dir} --resume {run.data.run_id}"

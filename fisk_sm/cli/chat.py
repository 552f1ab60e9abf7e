"""`fisk-sm chat`: a line REPL over a chat run, journaled and resumable.

A chat run waits in the loop's `awaiting_input` state after each turn; the REPL is its input
source (`Run.input`): each line it reads is a follow-up, journaled as a `user` record before
the next model call. On a terminal the lines are read with prompt_toolkit (line editing,
history) and the answer is shown as it streams in; otherwise each line of stdin is a prompt, so
a script can drive a chat, and each answer is written whole. The answer goes to stdout; tool
calls, warnings and notes go to stderr.

- `/exit`, end of input (Ctrl-D) or Ctrl-C at an empty prompt end the chat: `suspended` when it
  is journaled (`--checkpoint`, `--resume`), so it can be resumed, `completed` otherwise.
- `/reset` ends the session and starts a new one with the next prompt (REFERENCE §1.2): the old
  session ends `suspended`, and `session ls` lists both. With `--name NAME` the new sessions are
  NAME-2, NAME-3, … (`derived_id`; an id already taken is skipped, its journal left alone).
- Ctrl-C during a turn interrupts it at the next loop boundary (never mid-tool, never
  mid-call) and returns to the prompt; a second one suspends a journaled chat now (a model
  call in flight is cancelled), a third aborts. SIGTERM suspends a journaled chat. On every
  turn: the chat's handlers are installed again after each prompt (`Chat._arm` says why).
- `--resume ID` of a chat waiting for its next prompt returns to the prompt without calling the
  model; a one-shot session is refused (`fisk-sm run --resume` is its command), as `run
  --resume` refuses a chat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from fisk_sm.cli.lineui import LineUI
from fisk_sm.cli.run import EXIT_ABORTED, SIGNALS, UsageError, session_store
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.config.states import States
from fisk_sm.config.text import UnencodableText, refuse_unencodable
from fisk_sm.events.types import Event, MessageReceived, RunEnded, StateEntered
from fisk_sm.journal.filestore import FileStore, SessionExistsError, check_run_id
from fisk_sm.journal.ids import MAX_RUN_ID
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.model.anthropic import AnthropicModel
from fisk_sm.model.clients import warm_up
from fisk_sm.operator.prompter import TerminalPrompter
from fisk_sm.operator.sanitize import for_terminal, is_terminal, say

__all__ = ["add_chat_parser", "chat_refusal", "cmd_chat", "derived_id"]

#: Reads the next line (None at the end of input).
Reader = Callable[[], Awaitable[str | None]]
PROMPT = "you> "


def add_chat_parser(sub: Any) -> None:
    """The `chat` command's parser."""
    chat = sub.add_parser(
        "chat",
        help="chat with an agent: follow-up prompts in one conversation",
        description="A line REPL: each line is a prompt, answered in the same conversation."
        " /reset starts a new session, /exit (or Ctrl-D, or Ctrl-C at an empty prompt) ends the"
        " chat. With --checkpoint the chat is journaled as a session and can be resumed with"
        " --resume ID.",
    )
    chat.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml")
    chat.add_argument("--checkpoint", action="store_true", help="journal the chat as a session")
    chat.add_argument(
        "--name",
        metavar="ID",
        help="the session id (with --checkpoint); the sessions /reset starts are ID-2, ID-3, ..."
        " (the first id not taken)",
    )
    chat.add_argument("--resume", metavar="ID", help="resume chat session ID")
    chat.add_argument(
        "--force", action="store_true", help="with --resume: continue though the config changed"
    )
    chat.add_argument("--state-dir", type=Path, help="the sessions directory")


def _check(args: argparse.Namespace) -> None:
    if args.resume and args.checkpoint:
        raise UsageError(
            "--resume and --checkpoint cannot be combined (a resumed chat is journaled)"
        )
    if args.name is not None and not args.checkpoint:
        raise UsageError("--name needs --checkpoint")
    for given in (args.name, args.resume):
        if given is not None:
            check_run_id(given)
    if args.force and not args.resume:
        raise UsageError("--force needs --resume")
    if args.state_dir and not (args.checkpoint or args.resume):
        raise UsageError("--state-dir needs --checkpoint or --resume")


def chat_refusal(run: Run) -> str | None:
    """Why a resumed session cannot go on as a chat (a one-shot session: `fisk-sm run
    --resume` is its command), or None when it can."""
    if run.data.chat:
        return None
    run_id = run.data.run_id
    return f'session "{run_id}" is not a chat: resume it with fisk-sm run --resume {run_id}'


def derived_id(name: str, number: int) -> str:
    """The id of the `number`-th session (2, 3, …) of a chat started with `--name name`:
    `name-number`, `name` cut short if the whole would be over `MAX_RUN_ID` characters."""
    suffix = f"-{number}"
    return check_run_id(name[: MAX_RUN_ID - len(suffix)] + suffix)


def _reader(stdin: TextIO) -> Reader:
    """Lines from prompt_toolkit on a terminal (history, line editing; Ctrl-C clears a line and
    ends the chat at an empty prompt), else plain lines of stdin."""
    if is_terminal(stdin):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory

        session: PromptSession[str] = PromptSession(history=InMemoryHistory())

        async def prompted() -> str | None:
            while True:
                try:
                    return await session.prompt_async(PROMPT)
                except EOFError:
                    return None
                except KeyboardInterrupt:
                    if not session.default_buffer.text.strip():
                        return None

        return prompted

    # Bytes, decoded here: a line that is not UTF-8 is kept (surrogate-escaped, as
    # prompt_toolkit keeps it) for `_typed` to refuse, where a strict decoder would end the chat.
    binary = getattr(stdin, "buffer", None)

    async def plain() -> str | None:
        if binary is None:
            line = await asyncio.to_thread(stdin.readline)
        else:
            line = (await asyncio.to_thread(binary.readline)).decode("utf-8", "surrogateescape")
        return line.rstrip("\n") if line else None

    return plain


class ChatUI:
    """The line UI of a chat: each answer on stdout (streamed on a terminal), the rest as
    `LineUI` shows it on stderr, and no end-of-run answer (each turn's was shown already)."""

    def __init__(self, out: TextIO, *, streaming: bool) -> None:
        self.out = out
        self.lines = LineUI(out=out)
        self.streaming = streaming
        self.open_line = False

    def wants(self, kind: type[Event]) -> bool:
        return kind is not StateEntered

    def stream(self, text: str) -> None:
        """A piece of the answer as it arrives (on a terminal only)."""
        self.out.write(for_terminal(text, self.out))
        self.out.flush()
        self.open_line = True

    def emit(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            if self.open_line:
                self.out.write("\n")
                self.open_line = False
            elif event.terminal and event.text:
                self.out.write(for_terminal(event.text.rstrip("\n"), self.out) + "\n")
            elif event.text:
                self.lines.emit(event)
            self.out.flush()
        elif isinstance(event, RunEnded):
            if event.message and event.state != States.SUSPENDED:  # the hint follows that
                say(f"{event.state}: {event.message}")
        else:
            self.lines.emit(event)


class Chat:
    """One `fisk-sm chat`: its sessions, one after another (`/reset`), and their runs."""

    def __init__(self, args: argparse.Namespace, config: AgentConfig, read: Reader) -> None:
        self.args = args
        self.config = config
        self.read = read
        self.journaled = bool(args.checkpoint or args.resume)
        self.ui = ChatUI(sys.stdout, streaming=is_terminal(sys.stdin) and is_terminal(sys.stdout))
        self.reset = False
        self.signals = 0
        self.run: Run | None = None
        self.task: asyncio.Future[str] | None = None  # the run being driven, for the signals
        self.number = 1  # the last `derived_id` number tried (`--name` after /reset)
        self.model: AnthropicModel | None = None  # the current run's: the chat releases it

    def _options(self, model: AnthropicModel) -> RunOptions:
        return RunOptions(model=model, events=self.ui, prompter=TerminalPrompter())

    async def _model(self) -> AnthropicModel:
        await warm_up(self.config.llm)  # the SDK's import and client, off the loop
        on_text = self.ui.stream if self.ui.streaming else None
        return AnthropicModel(self.config.llm, on_text=on_text)

    async def _typed(self) -> str | None:
        """The next line typed (None at the end of input); one that cannot be encoded
        (invalid UTF-8, a lone surrogate) is refused with one line, and the prompt asks again:
        nothing of it is sent or journaled."""
        while True:
            try:
                line = await self.read()
            finally:
                self._arm()  # prompt_async has just removed the loop's SIGINT handler
            try:
                return line if line is None else refuse_unencodable(line, "line")
            except UnencodableText as exc:
                say(f"fisk-sm: {exc}; not sent, type it again")

    async def _first_prompt(self) -> str | None:
        """The prompt a new session starts with (None: the user left); `/reset` has nothing
        to reset yet."""
        while True:
            line = await self._typed()
            if line is None or line.strip() == "/exit":
                return None
            if line.strip() and line.strip() != "/reset":
                return line

    async def open(self, store: FileStore | JetStreamStore | None, prompt: str | None) -> Run:
        """The run of the chat's first (or, after `/reset`, next) session."""
        model = await self._model()
        options = self._options(model)
        args = self.args
        try:
            if args.resume and self.run is None:
                assert store is not None
                run = await resume_session(
                    self.config, args.resume, store, options, force=args.force
                )
                refusal = chat_refusal(run)
                if refusal is not None:
                    await run.aclose()
                    raise UsageError(refusal)
            elif store is not None:
                run = await self._start(store, prompt or "", options)
                say(f"session: {run.data.run_id}")
            else:
                run = Run.create(self.config, prompt or "", options, chat=True)
        except BaseException:
            await model.aclose()
            raise
        run.input = self.next_prompt
        self.model = model
        return run

    async def _start(
        self, store: FileStore | JetStreamStore, prompt: str, options: RunOptions
    ) -> Run:
        """A new session: `--name` (else a new id) for the chat's first, and after a /reset
        the first of NAME-2, NAME-3, … not taken yet; a store refuses to create a session that
        exists (`SessionExistsError`), so no journal is ever reopened or overwritten."""
        name = self.args.name
        if name is None or self.run is None:
            return await start_session(self.config, prompt, store, options, run_id=name, chat=True)
        while True:
            self.number += 1
            run_id = derived_id(name, self.number)
            try:
                return await start_session(
                    self.config, prompt, store, options, run_id=run_id, chat=True
                )
            except SessionExistsError:
                say(f"fisk-sm: session {run_id} exists already; trying the next id")

    async def next_prompt(self) -> str | None:
        """The run's input source: the next line typed, None to end the chat."""
        run = self.run
        assert run is not None
        while True:
            line = await self._typed()
            command = (line or "").strip()
            if line is None or command in ("/exit", "/reset"):
                self.reset = command == "/reset"
                self._leave(run)
                return None
            if command:
                self.signals = 0
                return line

    def _leave(self, run: Run) -> None:
        """End the chat at its prompt: suspended if journaled, completed otherwise."""
        if self.journaled:
            run.request_suspend()
        else:
            run.end_input()

    def _on_signal(self, signum: int, task: asyncio.Future[Any]) -> None:
        run = self.run
        if run is None:
            return
        self.signals += 1
        if run.state == States.AWAITING_INPUT or (signum == signal.SIGTERM and self.journaled):
            if run.state == States.AWAITING_INPUT:
                self._leave(run)
            else:
                run.request_suspend(now=True)
        elif self.signals == 1:
            run.request_interrupt()
            say("interrupting at the next loop boundary (Ctrl-C again to stop the chat)")
        elif self.signals == 2 and self.journaled:
            run.request_suspend(now=True)
            say("suspending now (Ctrl-C again to abort)")
        else:
            task.cancel()

    def _arm(self) -> None:
        """Install the chat's SIGINT and SIGTERM handlers while a run is driven (else nothing).

        Called again after each line read: prompt_toolkit's `prompt_async` sets its own SIGINT
        handler on the loop while it reads, and on return removes the loop's SIGINT handler
        (`loop.remove_signal_handler`), so from the second turn on Ctrl-C went nowhere.
        """
        task = self.task
        if task is None:
            return
        loop = asyncio.get_running_loop()
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum, task)

    async def drive(self, run: Run) -> str:
        """Run the chat's run to its end, Ctrl-C interrupting a turn."""
        self.run = run
        task = self.task = asyncio.ensure_future(run.run())
        loop = asyncio.get_running_loop()
        self._arm()
        try:
            return await task
        finally:
            self.task = None
            for signum in SIGNALS:
                loop.remove_signal_handler(signum)
            await run.aclose()
            if self.model is not None:
                await self.model.aclose()

    async def main(self) -> int:
        async with self._store() as store:
            prompt = None if self.args.resume else await self._first_prompt()
            if prompt is None and not self.args.resume:
                return 0
            while True:
                run = await self.open(store, prompt)
                try:
                    state = await self.drive(run)
                except asyncio.CancelledError:
                    say(
                        "aborted; every completed step is in the journal"
                        if self.journaled
                        else "aborted"
                    )
                    sys.stdout.flush()
                    os._exit(EXIT_ABORTED)
                if state == States.SUSPENDED and self.journaled:
                    say(f"suspended; resume with: {self._hint(run)}")
                if not (self.reset and state in (States.SUSPENDED, States.COMPLETED)):
                    return 0 if state in (States.COMPLETED, States.SUSPENDED) else 1
                self.reset = False
                prompt = await self._first_prompt()
                if prompt is None:
                    return 0
                say(
                    f"new session after /reset (the previous one, {run.data.run_id}, ended {state})"
                )

    def _hint(self, run: Run) -> str:
        where = f" --state-dir {self.args.state_dir}" if self.args.state_dir else ""
        return f"fisk-sm chat -c {self.args.config}{where} --resume {run.data.run_id}"

    @contextlib.asynccontextmanager
    async def _store(self) -> AsyncIterator[FileStore | JetStreamStore | None]:
        if not self.journaled:
            yield None
            return
        async with session_store(self.args.state_dir, self.config) as store:
            yield store


def cmd_chat(args: argparse.Namespace) -> int:
    """`fisk-sm chat`."""
    _check(args)
    config = load_config(args.config)
    chat = Chat(args, config, _reader(sys.stdin))
    try:
        return asyncio.run(chat.main())
    finally:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

"""`fisk-sm tui --chat`: `fisk-sm chat` in the full-screen UI.

An input box under the panes: each line is a prompt, answered in the same conversation.
`/reset` ends the session (suspended if journaled, else completed) and the next line starts a
new one; `/exit` (or Ctrl-Q) ends the chat, and the app with it. Ctrl-C is a key here, not a
signal: at the prompt it ends the session as `/exit` does; during a turn it suspends a
journaled chat now (a model call is cut, a running tool finishes), and interrupts the turn of
one that is not (its next prompt is asked for at the next loop boundary).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from textual.app import ComposeResult
from textual.widgets import Input

from fisk_sm.config.agent import AgentConfig, Budget
from fisk_sm.config.states import States
from fisk_sm.config.table_records import Table
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.loop.run import Run
from fisk_sm.tui.app import LoopApp, Opener, Wiring, exit_code
from fisk_sm.tui.transcript import Transcript

__all__ = ["ChatApp", "chat_opener"]


def chat_opener(
    args: argparse.Namespace, config: AgentConfig, stack: contextlib.AsyncExitStack
) -> Opener:
    """Opens the chat's runs: `--resume ID` first if given, then a new session per `/reset`
    (journaled under `--name`, then ID-2, ID-3, ... as `fisk-sm chat` names them)."""
    from fisk_sm.cli.chat import chat_refusal, derived_id
    from fisk_sm.cli.run import UsageError, session_store
    from fisk_sm.loop.harness import RunOptions
    from fisk_sm.loop.sessions import resume_session, start_session
    from fisk_sm.model.anthropic import AnthropicModel
    from fisk_sm.model.clients import warm_up

    opened = 0
    stores: list[FileStore | JetStreamStore] = []  # opened with the first session, kept open

    async def opener(wiring: Wiring, prompt: str | None) -> Run:
        nonlocal opened
        opened += 1
        await warm_up(config.llm)
        model = AnthropicModel(config.llm, on_text=wiring.events.on_text)
        stack.push_async_callback(model.aclose)
        options = RunOptions(model=model, events=wiring.events, prompter=wiring.prompter)
        if not (args.checkpoint or args.resume):
            return Run.create(config, prompt or "", options, chat=True)
        if not stores:
            stores.append(await stack.enter_async_context(session_store(args.state_dir, config)))
        store = stores[0]
        if args.resume and opened == 1:
            run = await resume_session(config, args.resume, store, options, force=args.force)
            refusal = chat_refusal(run)
            if refusal is not None:
                await run.aclose()
                raise UsageError(refusal)
            return run
        name = args.name and (args.name if opened == 1 else derived_id(args.name, opened))
        return await start_session(config, prompt or "", store, options, run_id=name, chat=True)

    return opener


class ChatApp(LoopApp):
    """The chat's screen: the panes, and the prompt box."""

    def __init__(
        self,
        opener: Opener,
        table: Table,
        budget: Budget,
        prompt: str | None,
        *,
        journaled: bool = False,
        resume: str | None = None,
    ) -> None:
        super().__init__(opener, table, budget, prompt, journaled=journaled)
        self.first = prompt
        self.resume = resume
        self.prompts: asyncio.Queue[str] = asyncio.Queue()
        self.reset = False
        self.leaving = False

    def bottom(self) -> ComposeResult:
        """The prompt box."""
        box = Input(placeholder="a prompt (Enter sends) · /reset · /exit", id="prompt")
        box.cursor_blink = False
        yield box

    def on_mount(self) -> None:
        """The focus in the prompt box (Textual calls `LoopApp.on_mount` too)."""
        self.query_one("#prompt", Input).focus()

    async def drive(self) -> None:
        """Session after session (`/reset`), each driven until it ends."""
        if self.first is not None:
            self.query_one(Transcript).prompt(self.first)
        prompt = None if self.resume else self.first or await self.prompts.get()
        while True:
            run = await self.open_run(prompt)
            run.input = self.next_prompt
            state = await self.run_to_end(run)
            if not (self.reset and state in (States.SUSPENDED, States.COMPLETED)):
                self.exit(exit_code(state))  # the chat is over, as `fisk-sm chat` ends
                return
            self.reset = self.leaving = False
            self.prompts = asyncio.Queue()
            self.status(f"new session at the next prompt (the previous one ended {state})")
            prompt = await self.prompts.get()

    async def next_prompt(self) -> str | None:
        """The run's input source: the next prompt typed."""
        return await self.prompts.get()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """A line typed: a command, or the next prompt."""
        text = event.value
        event.input.clear()
        command = text.strip()
        if not command:
            return
        if command in ("/exit", "/reset"):
            self.reset = command == "/reset"
            self.leave()
            if command == "/exit" and self.run_ is None:
                self.exit(0)
            return
        self.query_one(Transcript).prompt(text)
        self.prompts.put_nowait(text)

    def leave(self) -> None:
        """End the session at its prompt: suspended if journaled, completed otherwise."""
        run = self.run_
        if run is None or run.finished:
            return
        self.leaving = True
        if self.journaled:
            run.request_suspend()
        else:
            run.end_input()

    def action_suspend(self) -> None:
        """Ctrl-C: at the prompt, end the session; in a turn, suspend (journaled) or interrupt."""
        run = self.run_
        if run is None or run.finished:
            return
        if run.state == States.AWAITING_INPUT:
            self.leave()
        elif self.journaled:
            run.request_suspend(now=True)
            self.status("suspending now")
        else:
            run.request_interrupt()
            self.status("interrupting at the next loop boundary")

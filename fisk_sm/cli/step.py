"""`fisk-sm step`: an interactive stepper over one run, a transition at a time.

It builds the run exactly as `fisk-sm run` does (`fisk_sm.cli.run.opened_run`: a new run,
`--checkpoint`, `--resume ID`, ...), then stops before the first step. At each stop it shows the
tail of the conversation and `run.explain()`: the state, the action stepping performs, each exit
with its guard's value (or "decided after the action"), the pending tool calls and the usage.

On a terminal it reads commands with prompt_toolkit (line editing, in-memory history); otherwise
it reads them line by line from stdin, so a script can drive it. End of input quits. Color only
on a terminal, and never when NO_COLOR is set. Everything shown that may come from the model
passes through the one sanitizer (`fisk_sm.operator.sanitize`); `p` prints JSON with every
control character escaped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from fisk_sm.cli.lineui import LineUI, transcript_lines
from fisk_sm.cli.run import check_flags, opened_run, resume_hint
from fisk_sm.config.agent import load_config
from fisk_sm.config.states import STATE_NAMES, States
from fisk_sm.loop.run import Run
from fisk_sm.loop.stops import Stops
from fisk_sm.operator.sanitize import is_terminal, sanitize

__all__ = ["HELP", "Stepper", "cmd_step"]

PROMPT = "(fisk-sm) "
#: Reads one command after showing a prompt; None at the end of input.
Reader = Callable[[str], Awaitable[str | None]]
#: How many lines of the conversation each stop shows.
TAIL = 4

HELP = """\
s           one transition
n           to the next loop boundary (suspend_check), or a breakpoint
c           continue to the end, or a breakpoint
b STATE     break on entering STATE (b execute)
b tool:NAME break in execute before tool NAME runs
b iter:N    break on reaching iteration N (just after the N-th model call)
b           list the breakpoints; b -X clears breakpoint X; b - clears them all
p PATH      print part of the snapshot as JSON: p usage.input_tokens, p messages.0.content
w FILE      write the snapshot as JSON (Snapshot.from_json, then Run.restore, reads it)
q           quit: a checkpointed run stays resumable (suspended at a loop boundary);
            any other run is aborted
h           this help"""


def use_color(stream: TextIO) -> bool:
    """Color only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return is_terminal(stream) and not os.environ.get("NO_COLOR")


def snapshot_part(document: Any, path: str) -> Any:
    """The part of a JSON document at a dotted `path` (`messages.0.content`); KeyError if none."""
    value = document
    for part in path.split(".") if path else ():
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and part.lstrip("-").isdigit()
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


class Stepper:
    """The command loop over one run: reads a command, acts, shows where the run stopped."""

    def __init__(
        self, run: Run, *, journaled: bool, resume_hint: str, out: TextIO | None = None
    ) -> None:
        self.run = run
        self.journaled = journaled
        self.resume_hint = resume_hint
        self.out = out or sys.stdout
        self.color = use_color(self.out)
        self.breakpoints = Stops()
        self.commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "s": self._step,
            "n": self._next,
            "c": self._continue,
            "b": self._break,
            "p": self._print,
            "w": self._write,
            "h": self._help,
        }

    def say(self, text: str = "", *, heading: bool = False) -> None:
        """Write `text` (bold cyan when `heading` and color is on)."""
        if heading and self.color:
            text = f"\x1b[1;36m{text}\x1b[0m"
        self.out.write(text + "\n")
        self.out.flush()

    def show(self) -> None:
        """Where the run is: the conversation's tail, then what the next step will do."""
        lines = transcript_lines(self.run.data.messages)[-TAIL:]
        self.say("conversation (tail):", heading=True)
        for line in lines:
            self.say(f"  {sanitize(line, 200)}")
        told = str(self.run.explain()).splitlines()
        self.say(told[0], heading=True)
        for line in told[1:]:
            self.say(line)

    async def loop(self, read: Reader) -> int:
        """Read and run commands until `q` or the end of input; returns the exit code."""
        self.show()
        while True:
            line = await read(PROMPT)
            if line is None:
                return await self._quit()
            command, _, argument = line.strip().partition(" ")
            if not command:
                continue
            if command == "q":
                return await self._quit()
            action = self.commands.get(command)
            if action is None:
                self.say(f"unknown command {sanitize(command, 40)!r}; h for help")
                continue
            await action(argument.strip())

    def _ended(self) -> bool:
        if self.run.finished:
            outcome = f": {self.run.outcome}" if self.run.outcome else ""
            self.say(f"the run has ended in {self.run.state}{outcome}; q quits")
        return self.run.finished

    async def _step(self, argument: str) -> None:
        if self._ended():
            return
        step = await self.run.step()
        via = f" [{step.guard}]" if step.guard else ""
        self.say(f"stepped: {step.source} --{step.trigger}{via}--> {step.destination}")
        self._stopped()

    async def _to(self, stops: Stops) -> None:
        if self._ended():
            return
        reason = await self.run.run_to(stops)
        if reason is not None:
            self.say(f"stopped: {reason}", heading=True)
        self._stopped()

    def _stopped(self) -> None:
        if not self._ended():
            self.show()

    async def _next(self, argument: str) -> None:
        boundary = frozenset({States.SUSPEND_CHECK})
        b = self.breakpoints
        await self._to(Stops(b.states | boundary, b.tools, b.iterations))

    async def _continue(self, argument: str) -> None:
        await self._to(self.breakpoints)

    async def _break(self, argument: str) -> None:
        b = self.breakpoints
        if not argument:
            listed = [*sorted(b.states), *(f"tool:{t}" for t in sorted(b.tools))]
            listed += [f"iter:{n}" for n in sorted(b.iterations)]
            self.say("breakpoints: " + (", ".join(listed) or "none"))
            return
        if argument == "-":
            self.breakpoints = Stops()
            self.say("breakpoints cleared")
            return
        clear = argument.startswith("-")
        spec = argument[1:] if clear else argument
        states, tools, iterations = set(b.states), set(b.tools), set(b.iterations)
        if spec.startswith("tool:") and spec[5:]:
            target: set[Any] = tools
            value: Any = spec[5:]
        elif spec.startswith("iter:") and spec[5:].isdigit() and int(spec[5:]) > 0:
            target, value = iterations, int(spec[5:])
        elif spec in STATE_NAMES:
            target, value = states, spec
        else:
            self.say(f"not a breakpoint: {sanitize(spec, 80)!r} (a state, tool:NAME or iter:N)")
            return
        if clear:
            target.discard(value)
        else:
            target.add(value)
        self.breakpoints = Stops(frozenset(states), frozenset(tools), frozenset(iterations))
        self.say(f"breakpoint {'cleared' if clear else 'set'}: {sanitize(spec, 80)}")

    async def _print(self, argument: str) -> None:
        document = json.loads(self.run.snapshot().to_json())
        try:
            part = snapshot_part(document, argument)
        except KeyError:
            self.say(f"no such path in the snapshot: {sanitize(argument, 80)!r}")
            return
        self.say(json.dumps(part, indent=2, ensure_ascii=True))  # every control escaped

    async def _write(self, argument: str) -> None:
        if not argument:
            self.say("w needs a file name")
            return
        text = self.run.snapshot().to_json()
        # the snapshot holds the whole conversation: 0600 whatever the umask
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            with os.fdopen(os.open(argument, flags, 0o600), "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            self.say(f"cannot write {sanitize(argument, 80)}: {sanitize(str(exc), 200)}")
            return
        self.say(f"wrote the snapshot to {sanitize(argument, 200)}")

    async def _help(self, argument: str) -> None:
        self.say(HELP)

    async def _quit(self) -> int:
        run = self.run
        if not run.finished and self.journaled:
            if run.state == States.SUSPEND_CHECK:
                run.request_suspend()
                await run.step()  # the boundary takes it: a clean `suspended`
                self.say(f"suspended; {self.resume_hint}")
            else:
                self.say(
                    f"stopped in {run.state}; every completed step is in the journal:"
                    f" {self.resume_hint}"
                )
            return 0
        if not run.finished:
            self.say("aborted")
            return 1
        return 0 if run.state in (States.COMPLETED, States.SUSPENDED) else 1


def _line_reader(stdin: TextIO) -> Reader:
    """Read commands: prompt_toolkit on a terminal, plain lines otherwise; None at the end."""
    if is_terminal(stdin):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory
        from prompt_toolkit.output import ColorDepth

        depth = ColorDepth.MONOCHROME if os.environ.get("NO_COLOR") else None
        session: PromptSession[str] = PromptSession(history=InMemoryHistory(), color_depth=depth)

        async def prompted(prompt: str) -> str | None:
            while True:
                try:
                    return await session.prompt_async(prompt)
                except EOFError:
                    return None
                except KeyboardInterrupt:
                    continue  # Ctrl-C at the prompt clears the line, as in a shell

        return prompted

    async def plain(prompt: str) -> str | None:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = await asyncio.to_thread(stdin.readline)
        return line if line else None

    return plain


def cmd_step(args: argparse.Namespace) -> int:
    """Step a new run, a session or a replay interactively."""
    check_flags(args)
    config = load_config(args.config)
    journaled = bool(args.resume or args.checkpoint)

    async def main() -> int:
        async with opened_run(args, config, LineUI()) as run:
            hint = resume_hint(run, args)
            stepper = Stepper(run, journaled=journaled, resume_hint=hint)
            try:
                return await stepper.loop(_line_reader(sys.stdin))
            finally:
                await run.aclose()

    return asyncio.run(main())

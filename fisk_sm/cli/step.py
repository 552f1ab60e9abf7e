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

Breakpoints are each their own, as in pdb: the run stops where any of them holds (each is one
`Stops`, joined by `Stops.any_of`). Their names are checked against the run's table and tool
set, with a "did you mean". `b approval` (or `b approval:NAME`) stops in `gate` before the
operator is asked about a gated call; `explain` then shows the gate's decision, and
`approve once|always|deny` answers. The stepper is the run's operator (it takes the gate's
prompter over): when a gated call comes up with no answer given, it asks on the same input as
its commands, so a script on stdin can answer too. `q` requests a suspend, as SIGTERM does:
a journaled run steps on to its next boundary and ends `suspended`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from fisk_sm.cli.divergence import say_divergence
from fisk_sm.cli.lineui import LineUI, transcript_lines
from fisk_sm.cli.run import check_flags, opened_run, resume_hint
from fisk_sm.cli.step_prompter import PROMPT, Reader, StepPrompter, parse_answer
from fisk_sm.config.agent import load_config
from fisk_sm.config.states import States
from fisk_sm.loop.explain import gate_asks
from fisk_sm.loop.replay import RecordedPrompter
from fisk_sm.loop.run import Run
from fisk_sm.loop.stops import ANY_TOOL, Stops, unknown_name
from fisk_sm.operator.prompter import Approval
from fisk_sm.operator.sanitize import is_terminal, sanitize

__all__ = ["HELP", "Stepper", "breakpoint_stops", "cmd_step"]

#: How many lines of the conversation each stop shows.
TAIL = 4

HELP = """\
s           one transition
n           to the next loop boundary (suspend_check), or a breakpoint
c           continue to the end, or a breakpoint
b STATE     break on entering STATE (b execute)
b tool:NAME break in execute before tool NAME runs
b iter:N    break on reaching iteration N (just after the N-th model call)
b approval  break in gate before the operator is asked (b approval:NAME: about tool NAME)
            (each breakpoint is its own: the run stops where any of them holds)
explain     what the next step will do, with the gate's decision for the next call
approve once|always|deny
            answer the approval about to be (or being) asked, and step until it is answered
b           list the breakpoints; b -X clears breakpoint X; b - clears them all
p PATH      print part of the snapshot as JSON: p usage.input_tokens, p messages.0.content
w FILE      write the snapshot as JSON (Snapshot.from_json, then Run.restore, reads it)
q           quit: a checkpointed run steps on to its next boundary and ends suspended
            (resumable), as on SIGTERM; any other run is aborted
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


async def _no_input(prompt: str) -> str | None:
    return None


def breakpoint_stops(run: Run, spec: str) -> Stops | str:
    """The `Stops` of breakpoint `spec` (a state, `tool:NAME`, `iter:N`, `approval` or
    `approval:NAME`), or why it is not one (a name checked against the run's table and tools,
    with a "did you mean")."""
    tools = run.harness.tools.tools
    kind, colon, name = spec.partition(":")
    if kind == "tool" and colon:
        return unknown_name("tool", name, tools) or Stops(tools=frozenset({name}))
    if kind == "iter" and colon:
        if not name.isdigit() or int(name) < 1:
            return f"not an iteration: {name!r} (a whole number from 1)"
        return Stops(iterations=frozenset({int(name)}))
    if kind == "approval":
        if not colon:
            return Stops(approvals=frozenset({ANY_TOOL}))
        return unknown_name("tool", name, tools) or Stops(approvals=frozenset({name}))
    states = [s.name for s in run.machine.table.states]
    if spec in states:
        return Stops(frozenset({spec}))
    error = unknown_name("state", spec, [*states, "tool:", "iter:", "approval"])
    return f"{error} (a state, tool:NAME, iter:N, approval or approval:NAME)"


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
        #: the breakpoints as typed (`tool:add`), each with its own `Stops`
        self.points: dict[str, Stops] = {}
        self.read: Reader = _no_input
        self.quitting = False
        #: whether the diff of a replay's divergence has been shown
        self.told_divergence = False
        # The stepper is the run's operator: approvals come to it (`StepPrompter`); but a
        # replay's come from its journal, and nobody is asked again.
        inner = run.harness.gate.prompter
        self.prompter = StepPrompter(inner, self)
        self.replaying = isinstance(inner, RecordedPrompter)
        if not self.replaying:
            run.harness.gate.prompter = self.prompter
        self.commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "s": self._step,
            "n": self._next,
            "c": self._continue,
            "b": self._break,
            "p": self._print,
            "w": self._write,
            "h": self._help,
            "explain": self._explain,
            "approve": self._approve,
        }

    @property
    def breakpoints(self) -> Stops:
        """The breakpoints as one `Stops`: each its own alternative (OR)."""
        return Stops(any_of=tuple(self.points.values()))

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
        self.read = read
        self.show()
        while True:
            if self.quitting:
                return await self._quit()
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
            if not self.told_divergence:  # a replay that departed: where, once
                self.told_divergence = say_divergence(self.run, self.say)
        return self.run.finished

    async def _step(self, argument: str) -> None:
        if self._ended():
            return
        await self._one_step()
        self._stopped()

    async def _one_step(self) -> None:
        step = await self.run.step()
        via = f" [{step.guard}]" if step.guard else ""
        self.say(f"stepped: {step.source} --{step.trigger}{via}--> {step.destination}")
        self._answers()

    def _answers(self) -> None:
        """Show the approvals answered since the last stop (the step's record of them)."""
        for tool, answer in self.prompter.answered:
            word = "denied" if answer is Approval.NO else f"approved {answer.value}"
            self.say(f"approval answered: {sanitize(tool, 80)} {word}", heading=True)
        self.prompter.answered.clear()

    async def _to(self, stops: Stops) -> None:
        if self._ended():
            return
        reason = await self.run.run_to(stops)
        self._answers()
        if reason is not None:
            self.say(f"stopped: {reason}", heading=True)
        self._stopped()

    def _stopped(self) -> None:
        if not self.quitting and not self._ended():
            self.show()

    async def _next(self, argument: str) -> None:
        boundary = Stops(frozenset({States.SUSPEND_CHECK}))
        await self._to(Stops(any_of=(*self.points.values(), boundary)))

    async def _continue(self, argument: str) -> None:
        await self._to(self.breakpoints)

    def _point(self, spec: str) -> Stops | str:
        return breakpoint_stops(self.run, spec)

    async def _break(self, argument: str) -> None:
        if not argument:
            self.say("breakpoints: " + (", ".join(self.points) or "none"))
            return
        if argument == "-":
            self.points.clear()
            self.say("breakpoints cleared")
            return
        if argument.startswith("-"):
            spec = argument[1:]
            if self.points.pop(spec, None) is None:
                self.say(f"no breakpoint {sanitize(spec, 80)!r}")
            else:
                self.say(f"breakpoint cleared: {sanitize(spec, 80)}")
            return
        point = self._point(argument)
        if isinstance(point, str):
            self.say(sanitize(point, 200))
            return
        self.points[argument] = point
        self.say(f"breakpoint set: {sanitize(argument, 80)}")

    async def _explain(self, argument: str) -> None:
        told = str(self.run.explain()).splitlines()
        self.say(told[0], heading=True)
        for line in told[1:]:
            self.say(line)

    async def _approve(self, argument: str) -> None:
        answer = parse_answer(argument)
        if answer is None:
            self.say("approve once, approve always or approve deny")
            return
        run = self.run
        if self.replaying:
            self.say("a replay answers approvals from its journal")
            return
        waiting = run.state == States.AWAITING_APPROVAL and run.data.approval is not None
        if run.finished or not (waiting or gate_asks(run)):
            self.say("no approval is about to be asked here")
            return
        self.prompter.queued = answer
        # step through the gate and the wait: until the answer has been taken
        while not run.finished and (
            self.prompter.queued is not None or run.state == States.AWAITING_APPROVAL
        ):
            await self._one_step()
        self._stopped()

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
            # as SIGTERM does in `fisk-sm run`: a model call is not started (or is cut), a
            # running tool finishes, and the next boundary ends the run `suspended`
            run.request_suspend(now=True)
            await run.run()
            self.say(f"{run.state}; {self.resume_hint}")
            return 0 if run.state in (States.COMPLETED, States.SUSPENDED) else 1
        if self.quitting and run.finished:
            self.say(f"the run has ended in {run.state}; {self.resume_hint}")
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

"""The command line's line UI: progress on stderr, the final answer alone on stdout.

Tool calls show as `-> name {args}` and their results as `<- ...`; the confirm gate's decisions
as `approval granted: name (once)` or `approval denied: name (no operator)`; with `trace` every
state entry and every approval asked for is shown too (without it the prompt itself asks). The
summary at the end names the model, the call and tool counts, the tokens by tier and the
latency. Only a completed run's answer goes to stdout, so `fisk-sm run ... >
answer.txt` captures exactly the answer.

Everything shown here may come from the model, the API or a journal, so every line on stderr
passes through the one sanitizer, and so does the answer when stdout is a terminal (a file or a
pipe gets it byte-exact).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import attrs

from fisk_sm.config.states import States
from fisk_sm.events.types import (
    ApprovalAsked,
    ApprovalDenied,
    ApprovalGranted,
    Event,
    MessageReceived,
    RunEnded,
    RunResumed,
    StateEntered,
    ToolCalled,
    ToolFinished,
    WarningRaised,
)
from fisk_sm.model.blocks import Message
from fisk_sm.operator.sanitize import for_terminal, say, strip_control

__all__ = ["LineUI", "transcript_lines"]

PREVIEW = 200


def _preview(text: str) -> str:
    # model-supplied text never reaches the terminal with its control sequences
    flat = " ".join(strip_control(text).split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


def _block_line(role: str, block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return f"{role}: {_preview(block.get('text', ''))}"
    if kind == "tool_use":
        args = _preview(json.dumps(block.get("input"), ensure_ascii=False))
        return f"-> {_preview(str(block.get('name')))} {args}"
    if kind == "tool_result":
        content = block.get("content", "")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        return f"{'<- error:' if block.get('is_error') else '<-'} {_preview(text)}"
    return f"{role}: [{_preview(str(kind))}]"


def transcript_lines(messages: Iterable[Message | dict[str, Any]]) -> list[str]:
    """A conversation (typed, or as JSON: a `RunResumed` event's) as the lines the line UI
    shows for it, each safe for a terminal."""
    lines = []
    for message in messages:
        wire: dict[str, Any] = message.to_json() if isinstance(message, Message) else message
        role, content = wire["role"], wire["content"]
        if isinstance(content, str):
            lines.append(f"{role}: {_preview(content)}")
        else:
            lines += [_block_line(role, block) for block in content]
    return [strip_control(line) for line in lines]


def _self_rendered(name: str, verbose: bool) -> bool:
    return not verbose and name.startswith("ask_human_")


@attrs.define
class LineUI:
    """Renders events as lines."""

    out: TextIO = attrs.field(factory=lambda: sys.stdout)
    err: TextIO = attrs.field(factory=lambda: sys.stderr)
    trace: bool = False

    def wants(self, kind: type[Event]) -> bool:
        """Everything it draws: state entries only with `trace`."""
        return self.trace or kind is not StateEntered

    def _say(self, text: str) -> None:
        say(text, self.err)  # whatever a line is made of, no control sequence gets out

    def emit(self, event: Event) -> None:
        """Draw one event."""
        if isinstance(event, StateEntered) and self.trace:
            self._say(f"· {event.state} (iteration {event.iteration})")
        elif isinstance(event, MessageReceived) and not event.terminal and event.text:
            self._say(f"model: {_preview(event.text)}")
        elif isinstance(event, ToolCalled | ToolFinished) and _self_rendered(
            event.name, self.trace
        ):
            return  # the ask_human_* tools show their own prompt
        elif isinstance(event, ToolCalled):
            where = f" ({event.tool_kind}: {event.agent})" if event.agent else ""
            args = _preview(json.dumps(event.input, ensure_ascii=False))
            self._say(f"-> {event.name} {args}{where}")
        elif isinstance(event, ToolFinished):
            mark = "<- error:" if event.is_error else "<-"
            self._say(f"{mark} {_preview(event.output)}")
        elif isinstance(event, ApprovalAsked) and self.trace:
            self._say(f"approval asked: {_preview(event.tool)} [{_preview(event.tag)}]")
        elif isinstance(event, ApprovalGranted):
            self._say(f"approval granted: {_preview(event.tool)} ({event.answer})")
        elif isinstance(event, ApprovalDenied):
            self._say(f"approval denied: {_preview(event.tool)} ({_preview(event.reason)})")
        elif isinstance(event, WarningRaised):
            self._say(f"warning: {event.warning} {event.name}: {_preview(event.detail)}".strip())
        elif isinstance(event, RunResumed):
            self._say(
                f"resuming {event.run_id} ({event.status}) at iteration {event.iteration},"
                f" in {event.state}; transcript so far:"
            )
            for line in transcript_lines(event.messages):
                self._say(f"  {line}")
        elif isinstance(event, RunEnded):
            self._ended(event)

    def _ended(self, e: RunEnded) -> None:
        if e.state == States.COMPLETED:
            self.out.write(for_terminal(e.answer.rstrip("\n"), self.out) + "\n")
            self.out.flush()
        elif e.message:
            self._say(f"{e.state}: {e.message}")
        else:
            self._say(f"{e.state}")
        u = e.usage
        self._say(
            f"{e.model} · {e.llm_calls} llm calls · {e.tool_calls} tool calls · tokens"
            f" in {u.input_tokens} out {u.output_tokens} cache read {u.cache_read_tokens}"
            f" cache create {u.cache_create_tokens} · {e.seconds:.2f}s"
        )

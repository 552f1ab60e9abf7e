"""Replay: run a recorded session again from its journal, with no network.

`ReplayModel.from_records(records)` is a `ModelClient` that serves the recorded assistant replies
in order. Before it answers, it checks the request against the recording: the conversation
must equal the recorded one up to that call (content only: the `cache_control` keys that prompt
caching adds to copies are ignored), and the model, the system prompt, the tool set and the
thinking mode must match the recording's fingerprint (hashed by `fisk_sm.loop.fingerprint`). A
request that departs raises `ReplayDiverged`, a `ModelError`, so the run ends `failed` with one
line naming the iteration (0 for the first request) and what differed; when the conversation
differs, the line names the first differing journal record and `ReplayDiverged.diff` (kept as
`ReplayModel.divergence`, printed by `fisk-sm run --replay`) is a unified diff of what the
journal holds against what the replay sent (`fisk_sm.loop.replay_diff`)::

    replay diverged at iteration 1: message 2 differs from the recording at record 6
    (tool_result of mark, toolu_01)

`recorded_tools(records, tools)` turns tools into ones that answer from the journal instead of
running: a call gets the result recorded for its tool_use id, and a recorded `is_error` result
comes back as `is_error` (the answer raises `ToolError` with the recorded text). `replay(config,
records)` builds the whole replay run from agent.yaml: its tools, the ones in code and the
built-ins all answer from the recording (unless `live_tools`; the `ask_human_*` tools answer
from it even then: they hold a person's answers, not code). The operator's approvals come from
the journal too (`RecordedPrompter`): a replay never asks anyone again.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from typing import Protocol

import attrs

from fisk_sm.config.agent import AgentConfig
from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Assistant,
    Meta,
    Record,
    ToolResult,
    ToolStarted,
)
from fisk_sm.journal.snapshot import RunData, tool_uses
from fisk_sm.loop.fingerprint import digest
from fisk_sm.loop.harness import Harness, RunOptions
from fisk_sm.loop.replay_diff import Divergence, first_difference
from fisk_sm.loop.run import Run, new_run_id
from fisk_sm.model.anthropic import ModelError, ModelRequest
from fisk_sm.model.blocks import message_of
from fisk_sm.operator.prompter import Approval, ApprovalRequest, PromptError
from fisk_sm.tools.base import Tool, ToolBox, ToolError

__all__ = [
    "RecordedPrompter",
    "ReplayDiverged",
    "ReplayModel",
    "divergence_diff",
    "recorded_tools",
    "replay",
]

#: The built-in tools whose results are a person's answers: replayed from the journal always.
HUMAN_TOOLS = frozenset({"ask_human_confirm", "ask_human_select", "ask_human_input"})


class ReplayDiverged(ModelError):
    """A replayed run sent a request the recording does not have; the message says where, and
    `diff` (empty unless the conversation differs) shows how."""

    def __init__(self, message: str, diff: str = "") -> None:
        super().__init__(message)
        self.diff = diff


def _plain(value: object) -> object:
    """`value` without the `cache_control` keys that prompt caching adds to the copies sent."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list | tuple):
        return _plain_list(value)
    return value


def _plain_list(values: Iterable[object]) -> list[object]:
    """`_plain` of each of `values`."""
    return [_plain(v) for v in values]


def _meta(records: Sequence[Record]) -> Meta:
    if not records or not isinstance(records[0], Meta):
        raise ValueError("a recording starts with its meta record")
    return records[0]


@attrs.define
class ReplayModel:
    """A `ModelClient` that answers each request with the next recorded reply, after checking
    that the request is the one the recording made. It never builds an SDK client."""

    records: tuple[Record, ...]
    #: The recorded assistant turns, in order.
    turns: tuple[Assistant, ...]
    #: The index in `records` of each turn: the conversation sent for it is the fold before it.
    starts: tuple[int, ...]
    #: How many requests it has been sent: the next request's iteration.
    calls: int = 0
    #: The first divergence in the conversation, once a request departed there.
    divergence: Divergence | None = None

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> ReplayModel:
        """A replay of `records` (a session's journal, meta first: `FileStore(dir).load(id)`)."""
        kept = tuple(records)
        _meta(kept)
        found = [(i, r) for i, r in enumerate(kept) if isinstance(r, Assistant)]
        return cls(kept, tuple(r for _, r in found), tuple(i for i, _ in found))

    async def create(self, request: ModelRequest) -> JSONObject:
        """The recorded reply to `request`; raises `ReplayDiverged` if the request departs."""
        iteration = self.calls
        self.calls += 1
        problem = self.difference(iteration, request)
        if problem is not None:
            diff = self.divergence.diff if self.divergence is not None else ""
            raise ReplayDiverged(f"replay diverged at iteration {iteration}: {problem}", diff)
        turn = self.turns[iteration]
        usage = turn.usage
        return {
            "type": "message",
            "role": "assistant",
            "content": copy.deepcopy(turn.message.get("content") or []),
            "stop_reason": turn.stop_reason,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_input_tokens": usage.cache_read_tokens,
                "cache_creation_input_tokens": usage.cache_create_tokens,
            },
        }

    def difference(self, iteration: int, request: ModelRequest) -> str | None:
        """What makes `request` depart from the recording at `iteration`, or None."""
        saved = _meta(self.records).fingerprint
        if request.model != saved.get("model"):
            return (
                f"the model differs from the recording ({request.model!r}, recorded"
                f" {saved.get('model')!r})"
            )
        if not _same_system(_plain_list(request.system), saved.get("system_hash")):
            return "the system prompt differs from the recording"
        if digest(_plain_list(request.tools)) != saved.get("tools_hash"):
            return "the tool set differs from the recording"
        if request.thinking_label != saved.get("thinking"):  # "off", "adaptive", a budget
            return "the thinking mode differs from the recording"
        if iteration >= len(self.turns):
            return f"the recording ends after {len(self.turns)} model call(s)"
        recorded = _plain_list(
            m.to_json() for m in fold(self.records[: self.starts[iteration]]).messages
        )
        sent = _plain_list([m.to_json() for m in request.messages])
        found = first_difference(self.records, recorded, sent)
        if found is None:
            return None
        self.divergence = self.divergence or found
        if found.message >= min(len(sent), len(recorded)):
            return (
                f"the conversation has {len(sent)} messages, the recording {len(recorded)}"
                f" ({found.record})"
            )
        return found.describe()


def _same_system(system: list[object], saved_hash: object) -> bool:
    """Whether the blocks sent as `system` start with the recorded system prompt.

    The fingerprint hashes the system blocks alone; the context blocks sent after them (the
    memory index) may change from run to run. Context comes only after a system block (the
    memory note), so an empty prefix matches only an empty `system`.
    """
    shortest = min(1, len(system))
    return any(digest(system[:n]) == saved_hash for n in range(len(system), shortest - 1, -1))


class Answer(Protocol):
    """What a recorded tool calls: the next recorded result, for its keyword arguments."""

    def __call__(self, **arguments: object) -> Coroutine[object, object, str]: ...


@attrs.define
class _Answers:
    """The recorded results of a session's tool calls, handed out call by call."""

    #: The recorded result of each call, by tool_use id.
    results: dict[str, ToolResult]
    #: The recorded input of each call, by tool_use id.
    inputs: dict[str, JSONObject]
    #: By tool name, the ids of the calls that ran (a `tool_started` record), in order.
    queues: dict[str, deque[str]]

    @classmethod
    def of(cls, records: Iterable[Record]) -> _Answers:
        answers = cls({}, {}, {})
        for record in records:
            if isinstance(record, Assistant):
                uses = tool_uses(message_of(record.message))
                answers.inputs.update((u.id, u.input) for u in uses)
            elif isinstance(record, ToolStarted):
                queue = answers.queues.setdefault(record.name, deque())
                if record.tool_use_id not in queue:  # a call retried after a crash runs once
                    queue.append(record.tool_use_id)
            elif isinstance(record, ToolResult):
                answers.results[record.tool_use_id] = record
        return answers

    def answerer(self, name: str) -> Answer:
        """The function a recorded tool `name` calls: the next recorded call's result."""

        async def answer(**arguments: object) -> str:
            queue = self.queues.get(name)
            if not queue:
                raise ToolError(f"replay: the recording has no further {name!r} call to answer")
            use_id = queue.popleft()
            if _plain(self.inputs.get(use_id)) != _plain(arguments):
                raise ToolError(f"replay: {name!r} was called with other input than {use_id}")
            recorded = self.results.get(use_id)
            if recorded is None:
                raise ToolError(f"replay: call {use_id} has no recorded result")
            content = recorded.result.get("content", "")
            text = content if isinstance(content, str) else str(content)
            if recorded.is_error:
                raise ToolError(text)  # the tool box makes it an is_error result, text as is
            return text

        return answer


def recorded_tools(records: Iterable[Record], tools: Iterable[Tool]) -> list[Tool]:
    """`tools` answering from the recording instead of running: same definitions, so the tool
    set still matches the recording's fingerprint.

    Each call gets the result recorded for its tool_use id (the calls of one tool are answered
    in the recorded order, and each one's input is checked against the recorded call's); a
    recorded `is_error` result comes back as `is_error`. A call the recording never ran gets an
    `is_error` result, never a live run.
    """
    answers = _Answers.of(records)
    return [attrs.evolve(t, fn=answers.answerer(t.name)) for t in tools]


class RecordedPrompter:
    """The operator of a replay: it answers each gated call with the answer the journal holds
    (`approval_requested`, then its `approval_answered`), in the recorded order, and asks nobody.

    A call the recording never put to the operator, or one with other input, is refused with a
    reason naming it (the gate denies it), so the replay departs at its next request and the
    divergence shows the difference. A recorded denial whose prompt failed keeps its reason.
    Questions other than approvals (a crash-interrupted call) get no answer.
    """

    def __init__(self, records: Iterable[Record]) -> None:
        asked: dict[str, ApprovalRequested] = {}
        answered: dict[str, ApprovalAnswered] = {}
        for record in records:
            if isinstance(record, ApprovalRequested):
                asked.setdefault(record.tool_use_id, record)  # asked again after a resume
            elif isinstance(record, ApprovalAnswered):
                answered[record.tool_use_id] = record
        self.approvals = deque(
            (request, answered[use_id]) for use_id, request in asked.items() if use_id in answered
        )

    @property
    def available(self) -> bool:
        """Always: the recording answers."""
        return True

    async def approve(self, request: ApprovalRequest) -> Approval:
        """The recorded answer to the next recorded approval, if `request` is that call."""
        if not self.approvals:
            raise PromptError(f"replay: the recording has no further approval of {request.tool}")
        asked, answer = self.approvals.popleft()
        if asked.name != request.tool or _plain(asked.input) != _plain(dict(request.arguments)):
            raise PromptError(
                f"replay: the recorded approval ({asked.name}, {asked.tool_use_id}) was for"
                " another call"
            )
        if answer.answer == Approval.NO.value and answer.reason:
            raise PromptError(answer.reason)  # the gate journals it as the same denial
        return Approval(answer.answer)

    async def confirm(self, question: str) -> bool:
        """No answer: a replay asks nobody."""
        raise PromptError("a replay asks nobody")

    async def select(self, question: str, options: Sequence[str]) -> int | None:
        """No answer: a replay asks nobody."""
        raise PromptError("a replay asks nobody")

    async def ask(self, question: str, default: str | None) -> str | None:
        """No answer: a replay asks nobody."""
        raise PromptError("a replay asks nobody")


def divergence_diff(run: Run) -> str:
    """The unified diff of where replayed `run` departed from its recording ("" if it did not,
    or not in its conversation)."""
    model = run.harness.model
    if isinstance(model, ReplayModel) and model.divergence is not None:
        return model.divergence.diff
    return ""


def replay(
    config: AgentConfig,
    records: Sequence[Record],
    options: RunOptions | None = None,
    *,
    live_tools: bool = False,
) -> Run:
    """A new run of the recorded prompt on `config`, answered by a `ReplayModel`.

    Every tool the harness builds (agent.yaml's, `options.tools`, the built-ins) answers from
    the recording, unless `live_tools`, which runs them again. `options.model` is replaced by
    the replay, and so is `options.prompter`: the gate gets the journaled approvals
    (`RecordedPrompter`), and the `ask_human_*` tools their recorded results, even with
    `live_tools`. The rest of `options` is used as given (its journal, by default in memory,
    gets the replay's records, not the recording's).
    """
    meta = _meta(records)
    model = ReplayModel.from_records(records)
    prompter = RecordedPrompter(records)
    given = options or RunOptions()
    harness = Harness.build(config, attrs.evolve(given, model=model, prompter=prompter))
    tools = list(harness.tools.tools.values())
    recorded = {t.name for t in tools if not live_tools or t.name in HUMAN_TOOLS}
    if recorded:
        answered = iter(recorded_tools(records, [t for t in tools if t.name in recorded]))
        harness.tools = ToolBox.of(next(answered) if t.name in recorded else t for t in tools)
    return Run(RunData.begin(new_run_id(), meta.prompt), harness)

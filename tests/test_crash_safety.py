"""Crash safety through the real CLI: real subprocesses, real signals, real files.

Each trial starts `fisk-sm run --checkpoint` against a loopback fake model (4 turns of 2 tool
calls, then a final answer), hits it with one signal, then resumes it through the CLI until it
completes. The side-effect file, the fake's request log and the journal then show what ran
twice: after a SIGTERM no tool, and no model call but one in flight that the suspend-now cut
(its reply was never used: the resume makes it again), after a SIGKILL at most the one tool the
journal shows as interrupted (none under `crash_policy: fail`) and the one model call in flight.

Most signals come from failpoints (`FISK_FAILPOINT`, see `fisk_sm.journal.failpoint`): the
process signals itself at an exact record, so every phase of the loop is hit on every run of the
suite. The rest land at a seeded random moment after the first model call; the final reply is
held back until the signal is sent, so a random signal can never miss the run. Each trial is
classified by the journal at the moment of its signal (mid-call, mid-tool, between tools, after
the final answer), and each test asserts that its signals landed in every phase. Run with -s to
see the counts. The processes come from crashkit (forked from a server that imported the SDK
once; a few trials run `python -m fisk_sm.cli` itself).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crashkit import STALL, Command, Stalled, run, size

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import Assistant, Record, Terminal, ToolResult, ToolStarted
from fisk_sm.journal.snapshot import Snapshot
from fisk_sm.loop.actions import INTERRUPTED
from fisk_sm.machine.guards import CALL_CANCELLED
from fisk_sm.model.blocks import Message
from fisk_sm.testing import FakeMessagesAPI, Reply, turn_of

pytestmark = pytest.mark.slow

TURNS = 4
LABELS = [f"t{turn}{side}" for turn in range(TURNS) for side in "ab"]
IDS = [f"toolu_{label}" for label in LABELS]
#: A random signal lands this long (at most) after the first model request.
WINDOW = 0.8
WORKERS = 6  # trials at a time
#: The phases every test must hit: waiting for the model, a tool running, between two tools.
PHASES = ("call", "tool", "between tools")
TOOLS = '''
import os
import time
from pathlib import Path

PAUSE = float(os.environ.get("CRASH_TOOL_PAUSE", "0"))


def effect(label: str) -> str:
    """Take a while, record a side effect, take a while."""
    time.sleep(PAUSE)
    fd = os.open(Path(__file__).with_name("effects.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{label}\\n".encode())
    finally:
        os.close(fd)
    time.sleep(PAUSE)
    return "did " + label
'''


class TurnAPI(FakeMessagesAPI):
    """Answers by the number of assistant turns in the request (a responder), so a re-paid
    call is answered the same way.

    The final answer is held back until `released` is set: a random signal then always finds
    the run still going.
    """

    def __init__(self, script: Iterable[Reply]) -> None:
        super().__init__(responder=self._reply)
        self.script = tuple(script)
        self.released = threading.Event()

    def _reply(self, body: dict[str, Any]) -> Reply:
        turn = turn_of(body)
        if turn == TURNS:
            self.released.wait(STALL)
        if turn >= len(self.script):
            raise LookupError(f"no reply scripted for turn {turn}")
        return self.script[turn]


def script(rng: random.Random | None) -> list[Reply]:
    def delay() -> float:
        return rng.uniform(0.05, 0.15) if rng is not None else 0.0

    uses = [Reply.tool_use("effect", {"label": x}, id=f"toolu_{x}").content[0] for x in LABELS]
    turns = [
        Reply(content=uses[i : i + 2], stop_reason="tool_use", delay=delay()) for i in (0, 2, 4, 6)
    ]
    return [*turns, Reply.text("all done", delay=delay())]


@dataclass(frozen=True)
class Plan:
    """One trial: a failpoint (`WHEN:TYPE:N`), or a random moment drawn from `seed`."""

    sig: signal.Signals
    policy: str
    failpoint: str = ""
    seed: int = 0
    exec_: bool = False

    @property
    def name(self) -> str:
        how = f"failpoint {self.failpoint}" if self.failpoint else f"seed {self.seed}"
        return how + (" (exec)" if self.exec_ else "")


@dataclass
class Trial:
    plan: Plan
    exit_code: int  # of the signalled run
    phase: str  # where the signal landed, by the journal at that moment
    after: Snapshot  # the journal the signal left, folded (before any resume)
    final: Snapshot
    records: list[Record]  # the final journal
    resumes: int
    requests: list[dict[str, Any]]
    effects: collections.Counter[str]


def env(**extra: str) -> dict[str, str]:
    """The children's environment: this one's, without what would steer the run elsewhere."""
    unwanted = ("ANTHROPIC_BASE_URL", "FISK_FAILPOINT", "CRASH_TOOL_PAUSE")
    full = {k: v for k, v in os.environ.items() if k not in unwanted}
    return {**full, "ANTHROPIC_API_KEY": "test", **extra}


def journal(state: Path) -> list[Record]:
    return FileStore(state).load("s")  # a torn last line is dropped


def phase_at(records: list[Record]) -> str:
    """Where a run stands when its journal is `records`: in a model call (its answer not yet
    journaled), in a tool (its intent journaled, its result not), between tools, after the
    final answer (not yet ended) or ended."""
    last = records[-1]
    if isinstance(last, Terminal):
        return "ended"
    if isinstance(last, ToolStarted):
        return "tool"
    turns = [i for i, r in enumerate(records) if isinstance(r, Assistant)]
    if not turns:
        return "call"
    turn = records[turns[-1]]
    assert isinstance(turn, Assistant)
    uses = [b for b in turn.message["content"] if b.get("type") == "tool_use"]
    if not uses:
        return "answered"
    answered = sum(isinstance(r, ToolResult) for r in records[turns[-1] :])
    return "between tools" if answered < len(uses) else "call"


def expected_phase(failpoint: str) -> str:
    """Where `WHEN:TYPE:N` stops this script's run (4 turns of 2 tools, then the answer)."""
    when, kind, count = failpoint.split(":")[:3]
    n = int(count)
    if kind == "tool_started":
        return "tool" if when == "after" else "between tools"
    if kind == "tool_result":
        if when == "before":
            return "tool"
        return "between tools" if n % 2 else "call"
    if kind == "assistant":
        if when == "before":
            return "call"
        return "between tools" if n <= TURNS else "answered"
    assert (when, kind) == ("before", "terminal"), failpoint
    return "answered"


FIRED = re.compile(r"fisk-sm: failpoint (\S+) at seq (\d+)")


def run_trial(work: Path, plan: Plan) -> Trial:
    """Start a session, signal it once, then resume it to completion."""
    rng = random.Random(plan.seed) if not plan.failpoint else None
    work.mkdir()
    (work / "crash_tools.py").write_text(TOOLS)
    state, agent = work / "state", work / "agent.yaml"
    with TurnAPI(script(rng)) as api:
        agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
            f"tools: [{{python: 'crash_tools:effect', crash_policy: {plan.policy}}}]\n"
        )
        args, log = ["run", "-c", str(agent), "--state-dir", str(state)], work / "run.log"

        def progress() -> object:
            return size(log, state / "s.json"), len(api.requests)

        extra = {"CRASH_TOOL_PAUSE": "0.025"} if rng is not None else {}
        if plan.failpoint:
            api.released.set()
            extra["FISK_FAILPOINT"] = f"{plan.failpoint}:{plan.sig.name}"
        argv = [*args, "--checkpoint", "--name", "s", "go"]
        proc = Command(argv, env(**extra), log, exec_=plan.exec_)
        try:
            if rng is None:
                exit_code = proc.wait(progress)
                fired = FIRED.findall(log.read_text())
                assert len(fired) == 1, f"the failpoint fired {len(fired)} times: {log}"
                phase = phase_at(journal(state)[: int(fired[0][1])])
            else:
                phase = signal_at_random(proc, api, rng, plan.sig, state, progress)
                exit_code = proc.wait(progress)
        finally:
            api.released.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        after = fold(journal(state))
        resumes = 0
        while fold(journal(state)).status != "completed" and resumes < 3:
            resumes += 1
            code = run([*args, "--resume", "s"], env(), log, progress, exec_=plan.exec_)
            assert code == 0, f"resume exited {code}: {log.read_text()[-2000:]}"
        requests = list(api.requests)
    log_path = work / "effects.log"
    effects = collections.Counter(log_path.read_text().split() if log_path.exists() else [])
    final = journal(state)
    return Trial(plan, exit_code, phase, after, fold(final), final, resumes, requests, effects)


def signal_at_random(
    proc: Command,
    api: TurnAPI,
    rng: random.Random,
    sig: signal.Signals,
    state: Path,
    progress: Callable[[], object],
) -> str:
    """Send `sig` at a seeded moment after the first model request; the phase it landed in.

    The final answer is held back until the signal is sent, so the run is still going. For a
    SIGKILL the phase is read from the journal it left; for a SIGTERM, from the journal read
    just before it is sent (the run may have moved on by a step since).
    """
    last, since = progress(), time.monotonic()
    while not api.requests:  # the moment starts with the loop
        assert proc.poll() is None, f"the run exited {proc.poll()} before calling the model"
        time.sleep(0.002)
        if (now := progress()) != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > STALL:
            raise Stalled("the run never called the model")
    time.sleep(rng.uniform(0.0, WINDOW))
    before = journal(state)
    proc.send_signal(sig)
    api.released.set()
    if sig == signal.SIGKILL:
        proc.wait(progress)
        return phase_at(journal(state))
    return phase_at(before)


def run_trials(tmp_path: Path, plans: list[Plan], check: Callable[[Trial], None]) -> list[Trial]:
    """All trials, WORKERS at a time; every failing trial is reported, not just the first."""

    def one(index: int, plan: Plan) -> Trial | str:
        try:
            trial = run_trial(tmp_path / f"trial-{index}", plan)
            check(trial)
            if plan.failpoint:
                want = expected_phase(plan.failpoint)
                assert trial.phase == want, f"landed {trial.phase!r}, meant {want!r}"
                if plan.sig == signal.SIGKILL:
                    assert trial.exit_code == -signal.SIGKILL, f"exit code {trial.exit_code}"
        except Exception as exc:
            return f"{plan.name}: {type(exc).__name__}: {exc}"
        return trial

    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(one, range(len(plans)), plans))
    failures = [o for o in outcomes if isinstance(o, str)]
    assert not failures, "\n".join(failures)
    return [o for o in outcomes if isinstance(o, Trial)]


def plans(
    sig: signal.Signals, policy: str, failpoints: Iterable[str], seeds: range, execs: int = 2
) -> list[Plan]:
    """A trial per failpoint, then one per seed (the first `execs` of them through exec)."""
    fixed = [Plan(sig, policy, failpoint=f) for f in failpoints]
    drawn = [Plan(sig, policy, seed=s, exec_=i < execs) for i, s in enumerate(seeds)]
    return fixed + drawn


def each(when: str, kind: str, counts: Iterable[int]) -> list[str]:
    return [f"{when}:{kind}:{n}" for n in counts]


TOOL_COUNTS = range(1, 2 * TURNS + 1)
CALL_COUNTS = range(1, TURNS + 2)
#: Every record boundary of the script's run.
EVERY = [
    *each("after", "tool_started", TOOL_COUNTS),
    *each("before", "tool_result", TOOL_COUNTS),
    *each("after", "tool_result", TOOL_COUNTS),
    *each("before", "assistant", CALL_COUNTS),
    *each("after", "assistant", CALL_COUNTS),
    "before:terminal:1",
]


def key(messages: Iterable[Message | dict[str, Any]]) -> str:
    """A conversation (typed, or as a request sent it) as comparable text."""
    wire = [m.to_json() if isinstance(m, Message) else m for m in messages]
    return json.dumps(wire, sort_keys=True)


def blocks(snapshot: Snapshot, kind: str) -> list[dict[str, Any]]:
    """The content blocks of type `kind` in the folded conversation, in order."""
    return [
        block.to_json()
        for message in snapshot.messages
        for block in message.blocks()
        if block.type == kind
    ]


def started(trial: Trial) -> collections.Counter[str]:
    return collections.Counter(r.tool_use_id for r in trial.records if isinstance(r, ToolStarted))


def check_common(trial: Trial, repeatable: str | None) -> None:
    """Completed; one result per call; every turn asked for, and only `repeatable` twice."""
    final = trial.final
    assert final.status == "completed", f"final status {final.status}"
    assert trial.resumes <= 1, f"{trial.resumes} resumes (a resumed run suspended)"
    assert final.messages[-1].to_json()["content"][-1]["text"] == "all done", final.messages[-1]
    assert [b["id"] for b in blocks(final, "tool_use")] == IDS
    answered = collections.Counter(b["tool_use_id"] for b in blocks(final, "tool_result"))
    assert answered == collections.Counter(IDS), f"tool_results per id: {answered}"
    journaled = collections.Counter(
        r.tool_use_id for r in trial.records if isinstance(r, ToolResult)
    )
    assert journaled == collections.Counter(IDS), f"tool_result records per id: {journaled}"
    turns = {sum(m["role"] == "assistant" for m in r["messages"]) for r in trial.requests}
    assert turns == set(range(TURNS + 1)), f"model asked at turns {sorted(turns)}"
    asked = collections.Counter(key(r["messages"]) for r in trial.requests)
    repeats = {k: n for k, n in asked.items() if n > 1}
    assert all(k == repeatable and n == 2 for k, n in repeats.items()), (
        f"repeated model calls, at message counts {[len(json.loads(k)) for k in repeats]}"
    )


def interrupted_ids(trial: Trial) -> list[str]:
    interrupted = list(trial.after.interrupted)
    assert len(interrupted) <= 1, f"several tools interrupted at once: {interrupted}"
    return interrupted


def report_and_check_phases(name: str, trials: list[Trial], **counts: int) -> None:
    """Print where the signals landed; every phase of PHASES must have been hit."""
    phases = collections.Counter(t.phase for t in trials)
    drawn = collections.Counter(t.phase for t in trials if not t.plan.failpoint)
    more = "".join(f", {what} {n}" for what, n in counts.items())
    print(
        f"\n{name}: {len(trials)} trials; signal landed: {dict(phases)}"
        f" (random ones: {dict(drawn)}){more}"
    )
    missed = [phase for phase in PHASES if not phases[phase]]
    assert not missed, f"no signal landed in: {', '.join(missed)}; landed: {dict(phases)}"


def check_landed_before_the_end(trial: Trial) -> None:
    """A random SIGKILL finds the run going (its final answer is held until the signal)."""
    if not trial.plan.failpoint and trial.plan.sig == signal.SIGKILL:
        assert trial.exit_code == -signal.SIGKILL, f"the signalled run exited {trial.exit_code}"
        assert trial.after.status == "open", trial.after.status


SIGTERM_POINTS = [
    *each("after", "tool_started", (1, 4, 6, 8)),
    *each("before", "tool_result", (2, 7)),
    *each("after", "tool_result", (1, 2, 5)),
    *each("before", "assistant", CALL_COUNTS),
    *each("after", "assistant", range(1, TURNS + 1)),
]


def test_sigterm_suspend_is_exactly_once(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        assert trial.exit_code == 0, f"the signalled run exited {trial.exit_code}"
        # A SIGTERM during a call cuts it (suspend now), unless its reply is already in: then
        # the run suspends at the next boundary, or completes on the final answer.
        cut = trial.after.outcome == CALL_CANCELLED
        assert trial.phase == "call" or not cut, f"a call cut in phase {trial.phase}"
        want = ("suspended", "completed") if trial.phase == "call" else ("suspended",)
        assert trial.after.status in want, trial.after.status
        assert not trial.after.interrupted, "a suspend left a tool interrupted"
        check_common(trial, repeatable=key(trial.after.messages) if cut else None)
        # (a call cut before its request went out never reached the fake model)
        calls = {TURNS + 1, TURNS + 1 + cut}
        assert len(trial.requests) in calls, f"{len(trial.requests)} model calls"
        assert trial.effects == collections.Counter(LABELS), f"side effects: {trial.effects}"
        assert started(trial) == collections.Counter(IDS), f"tool_started: {started(trial)}"

    trials = run_trials(
        tmp_path, plans(signal.SIGTERM, "retry", SIGTERM_POINTS, range(1000, 1010)), check
    )
    suspended = sum(t.after.status == "suspended" for t in trials)
    report_and_check_phases("SIGTERM", trials, suspended=suspended)


def test_sigkill_repeats_at_most_the_interrupted_tool(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        check_landed_before_the_end(trial)
        check_common(trial, repeatable=key(trial.after.messages))
        interrupted = interrupted_ids(trial)
        for use_id, label in zip(IDS, LABELS, strict=True):
            runs, again = trial.effects[label], use_id in interrupted
            assert runs in ((1, 2) if again else (1,)), f"{label} ran {runs} times"
            assert started(trial)[use_id] == 1 + again, f"tool_started: {started(trial)}"

    trials = run_trials(tmp_path, plans(signal.SIGKILL, "retry", EVERY, range(2000, 2020)), check)
    report_and_check_phases(
        "SIGKILL retry",
        trials,
        tool_twice=sum(2 in t.effects.values() for t in trials),
        call_repaid=sum(len(t.requests) > TURNS + 1 for t in trials),
    )


FAIL_POINTS = [
    *each("after", "tool_started", TOOL_COUNTS),
    *each("before", "tool_result", TOOL_COUNTS),
    *each("before", "assistant", (2, 5)),
    *each("after", "tool_result", (3,)),
]


def test_sigkill_with_crash_policy_fail_never_repeats_a_tool(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        check_landed_before_the_end(trial)
        check_common(trial, repeatable=key(trial.after.messages))
        interrupted = interrupted_ids(trial)
        for label in LABELS:
            runs = trial.effects[label]
            assert runs in ((0, 1) if f"toolu_{label}" in interrupted else (1,)), (
                f"{label} ran {runs} times"
            )
        assert started(trial) == collections.Counter(IDS), f"tool_started: {started(trial)}"
        results = {b["tool_use_id"]: b for b in blocks(trial.final, "tool_result")}
        for use_id in IDS:
            expected = {"content": INTERRUPTED, "is_error": True} if use_id in interrupted else {}
            got = {k: v for k, v in results[use_id].items() if k in ("content", "is_error")}
            assert got == (expected or {"content": "did " + use_id[6:]}), results[use_id]

    trials = run_trials(
        tmp_path, plans(signal.SIGKILL, "fail", FAIL_POINTS, range(3000, 3006)), check
    )
    report_and_check_phases(
        "SIGKILL fail",
        trials,
        tool_never_ran=sum(0 in (t.effects[label] for label in LABELS) for t in trials),
        call_repaid=sum(len(t.requests) > TURNS + 1 for t in trials),
    )

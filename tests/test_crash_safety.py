"""Crash safety through the real CLI: real subprocesses, real signals, real files.

Each trial starts `fisk-sm run --checkpoint` against a loopback fake model (4 turns of 2 tool
calls, then a final answer), hits it with one signal at a seeded random moment, then resumes it
through the CLI until it completes. The side-effect file, the fake's request log and the journal
then show what ran twice: after a SIGTERM nothing, after a SIGKILL at most the one tool the
journal shows as interrupted (none under `crash_policy: fail`) and the one model call in flight.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fisk_sm.actions import INTERRUPTED
from fisk_sm.filestore import FileStore
from fisk_sm.fold import fold
from fisk_sm.snapshot import Snapshot
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
TURNS = 4
LABELS = [f"t{turn}{side}" for turn in range(TURNS) for side in "ab"]
RUN_LENGTH = 1.2  # seconds from the meta record to the end of a run, roughly (moments span it)
WORKERS = 3
TOOLS = '''
import os
import time
from pathlib import Path

EFFECTS = Path(__file__).with_name("effects.log")


def effect(label: str) -> str:
    """Record a side effect, then take a while."""
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{label}\\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.05)
    return "did " + label
'''


class TurnAPI(FakeMessagesAPI):
    """Answers by the number of assistant turns in the request, so a re-paid call is answered
    the same way (the base class pops its script, which a repeated call would skew)."""

    def __init__(self, script: Iterable[Reply]) -> None:
        super().__init__()
        self.script = tuple(script)

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Reply | None]:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            turn = sum(m.get("role") == "assistant" for m in body.get("messages", []))
            return len(self.requests), self.script[turn] if turn < len(self.script) else None


def script(rng: random.Random) -> list[Reply]:
    replies = []
    for turn in range(TURNS):
        blocks = [
            Reply.tool_use("effect", {"label": label}, id=f"toolu_{label}").content[0]
            for label in (f"t{turn}a", f"t{turn}b")
        ]
        replies.append(Reply(content=blocks, stop_reason="tool_use", delay=rng.uniform(0.05, 0.15)))
    return [*replies, Reply.text("all done", delay=rng.uniform(0.05, 0.15))]


@dataclass
class Trial:
    seed: int
    exit_code: int  # of the signalled run
    after: Snapshot  # the journal the signal left, folded
    final: Snapshot
    requests: list[dict[str, Any]]
    effects: collections.Counter[str]


def env() -> dict[str, str]:
    full = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    full.pop("ANTHROPIC_BASE_URL", None)
    return full


def load(state: Path) -> Snapshot:
    return fold(FileStore(state).load("s"))


def run_trial(work: Path, seed: int, sig: signal.Signals, policy: str) -> Trial:
    """Start a session, signal it once at a seeded moment, then resume it to completion."""
    rng = random.Random(seed)
    work.mkdir()
    (work / "crash_tools.py").write_text(TOOLS)
    state, agent = work / "state", work / "agent.yaml"
    with TurnAPI(script(rng)) as api:
        agent.write_text(
            f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
            f"tools: [{{python: 'crash_tools:effect', crash_policy: {policy}}}]\n"
        )
        args = [*CLI, "run", "-c", str(agent), "--state-dir", str(state)]
        with (work / "run.log").open("w") as log:
            proc = subprocess.Popen(
                [*args, "--checkpoint", "--name", "s", "go"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env(),
            )
        try:
            deadline = time.monotonic() + 60
            while not (state / "s.json").exists() and proc.poll() is None:
                assert time.monotonic() < deadline, "the session never started"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.05, RUN_LENGTH))
            if proc.poll() is None:
                proc.send_signal(sig)
            exit_code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        after = load(state)  # folds without error, a torn last line dropped
        for _ in range(3):
            if load(state).status == "completed":
                break
            done = subprocess.run(
                [*args, "--resume", "s"], capture_output=True, text=True, env=env(), timeout=60
            )
            assert done.returncode == 0, f"resume exited {done.returncode}: {done.stderr}"
        requests = list(api.requests)
    effects_file = work / "effects.log"
    effects = effects_file.read_text().splitlines() if effects_file.exists() else []
    return Trial(seed, exit_code, after, load(state), requests, collections.Counter(effects))


def run_trials(
    tmp_path: Path,
    seeds: range,
    sig: signal.Signals,
    policy: str,
    check: Callable[[Trial], None],
) -> list[Trial]:
    """All trials, WORKERS at a time; every failing seed is reported, not just the first."""

    def one(seed: int) -> Trial | str:
        try:
            trial = run_trial(tmp_path / f"trial-{seed}", seed, sig, policy)
            check(trial)
        except AssertionError as exc:
            return f"seed {seed}: {exc}"
        return trial

    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(one, seeds))
    failures = [o for o in outcomes if isinstance(o, str)]
    assert not failures, "\n".join(failures)
    return [o for o in outcomes if isinstance(o, Trial)]


def key(messages: Iterable[dict[str, Any]]) -> str:
    return json.dumps(list(messages), sort_keys=True)


def results_by_id(snapshot: Snapshot) -> dict[str, list[dict[str, Any]]]:
    """Each tool_use id of the conversation, with the tool_results answering it."""
    found: dict[str, list[dict[str, Any]]] = {}
    for message in snapshot.messages:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_use":
                found.setdefault(block["id"], [])
    for message in snapshot.messages:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result":
                found.setdefault(block["tool_use_id"], []).append(block)
    return found


def check_common(trial: Trial, repeatable: str | None) -> None:
    """Completed; one result per call; each turn asked for, only `repeatable` asked twice."""
    final = trial.final
    assert final.status == "completed", f"final status {final.status}"
    assert final.messages[-1]["content"][-1]["text"] == "all done", final.messages[-1]
    results = results_by_id(final)
    assert sorted(results) == sorted(f"toolu_{label}" for label in LABELS), sorted(results)
    counts = {use_id: len(found) for use_id, found in results.items()}
    assert set(counts.values()) == {1}, f"results per tool_use id: {counts}"
    asked = collections.Counter(key(r["messages"]) for r in trial.requests)
    turns = sorted({sum(m["role"] == "assistant" for m in r["messages"]) for r in trial.requests})
    assert turns == list(range(TURNS + 1)), f"model asked at turns {turns}"
    repeats = {k: n for k, n in asked.items() if n > 1}
    assert all(k == repeatable and n == 2 for k, n in repeats.items()), (
        f"repeated model calls (at message counts {[len(json.loads(k)) for k in repeats]})"
    )


def interrupted_labels(trial: Trial) -> list[str]:
    interrupted = [use_id.removeprefix("toolu_") for use_id in trial.after.interrupted]
    assert len(interrupted) <= 1, f"several tools interrupted at once: {interrupted}"
    return interrupted


def report(name: str, trials: list[Trial], **counts: int) -> None:
    parts = ", ".join(f"{what} {n}" for what, n in counts.items())
    print(f"\n{name}: {len(trials)} trials: {parts}")


def test_sigterm_suspend_is_exactly_once(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        assert trial.exit_code == 0, f"the signalled run exited {trial.exit_code}"
        assert trial.after.status in ("suspended", "completed"), trial.after.status
        assert not trial.after.interrupted, "a suspend left a tool interrupted"
        check_common(trial, repeatable=None)
        assert trial.effects == collections.Counter(LABELS), f"side effects {trial.effects}"
        assert len(trial.requests) == TURNS + 1, f"{len(trial.requests)} model calls"

    trials = run_trials(tmp_path, range(1000, 1024), signal.SIGTERM, "retry", check)
    suspended = sum(t.after.status == "suspended" for t in trials)
    report("SIGTERM", trials, suspended=suspended, completed=len(trials) - suspended)


def test_sigkill_repeats_at_most_the_interrupted_tool(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        check_common(trial, repeatable=key(trial.after.messages))
        interrupted = interrupted_labels(trial)
        for label in LABELS:
            allowed = (1, 2) if label in interrupted else (1,)
            assert trial.effects[label] in allowed, f"{label} ran {trial.effects[label]} times"

    trials = run_trials(tmp_path, range(2000, 2050), signal.SIGKILL, "retry", check)
    report(
        "SIGKILL retry",
        trials,
        killed=sum(t.exit_code == -signal.SIGKILL for t in trials),
        mid_tool=sum(bool(t.after.interrupted) for t in trials),
        tool_twice=sum(2 in t.effects.values() for t in trials),
        call_repaid=sum(len(t.requests) > TURNS + 1 for t in trials),
    )


def test_sigkill_with_crash_policy_fail_never_repeats_a_tool(tmp_path: Path) -> None:
    def check(trial: Trial) -> None:
        check_common(trial, repeatable=key(trial.after.messages))
        interrupted = interrupted_labels(trial)
        for label in LABELS:
            allowed = (0, 1) if label in interrupted else (1,)
            assert trial.effects[label] in allowed, f"{label} ran {trial.effects[label]} times"
        for label in interrupted:
            [result] = results_by_id(trial.final)[f"toolu_{label}"]
            assert result.get("is_error") is True, result
            assert result["content"] == INTERRUPTED, result

    trials = run_trials(tmp_path, range(3000, 3024), signal.SIGKILL, "fail", check)
    report(
        "SIGKILL fail",
        trials,
        killed=sum(t.exit_code == -signal.SIGKILL for t in trials),
        mid_tool=sum(bool(t.after.interrupted) for t in trials),
        tool_lost=sum(0 in (t.effects[label] for label in LABELS) for t in trials),
        call_repaid=sum(len(t.requests) > TURNS + 1 for t in trials),
    )

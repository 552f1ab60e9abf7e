"""The evaluator: `transitions` fires every trigger, and `Step` says what it evaluated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, make_run

from fisk_sm import Step
from fisk_sm.loop.hooks import HOOKS
from fisk_sm.loop.run import loop_machine
from fisk_sm.machine.evaluator import GuardCheck, LoopMachine, build_machine
from fisk_sm.machine.table import load_table
from fisk_sm.testing import FakeMessagesAPI, Reply


class Probe:
    """A stand-in run: the test sets each guard's outcome and reads what the machine did."""

    def __init__(self, state: str, **outcomes: bool) -> None:
        self.state = state
        self.outcomes = outcomes
        self.asked: list[str] = []
        self.entered: list[str] = []


def probe_machine(path: Path | None = None) -> LoopMachine:
    """The real table, with guards that answer from the probe and hooks that note the entry."""
    table = load_table(path)

    def guard(name: str) -> Any:
        def ask(run: Probe) -> bool:
            run.asked.append(name)
            return run.outcomes.get(name, False)

        return ask

    def hook(name: str) -> Any:
        return lambda run, fire: run.entered.append(f"{name}:{run.state}")

    return build_machine(
        table, {n: guard(n) for n in table.guard_names}, {h: hook(h) for h in HOOKS}
    )


CHAT_STOP = ("awaiting_input", "chat_turn_stopped")
CHAT_CALL = ("awaiting_input", "chat_call_failed")
CHAT_END = ("awaiting_input", "chat_turn_ended")
CAP = ("iterations_exhausted", "iteration_cap_reached")
SUSPEND = ("suspended", "suspend_requested")
CANCELLED = ("suspended", "call_cancelled")
UNUSABLE = ("failed", "turn_unusable")
FINAL = ("completed", "turn_is_final")
BUDGET = ("budget_exhausted", "over_budget")
PENDING_GATE = ("gate", "tools_pending")
ASKING = ("awaiting_approval", "approval_pending")
STILL_PENDING = ("suspended", "approval_pending")
ASLEEP = ("suspended", "suspend_requested")
ENDED = ("completed", "input_ended")


@pytest.mark.parametrize(
    ("source", "outcomes", "destination", "guard", "tried"),
    [
        ("suspend_check", {}, "call", None, [CHAT_STOP, CAP, SUSPEND]),
        ("suspend_check", {"iteration_cap_reached": True, "suspend_requested": True},
         "iterations_exhausted", "iteration_cap_reached", [CHAT_STOP]),
        ("suspend_check", {"suspend_requested": True}, "suspended", "suspend_requested",
         [CHAT_STOP, CAP]),
        ("suspend_check", {"chat_turn_stopped": True, "iteration_cap_reached": True},
         "awaiting_input", "chat_turn_stopped", []),
        ("call", {"call_failed": True}, "failed", "call_failed", [CANCELLED, CHAT_CALL]),
        ("call", {"chat_call_failed": True, "call_failed": True},
         "awaiting_input", "chat_call_failed", [CANCELLED]),
        ("call", {"call_cancelled": True, "call_failed": True},
         "suspended", "call_cancelled", []),
        ("journal", {}, "decide", None, []),
        ("decide", {"turn_is_final": True}, "completed", "turn_is_final", [CHAT_END, UNUSABLE]),
        ("decide", {}, "budget_check", None, [CHAT_END, UNUSABLE, FINAL]),
        ("decide", {"chat_turn_ended": True, "turn_is_final": True},
         "awaiting_input", "chat_turn_ended", []),
        ("budget_check", {"tools_pending": True}, "gate", "tools_pending", [BUDGET]),
        ("budget_check", {"over_budget": True, "tools_pending": True},
         "budget_exhausted", "over_budget", []),
        ("gate", {}, "execute", None, [ASKING]),
        ("gate", {"approval_pending": True}, "awaiting_approval", "approval_pending", []),
        ("awaiting_approval", {}, "execute", None, [STILL_PENDING]),
        ("awaiting_approval", {"approval_pending": True}, "suspended", "approval_pending", []),
        ("execute", {}, "feed_back", None, [PENDING_GATE]),
        ("execute", {"tools_pending": True}, "gate", "tools_pending", []),
        ("feed_back", {}, "suspend_check", None, []),
        ("awaiting_input", {}, "suspend_check", None, [ASLEEP, ENDED]),
        ("awaiting_input", {"suspend_requested": True, "input_ended": True},
         "suspended", "suspend_requested", []),
        ("awaiting_input", {"input_ended": True}, "completed", "input_ended", [ASLEEP]),
    ],
)  # fmt: skip
def test_step_names_the_guard_taken_and_the_guards_tried_in_order(
    source: str,
    outcomes: dict[str, bool],
    destination: str,
    guard: str | None,
    tried: list[tuple[str, str]],
) -> None:
    machine = probe_machine()
    run = Probe(source, **outcomes)
    step = machine.step(run)
    checks = tuple(GuardCheck(dest, name, False) for dest, name in tried)
    assert step == Step(source, machine.triggers[source], destination, guard, checks)
    assert run.state == destination
    # each guard transitions evaluated, once, in table order: the tried ones, then the taken one
    assert run.asked == [name for _, name in tried] + ([guard] if guard else [])


def test_an_unless_guard_is_reported_negated(tmp_path: Path) -> None:
    table = (ROOT / "states" / "agent_loop.yaml").read_text()
    path = tmp_path / "agent_loop.yaml"
    path.write_text(
        table.replace(
            "dest: suspended, guard: suspend_requested",
            "dest: suspended, unless: suspend_requested",
        )
    )
    machine = probe_machine(path)
    step = machine.step(Probe("suspend_check"))  # suspend_requested is false: unless holds
    assert (step.destination, step.guard) == ("suspended", "not suspend_requested")
    step = machine.step(Probe("suspend_check", suspend_requested=True))
    assert (step.destination, step.guard) == ("call", None)
    blocked = step.tried[-1]
    assert blocked == GuardCheck("suspended", "suspend_requested", True, unless=True)
    assert not blocked.passed


def test_entry_hooks_run_as_the_on_enter_callbacks_of_transitions() -> None:
    machine = probe_machine()
    run = Probe("decide", turn_is_final=True)
    machine.fire(run)
    # both hooks of the terminal state, in table order, with the state already set
    assert run.entered == ["state_entered:completed", "run_ended:completed"]
    # they are transitions' own on_enter callbacks: take them away and nothing runs
    machine.machine.get_state("call").on_enter.clear()
    quiet = Probe("suspend_check")
    machine.fire(quiet)
    assert quiet.state == "call" and quiet.entered == []
    # the state a run starts in has its hooks run through transitions too
    start = Probe("suspend_check")
    machine.enter(start)
    assert start.entered == ["state_entered:suspend_check"]


async def test_a_run_steps_report_the_guards_its_data_decided(api: FakeMessagesAPI) -> None:
    api.add(Reply.tool_use("missing", {}), Reply.text("done"))
    run, _, _ = make_run(api)
    steps: dict[tuple[str, str], Step] = {}
    while not run.finished:
        step = await run.step()
        steps.setdefault((step.source, step.destination), step)
    unusable = GuardCheck("failed", "turn_unusable", False)
    chat = GuardCheck("awaiting_input", "chat_turn_ended", False)
    assert steps["decide", "budget_check"].tried == (
        chat,
        unusable,
        GuardCheck("completed", "turn_is_final", False),
    )
    tools = steps["budget_check", "gate"]
    assert tools.guard == "tools_pending"
    assert tools.tried == (GuardCheck("budget_exhausted", "over_budget", False),)
    final = steps["decide", "completed"]
    assert (final.guard, final.tried) == ("turn_is_final", (chat, unusable))


async def test_every_run_shares_the_one_machine_and_none_is_added_to_it(
    api: FakeMessagesAPI,
) -> None:
    api.add(Reply.text("one"), Reply.text("two"))
    first, _, _ = make_run(api)
    second, _, _ = make_run(api)
    await first.run()
    await second.run()
    assert first.machine is second.machine is loop_machine()
    assert loop_machine().machine.models == []  # the unbound-model pattern: no run kept


def test_importing_fisk_sm_leaves_logging_as_it_was() -> None:
    code = """
import json, logging
def levels():
    return [logging.getLogger("transitions").level, logging.root.level, len(logging.root.handlers)]
before = levels()
import fisk_sm
from fisk_sm.loop.run import loop_machine
loop_machine()
print(json.dumps([before, levels()]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = json.loads(done.stdout)
    assert after == before == [0, 30, 0]  # NOTSET, WARNING, no handler: Python's defaults


def test_the_command_line_sets_the_transitions_logger_to_warning(tmp_path: Path) -> None:
    out = tmp_path / "loop.mmd"
    code = f"""
import logging
from fisk_sm.cli.main import main
code = main(["diagram", "--format", "mermaid", "-o", {str(out)!r}])
print(code, logging.getLogger("transitions").level)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "30"]

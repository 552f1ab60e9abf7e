"""An extended copy of the loop table runs with no code change but its guard function.

The copy adds one guarded exit (from `decide`, before `turn_is_final`, to a new terminal state
`refused_tool` it declares) and declares its guard under `guards:`; the guard function is
defined here. The run is stepped for real (the anthropic SDK against the loopback fake API, a
file journal), explained, folded, replayed into a path and drawn, all on the extended table.
A table naming a guard or a state it does not declare is refused at load, in one line.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from conftest import make_config

from fisk_sm import Recorder, tool
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import FoldError, fold
from fisk_sm.journal.parsing import CorruptJournalError
from fisk_sm.journal.records import Assistant, Meta, Terminal, ToolResult, ToolStarted
from fisk_sm.loop.explain import ExitView, action_effects
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.run import machine_for
from fisk_sm.loop.sessions import resume_session, start_session
from fisk_sm.machine.diagram import render
from fisk_sm.machine.guards import GUARDS
from fisk_sm.machine.path import session_path
from fisk_sm.machine.table import TableError, load_table
from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parent.parent
LOOP = (ROOT / "states" / "agent_loop.yaml").read_text()

GUARD = """  turn_calls_forbidden:
    doc: the turn calls the tool named forbidden
    reads: [pending]
    replay: turn
"""
STATE = """  - name: refused_tool
    terminal: true
    on_enter: [state_entered, run_ended]
    doc: the model called a tool it must not call
"""
FINAL = "  - {trigger: decided, source: decide, dest: completed, guard: turn_is_final}\n"
EXIT = "  - {trigger: decided, source: decide, dest: refused_tool, guard: turn_calls_forbidden}\n"


def extended(tmp_path: Path, *, guard: str = GUARD, state: str = STATE) -> Path:
    """The loop table with the extra state, guard and exit, written to `tmp_path`."""
    assert LOOP.count("\nguards:\n") == 1 and LOOP.count("\nstates:\n") == 1
    assert LOOP.count(FINAL) == 1
    text = LOOP.replace("\nguards:\n", "\nguards:\n" + guard, 1)
    text = text.replace("\nstates:\n", "\nstates:\n" + state, 1)
    text = text.replace(FINAL, EXIT + FINAL, 1)
    path = tmp_path / "extended.yaml"
    path.write_text(text)
    return path


def turn_calls_forbidden(run: Any) -> bool:
    """The extra exit's guard: a pending call of the tool `forbidden`."""
    return any(call.name == "forbidden" for call in run.data.pending)


@tool
def forbidden(text: str) -> str:
    """A tool the model must never call.

    Args:
        text: anything
    """
    raise AssertionError("the extra exit leaves before any tool runs")


async def test_a_run_on_an_extended_table_takes_its_exit_and_is_explained_folded_and_drawn(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    machine = machine_for(extended(tmp_path), {"turn_calls_forbidden": turn_calls_forbidden})
    api.add(Reply.tool_use("forbidden", {"text": "x"}, id="toolu_f"))
    store, events = FileStore(tmp_path / "runs"), Recorder()
    options = RunOptions(tools=[forbidden], events=events)
    run = await start_session(make_config(api), "go", store, options, run_id="ext", machine=machine)
    assert run.machine is machine

    assert await run.run_until("decide") == "decide"
    told = run.explain()
    assert told.exits[2] == ExitView("refused_tool", "turn_calls_forbidden", True)
    assert told.next == "refused_tool"
    assert "-> refused_tool if turn_calls_forbidden: true" in str(told)

    step = await run.step()
    assert (step.source, step.destination, step.guard) == (
        "decide",
        "refused_tool",
        "turn_calls_forbidden",
    )
    assert run.finished and run.state == "refused_tool"
    await run.aclose()
    assert len(api.requests) == 1

    records = store.load("ext")
    assert isinstance(records[-1], Terminal) and records[-1].reason == "refused_tool"
    assert not any(isinstance(r, ToolStarted | ToolResult) for r in records)
    # the loop's own table has no such end: the journal folds by the table it was made by
    with pytest.raises(FoldError, match="'refused_tool'"):
        fold(records)
    assert fold(records, machine.table).status == "refused_tool"

    path = session_path(records, machine.table, machine.guards)
    assert path.edges[-1] == ("decide", "decided", "refused_tool")
    assert path.steps[-1].guard == "turn_calls_forbidden"
    assert path.current == "refused_tool"

    drawn = render(machine.table, "mermaid", [path])
    assert "    decide --> refused_tool : 3. decided [turn_calls_forbidden]" in drawn
    assert "    refused_tool --> [*]" in drawn
    assert "decide -> refused_tool" in render(machine.table, "dot")

    # a resume folds it by its own table and continues on its own machine; by the loop's
    # table it is one line naming the journal's file
    with pytest.raises(CorruptJournalError, match=r"ext\.json: .*'refused_tool'"):
        await resume_session(make_config(api), "ext", store, RunOptions(tools=[forbidden]))
    again = await resume_session(
        make_config(api), "ext", store, RunOptions(tools=[forbidden]), machine=machine
    )
    try:
        assert again.machine is machine and again.state == "decide"
        step = await again.step()
        assert (step.destination, step.guard) == ("refused_tool", "turn_calls_forbidden")
    finally:
        await again.aclose()
    assert len(api.requests) == 1


def test_the_extra_guard_is_decided_by_the_turn_in_explain(tmp_path: Path) -> None:
    """Its `reads` meet what the model call and the journal write change, as for the loop's
    own turn guards, so it is derived like them."""
    effects = action_effects(load_table(extended(tmp_path)))
    assert "turn_calls_forbidden" in effects["journal_turn"]
    assert "turn_calls_forbidden" not in effects["decide_turn"]


def test_a_guard_the_table_does_not_declare_is_refused_at_load(tmp_path: Path) -> None:
    path = extended(tmp_path, guard="")
    with pytest.raises(TableError) as refused:
        load_table(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert "names guard 'turn_calls_forbidden', not declared under guards:" in message


def test_a_state_the_table_does_not_declare_is_refused_at_load(tmp_path: Path) -> None:
    path = extended(tmp_path, state="")
    with pytest.raises(TableError) as refused:
        load_table(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert "names unknown state 'refused_tool'" in message


def test_a_declared_guard_without_a_function_is_refused_when_the_machine_is_built(
    tmp_path: Path,
) -> None:
    with pytest.raises(TableError, match=r"with no function: turn_calls_forbidden$"):
        machine_for(extended(tmp_path))


def test_explain_derives_the_effects_the_loop_had_written_by_hand() -> None:
    """What `ACTION_EFFECTS` said, derived from the table's `changes` and `reads`; for
    `await_input` the table also declares what it resets (pending, error, stop_reason), which
    its exits never read."""
    by_hand = {
        "check_boundary": {"suspend_requested"},
        "call_model": {
            "call_cancelled",
            "call_failed",
            "chat_call_failed",
            "chat_turn_ended",
            "chat_turn_stopped",
            "iteration_cap_reached",
            "over_budget",
            "turn_is_final",
            "turn_unusable",
        },
        "journal_turn": {"chat_turn_ended", "tools_pending", "turn_is_final", "turn_unusable"},
        "decide_turn": {"call_failed", "chat_call_failed"},
        "account_tokens": set(),
        "check_gate": {"approval_pending"},
        "await_approval": {"approval_pending"},
        "execute_tool": {"chat_turn_ended", "turn_is_final", "turn_unusable"},
        "feed_back_results": set(),
        "await_input": {
            "chat_turn_stopped",
            "input_ended",
            "iteration_cap_reached",
            "suspend_requested",
            "turn_is_final",
            "chat_turn_ended",
        },
    }
    table = load_table()
    derived = action_effects(table)
    assert set(derived) == set(by_hand)
    for action, guards in by_hand.items():
        if action != "await_input":
            assert derived[action] == guards, action
    extra = derived["await_input"] - by_hand["await_input"]
    assert by_hand["await_input"] <= derived["await_input"]
    assert extra == {"tools_pending", "turn_unusable", "call_failed", "chat_call_failed"}
    exits = {t.guard for t in table.exits("awaiting_input")}
    assert not extra & exits


@pytest.mark.parametrize(
    ("stop", "content", "at_prompt"),
    [
        ("end_turn", [{"type": "text", "text": "done"}], True),
        ("max_tokens", [{"type": "text", "text": "cut o"}], True),
        ("max_tokens", [{"type": "tool_use", "id": "t", "name": "n", "input": {}}], True),
        ("refusal", [], True),
        ("pause_turn", [{"type": "text", "text": "hm"}], False),
        ("tool_use", [{"type": "tool_use", "id": "t", "name": "n", "input": {}}], False),
    ],
)
def test_the_fold_and_the_guard_agree_when_a_chat_turn_is_over(
    stop: str, content: list[dict[str, Any]], at_prompt: bool
) -> None:
    """A chat whose journal ends on a turn rests at its prompt exactly when `chat_turn_ended`
    holds on that turn: one meaning, written once (`fisk_sm.journal.fold.turn_over`)."""
    meta = Meta(seq=1, version=1, run_id="c", created="", fingerprint={}, prompt="p")
    meta = attrs.evolve(meta, interactive=True)
    turn = Assistant(
        seq=2, iteration=1, message={"role": "assistant", "content": content}, stop_reason=stop
    )
    snapshot = fold([meta, turn])
    assert (snapshot.state == "awaiting_input") is at_prompt
    run = SimpleNamespace(data=fold([attrs.evolve(meta, interactive=False), turn]).data())
    run.data.chat = True
    assert GUARDS["chat_turn_ended"](run) is at_prompt
    path = session_path([meta, turn])
    assert (path.current == "awaiting_input") is at_prompt


def test_the_drawn_states_say_what_their_actions_change_and_journal() -> None:
    drawn = render(load_table(), "dot")
    execute = next(line for line in drawn.splitlines() if line.startswith("  execute ["))
    assert "\\nchanges: pending\\njournals: tool_started, tool_result" in execute
    prompt = next(line for line in drawn.splitlines() if line.startswith("  awaiting_input ["))
    assert "journals: user (chat)" in prompt


@pytest.mark.parametrize(
    ("guard", "problem"),
    [
        (
            GUARD.replace("reads:", "raeds:"),
            "unknown key(s) ['raeds'] in guard 'turn_calls_forbidden'",
        ),
        (GUARD.replace("[pending]", "[pendng]"), "reads undeclared fact 'pendng'"),
        (GUARD.replace("replay: turn", "replay: {terminal: decide}"), "'decide', not a terminal"),
        (GUARD.replace("replay: turn", "replay: guess"), "replay must be one of"),
    ],
)
def test_a_malformed_guard_declaration_is_refused_naming_it(
    tmp_path: Path, guard: str, problem: str
) -> None:
    path = extended(tmp_path, guard=guard)
    with pytest.raises(TableError) as refused:
        load_table(path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert problem in message


def test_the_command_line_draws_an_extended_table_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """`fisk-sm diagram --table` draws the copy as a run would load it; an undeclared guard
    is one line naming the file, exit 2, no traceback."""
    import subprocess
    import sys

    def diagram(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "fisk_sm.cli", "diagram", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    drawn = diagram("--table", str(extended(tmp_path)))
    assert drawn.returncode == 0, drawn.stderr
    assert "    decide --> refused_tool : 3. decided [turn_calls_forbidden]" in drawn.stdout
    bad = diagram("--table", str(extended(tmp_path, guard="")))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert "names guard 'turn_calls_forbidden', not declared under guards:" in bad.stderr
    assert diagram("--table", str(extended(tmp_path)), "--session", "x").returncode == 2

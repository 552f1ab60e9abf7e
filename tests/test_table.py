"""The YAML table, the code and the diagrams agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from fisk_sm.config.states import STATE_NAMES
from fisk_sm.loop.actions import ACTIONS
from fisk_sm.loop.hooks import HOOKS
from fisk_sm.loop.run import loop_machine
from fisk_sm.machine.diagram import exit_label
from fisk_sm.machine.evaluator import build_machine
from fisk_sm.machine.guards import GUARDS
from fisk_sm.machine.table import Table, TableError, load_table

LOOP_STATES = [
    "suspend_check", "call", "journal", "decide", "budget_check",
    "gate", "awaiting_approval", "execute", "feed_back", "awaiting_input",
]  # fmt: skip
TERMINALS = ["completed", "suspended", "budget_exhausted", "iterations_exhausted", "failed"]


def test_the_table_has_the_loop_states_and_the_terminal_states() -> None:
    table = load_table()
    assert [s.name for s in table.states] == LOOP_STATES + TERMINALS
    assert list(table.terminal_states) == TERMINALS
    assert table.initial == "suspend_check"


def test_every_name_in_the_table_exists_in_code_and_every_state_has_an_action() -> None:
    table = load_table()
    assert table.guard_names <= set(GUARDS)
    assert table.hook_names <= set(HOOKS)
    assert table.action_names <= set(ACTIONS)
    for spec in table.states:
        assert spec.terminal or spec.action in ACTIONS, spec.name
    # and no code is left over that the table does not name
    assert set(GUARDS) == table.guard_names
    assert set(ACTIONS) == table.action_names


def test_the_shared_machine_is_built_once_from_the_table() -> None:
    machine = loop_machine()
    assert machine is loop_machine()
    assert set(machine.machine.states) == set(LOOP_STATES + TERMINALS)
    assert machine.triggers["execute"] == "tool_done"


def test_a_table_naming_an_unknown_guard_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "states" / "agent_loop.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("guard: over_budget", "guard: over_buget"))
    with pytest.raises(TableError, match="over_buget"):
        build_machine(load_table(bad), GUARDS, HOOKS)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("dest: journal}", "dest: jornal}", "unknown state 'jornal'"),
        ("source: suspend_check, dest: call}", "source: suspend_check, dest: call, guard: g}",
         "must be unguarded"),
        ("    action: call_model\n", "", "has no action"),
    ],
)  # fmt: skip
def test_malformed_tables_name_the_problem(
    tmp_path: Path, old: str, new: str, problem: str
) -> None:
    text = (ROOT / "states" / "agent_loop.yaml").read_text()
    assert old in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(TableError, match=problem):
        load_table(bad)


@pytest.mark.parametrize(
    ("fmt", "name"), [("mermaid", "agent_loop.mmd"), ("svg", "agent_loop.svg")]
)
def test_fisk_sm_diagram_reproduces_the_committed_diagrams(
    tmp_path: Path, fmt: str, name: str
) -> None:
    out = tmp_path / name
    cli = [sys.executable, "-m", "fisk_sm.cli", "diagram", "--format", fmt, "-o", str(out)]
    done = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (ROOT / "diagrams" / name).read_bytes()


def test_the_readme_embeds_the_current_mermaid_diagram() -> None:
    mermaid = (ROOT / "diagrams" / "agent_loop.mmd").read_text()
    assert f"```mermaid\n{mermaid}```" in (ROOT / "README.md").read_text()


def test_every_transition_of_the_table_is_an_edge_of_the_diagram() -> None:
    table: Table = load_table()
    mermaid = (ROOT / "diagrams" / "agent_loop.mmd").read_text()
    for t in table.transitions:
        assert f"{t.source} --> {t.dest} : {exit_label(table, t)}" in mermaid


def test_exits_are_labelled_in_the_order_they_are_tried_the_fallback_as_else() -> None:
    table = load_table()
    labels = [exit_label(table, t) for t in table.exits("suspend_check")]
    assert labels == [
        "1. boundary [chat_turn_stopped]",
        "2. boundary [iteration_cap_reached]",
        "3. boundary [suspend_requested]",
        "4. boundary [else]",
    ]
    assert [exit_label(table, t) for t in table.exits("journal")] == ["journaled"]


def test_a_state_renamed_in_the_table_alone_is_an_error_naming_it(tmp_path: Path) -> None:
    text = (ROOT / "states" / "agent_loop.yaml").read_text()
    renamed = tmp_path / "agent_loop.yaml"
    renamed.write_text(re.sub(r"\bexecute\b", "run_tool", text))  # execute_tool stays
    assert "run_tool" in renamed.read_text() and "execute_tool" in renamed.read_text()
    with pytest.raises(TableError) as refused:
        load_table(renamed)
    message = str(refused.value)
    assert message.startswith(f"{renamed}: ")
    assert (
        "state 'execute' is named in code (fisk_sm.config.states) but not in the table" in message
    )
    # a state the table declares that code does not name is allowed (an extended table)
    assert "run_tool" not in message


def test_the_names_code_uses_are_the_states_of_the_table() -> None:
    assert set(STATE_NAMES) == {s.name for s in load_table().states}

"""The table's YAML is read as it is declared, each entry checked for its kind of value.

`fisk_sm.config.table` reads the parsed YAML as `object` and narrows it (issue 21: `Any` only
where JSON is really open): a value of the wrong kind is a `TableError` naming its entry, in one
line, where a string once passed for a list (read letter by letter), a number for a name or a
flag, and a string for an exit escaped as a `ValueError`. The loop's own table reads as before
(tests/test_table.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fisk_sm.machine.table import TableError, load_table

ROOT = Path(__file__).resolve().parent.parent
LOOP = (ROOT / "states" / "agent_loop.yaml").read_text()


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    """The loop table with its one `old` replaced by `new`, written to `tmp_path`."""
    assert LOOP.count(old) == 1, old
    path = tmp_path / "variant.yaml"
    path.write_text(LOOP.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        # a number where a state's name goes
        ("\ninitial: suspend_check\n", "\ninitial: 7\n", "malformed the table: initial must be"),
        # a string where a list goes: once read letter by letter as facts
        (
            "replay: {terminal: suspended, cut: true}",
            "replay: {terminal: suspended, cut: 1}",
            "malformed guards: the replay of guard 'call_cancelled': cut must be true or false",
        ),
        # a bare string where an exit goes: once a ValueError from dict('...') with a traceback
        ("\ntransitions:\n", "\ntransitions:\n  - decided\n", "malformed transitions: expected"),
        # a string where the entry hooks' list goes: once hooks named 's', 't', 'a', ...
        (
            "resume: {unless: chat_turn_ended}\n    on_enter: [state_entered]\n",
            "resume: {unless: chat_turn_ended}\n    on_enter: state_entered\n",
            "malformed states: the on_enter of state 'decide' must be",
        ),
    ],
    ids=["initial-number", "cut-number", "exit-string", "on-enter-string"],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_its_entry(
    tmp_path: Path, old: str, new: str, problem: str
) -> None:
    path = _variant(tmp_path, old, new)
    with pytest.raises(TableError) as refused:
        load_table(path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert problem in message

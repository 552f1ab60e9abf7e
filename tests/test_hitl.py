"""The ask_human_* tools (REFERENCE §6 "HITL tools", §9 31)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from fisk_sm.operator.prompter import (
    NoOperator,
    Prompter,
    PromptError,
    ScriptedPrompter,
    TerminalPrompter,
)
from fisk_sm.tools.base import ToolBox
from fisk_sm.tools.hitl import HITL_NOTE, hitl_tools

NO_OPERATOR = "no interactive terminal is attached, so no operator could be asked"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


async def call(prompter: Prompter, name: str, **arguments: Any) -> Any:
    """Dispatch like the loop does; the result must be a normal (non-error) JSON object."""
    outcome = await ToolBox.of(hitl_tools(prompter)).invoke(name, arguments)
    assert not outcome.is_error, outcome.content
    return json.loads(outcome.content)


async def call_error(prompter: Prompter, name: str, **arguments: Any) -> str:
    outcome = await ToolBox.of(hitl_tools(prompter)).invoke(name, arguments)
    assert outcome.is_error
    return outcome.content


def test_tools_are_builtin_with_schemas() -> None:
    tools = hitl_tools(NoOperator())
    assert [t.name for t in tools] == ["ask_human_confirm", "ask_human_select", "ask_human_input"]
    assert {t.kind for t in tools} == {"builtin"}
    assert [t.required for t in tools] == [("question",), ("question", "options"), ("question",)]
    select = tools[1].input_schema["properties"]["options"]
    assert (select["minItems"], select["maxItems"]) == (1, 25)
    for t in tools:
        for prop in t.input_schema["properties"].values():
            assert prop["description"]
        assert t.name in HITL_NOTE
    assert "plain text" in HITL_NOTE and "ends the run" in HITL_NOTE


async def test_confirm_yes_and_no() -> None:
    prompter = ScriptedPrompter(confirms=[True, False])
    assert await call(prompter, "ask_human_confirm", question="Deploy now?") == {"confirmed": True}
    assert await call(prompter, "ask_human_confirm", question="Sure?") == {"confirmed": False}
    assert prompter.asked == [("confirm", "Deploy now?"), ("confirm", "Sure?")]


@pytest.mark.parametrize(
    ("name", "arguments", "key"),
    [
        ("ask_human_confirm", {"question": "ok?"}, "confirmed"),
        ("ask_human_select", {"question": "which?", "options": ["a", "b"]}, "selected"),
        ("ask_human_input", {"question": "name?", "default": "x"}, "value"),
    ],
)
async def test_nobody_to_prompt_is_a_normal_result_with_a_reason(
    name: str, arguments: dict[str, Any], key: str
) -> None:
    empty = False if key == "confirmed" else None
    assert await call(NoOperator(), name, **arguments) == {key: empty, "reason": NO_OPERATOR}
    silent = ScriptedPrompter(available=False)
    assert await call(silent, name, **arguments) == {key: empty, "reason": NO_OPERATOR}
    failing = ScriptedPrompter(
        confirms=[PromptError("boom")],
        selections=[PromptError("boom")],
        inputs=[PromptError("boom")],
    )
    reason = "the operator could not be asked: boom"
    assert await call(failing, name, **arguments) == {key: empty, "reason": reason}


@pytest.mark.parametrize(
    "options",
    [[], [f"o{i}" for i in range(26)], "a,b", ["a", 2], ["a", ""], ["a", "\x1b[0m \n"], None],
)
async def test_bad_options_are_errors_and_nobody_is_asked(options: Any) -> None:
    prompter = ScriptedPrompter()
    text = await call_error(prompter, "ask_human_select", question="which?", options=options)
    assert text == "ask_human_select: options must be a list of 1 to 25 non-empty strings"
    assert prompter.asked == []
    # Bad input is checked before whether anyone could be asked.
    await call_error(NoOperator(), "ask_human_select", question="which?", options=options)


async def test_bad_questions_and_defaults_are_errors() -> None:
    prompter = ScriptedPrompter()
    for question in ("", "   ", "\x1b[2J\r\n", 42, None):
        text = await call_error(prompter, "ask_human_confirm", question=question)
        assert text == "ask_human_confirm: question must be a non-empty string"
    assert await call_error(prompter, "ask_human_input", question="q", default=3) == (
        "ask_human_input: default must be a string"
    )
    assert await call_error(prompter, "ask_human_confirm", question="q", urgent=True) == (
        "ask_human_confirm: unknown parameter(s): urgent"
    )
    assert prompter.asked == []


async def test_select_returns_the_models_option_or_null() -> None:
    prompter = ScriptedPrompter(selections=[1, 2, -1, None])
    options = ["plain", "\x1b[31mred\x1b[0m"]
    assert await call(prompter, "ask_human_select", question="Pick", options=options) == {
        "selected": "\x1b[31mred\x1b[0m"
    }
    for _ in range(3):
        assert await call(prompter, "ask_human_select", question="Pick", options=options) == {
            "selected": None,
            "reason": "no option was chosen",
        }
    assert prompter.asked[0] == ("select", ("Pick", ["plain", "red"]))


async def test_input_with_default() -> None:
    prompter = ScriptedPrompter(inputs=["typed", None])
    assert await call(prompter, "ask_human_input", question="Name?", default="anon") == {
        "value": "typed"
    }
    assert await call(prompter, "ask_human_input", question="Name?") == {
        "value": None,
        "reason": "no value was entered",
    }
    assert prompter.asked == [("ask", ("Name?", "anon")), ("ask", ("Name?", None))]


async def test_the_prompter_receives_sanitized_text() -> None:
    prompter = ScriptedPrompter(confirms=[True], inputs=["v"])
    question = "Really\x1b[2J\n  delete \x9b\x07 everything?" + " x" * 400
    await call(prompter, "ask_human_confirm", question=question)
    await call(prompter, "ask_human_input", question="q", default="\x1b]0;t\x07de\nfault")
    shown = prompter.asked[0][1]
    assert shown.startswith("Really delete everything? x x")
    assert len(shown) == 500 and shown.endswith("…")
    assert prompter.asked[1] == ("ask", ("q", "de fault"))


async def test_terminal_prompter_for_questions() -> None:
    out = FakeTTY()
    terminal = TerminalPrompter(FakeTTY("y\n2\n9\nx\n\n"), out)
    assert await call(terminal, "ask_human_confirm", question="Go\x1b[5m?") == {"confirmed": True}
    options = ["one", "\x1b[8mtwo"]
    assert await call(terminal, "ask_human_select", question="Pick", options=options) == {
        "selected": "\x1b[8mtwo"
    }
    for _ in range(2):
        assert (await call(terminal, "ask_human_select", question="Pick", options=options))[
            "reason"
        ] == "no option was chosen"
    assert await call(terminal, "ask_human_input", question="Name", default="an\x1b[0mon") == {
        "value": "anon"
    }
    shown = out.getvalue()
    assert "\x1b" not in shown
    assert "Go? [y/N]: " in shown
    assert "Pick\n  1) one\n  2) two\nchoose 1-2: " in shown
    assert "Name [anon]: " in shown
    assert await call(terminal, "ask_human_input", question="More") == {
        "value": None,
        "reason": "the operator could not be asked: end of input",
    }


@pytest.mark.parametrize(
    ("line", "index"),
    [("1\n", 0), ("2\n", 1), ("0\n", None), ("3\n", None), ("b\n", None), ("\n", None)],
)
async def test_terminal_select_reads_a_number_in_range(line: str, index: int | None) -> None:
    assert await TerminalPrompter(FakeTTY(line), FakeTTY()).select("q", ["a", "b"]) == index

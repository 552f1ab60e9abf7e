"""The human-in-the-loop tools: `ask_human_confirm`, `ask_human_select`, `ask_human_input`.

A plain-text reply ends the run, so these tools are the model's only way to ask the operator
something and carry on with the answer. Everything the model wants shown is sanitized first
(controls stripped, whitespace collapsed, at most 500 runes). Malformed input is the model's
mistake, an `is_error` result; nobody to ask, or a prompt that fails, is a normal result with a
`reason`, for the model to work around.
"""

from __future__ import annotations

from typing import Any

from fisk_sm.operator.prompter import NO_OPERATOR, Prompter, PromptError
from fisk_sm.operator.sanitize import sanitize
from fisk_sm.tools.base import Tool, ToolError

__all__ = ["HITL_NOTE", "MAX_OPTIONS", "hitl_tools"]

MAX_OPTIONS = 25
NO_CHOICE = "no option was chosen"
NO_VALUE = "no value was entered"

HITL_NOTE = (
    "You can reach the human operator only through the ask_human_confirm, ask_human_select and "
    "ask_human_input tools. A reply in plain text ends the run, so never ask a question in plain "
    "text: when you need a confirmation, a choice or a piece of information from the human, call "
    "one of those tools and carry on with its answer. If a tool reports that nobody could be "
    "asked, do not ask again; proceed on your best judgement or explain what you needed."
)

_QUESTION = {
    "type": "string",
    "description": "The question for the operator, in one line of plain text (at most 500 "
    "characters are shown).",
}


def _question(tool: str, question: Any) -> str:
    text = sanitize(question) if isinstance(question, str) else ""
    if not text:
        raise ToolError(f"{tool}: question must be a non-empty string")
    return text


def _options(options: Any) -> list[str]:
    if isinstance(options, list) and 1 <= len(options) <= MAX_OPTIONS:
        shown = [sanitize(o) for o in options if isinstance(o, str)]
        if len(shown) == len(options) and all(shown):
            return shown
    raise ToolError(
        f"ask_human_select: options must be a list of 1 to {MAX_OPTIONS} non-empty strings"
    )


def _no_extra(tool: str, extra: dict[str, Any]) -> None:
    if extra:
        raise ToolError(f"{tool}: unknown parameter(s): {', '.join(sorted(extra))}")


def _failed(exc: PromptError) -> str:
    return f"the operator could not be asked: {sanitize(str(exc)) or type(exc).__name__}"


def hitl_tools(prompter: Prompter) -> list[Tool]:
    """The three `ask_human_*` tools, asking through `prompter` (kind "builtin")."""

    async def ask_human_confirm(question: Any = None, **extra: Any) -> dict[str, Any]:
        _no_extra("ask_human_confirm", extra)
        text = _question("ask_human_confirm", question)
        if not prompter.available:
            return {"confirmed": False, "reason": NO_OPERATOR}
        try:
            return {"confirmed": bool(await prompter.confirm(text))}
        except PromptError as exc:
            return {"confirmed": False, "reason": _failed(exc)}

    async def ask_human_select(
        question: Any = None, options: Any = None, **extra: Any
    ) -> dict[str, Any]:
        _no_extra("ask_human_select", extra)
        text = _question("ask_human_select", question)
        shown = _options(options)
        if not prompter.available:
            return {"selected": None, "reason": NO_OPERATOR}
        try:
            index = await prompter.select(text, shown)
        except PromptError as exc:
            return {"selected": None, "reason": _failed(exc)}
        if not isinstance(index, int) or not 0 <= index < len(shown):
            return {"selected": None, "reason": NO_CHOICE}
        return {"selected": options[index]}  # the model's own option, as it wrote it

    async def ask_human_input(
        question: Any = None, default: Any = None, **extra: Any
    ) -> dict[str, Any]:
        _no_extra("ask_human_input", extra)
        text = _question("ask_human_input", question)
        if default is not None and not isinstance(default, str):
            raise ToolError("ask_human_input: default must be a string")
        if not prompter.available:
            return {"value": None, "reason": NO_OPERATOR}
        try:
            value = await prompter.ask(text, None if default is None else sanitize(default))
        except PromptError as exc:
            return {"value": None, "reason": _failed(exc)}
        return {"value": value} if value is not None else {"value": None, "reason": NO_VALUE}

    return [
        Tool(
            name="ask_human_confirm",
            description="Ask the human operator a yes/no question and wait for the answer. "
            'Returns {"confirmed": true|false}, with a "reason" when nobody could be asked.',
            input_schema={
                "type": "object",
                "properties": {"question": _QUESTION},
                "required": ["question"],
            },
            fn=ask_human_confirm,
            kind="builtin",
        ),
        Tool(
            name="ask_human_select",
            description="Ask the human operator to choose one of a few options and wait for the "
            'answer. Returns {"selected": "<the option>"}, or {"selected": null, "reason": ...} '
            "when nothing was chosen or nobody could be asked.",
            input_schema={
                "type": "object",
                "properties": {
                    "question": _QUESTION,
                    "options": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "maxItems": MAX_OPTIONS,
                        "description": f"The choices, 1 to {MAX_OPTIONS} short non-empty "
                        "strings, shown numbered in this order.",
                    },
                },
                "required": ["question", "options"],
            },
            fn=ask_human_select,
            kind="builtin",
        ),
        Tool(
            name="ask_human_input",
            description="Ask the human operator for a line of free text and wait for it. "
            'Returns {"value": "<text>"}, or {"value": null, "reason": ...} when nobody could '
            "be asked.",
            input_schema={
                "type": "object",
                "properties": {
                    "question": _QUESTION,
                    "default": {
                        "type": "string",
                        "description": "The answer to use when the operator just presses enter.",
                    },
                },
                "required": ["question"],
            },
            fn=ask_human_input,
            kind="builtin",
        ),
    ]

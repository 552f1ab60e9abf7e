"""Python tools: schemas from type hints and docstrings, loading from agent.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from fisk_sm import Tool, tool
from fisk_sm.tools import ToolBox
from fisk_sm.tools.base import ToolLoadError, load_tool


def test_schema_comes_from_type_hints_and_the_docstring() -> None:
    @tool
    def search(query: str, limit: int = 10, mode: Literal["fast", "exact"] = "fast") -> str:
        """Search the notes.

        Args:
            query: what to look for,
                across several lines
            limit: at most this many hits
        """
        return query

    assert isinstance(search, Tool)
    assert search.name == "search"
    assert search.description == "Search the notes."
    assert search.input_schema == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for, across several lines"},
            "limit": {"type": "integer", "description": "at most this many hits", "default": 10},
            "mode": {"enum": ["fast", "exact"], "default": "fast"},
        },
        "required": ["query"],
    }


def test_an_explicit_schema_and_name_win() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}

    @tool(name="square", description="Square x.", input_schema=schema)
    def f(x: float) -> float:
        return x * x

    assert f.definition == {"name": "square", "description": "Square x.", "input_schema": schema}


async def test_async_tools_are_awaited_and_results_rendered_as_json() -> None:
    @tool
    async def pair(a: int, flag: bool | None = None) -> dict[str, object]:
        """Pair up."""
        return {"a": a, "flag": flag}

    flag = {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": None}  # null allowed
    assert pair.input_schema["properties"]["flag"] == flag
    box = ToolBox.of([pair])
    outcome = await box.invoke("pair", {"a": 1})
    assert (outcome.content, outcome.is_error) == ('{"a": 1, "flag": null}', False)


def test_duplicate_names_are_refused() -> None:
    @tool
    def a() -> str:
        """A."""
        return ""

    with pytest.raises(ValueError, match="duplicate tool name 'a'"):
        ToolBox.of([a, a])


def test_load_tool_finds_modules_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "beside_config.py").write_text(
        "from fisk_sm import tool\n\n@tool\ndef hello(name: str) -> str:\n"
        "    '''Say hello.'''\n    return 'hello ' + name\n\n"
        "def plain(n: int) -> int:\n    '''Double n.'''\n    return 2 * n\n"
    )
    decorated = load_tool("beside_config:hello", tmp_path, crash_policy="fail")
    assert decorated.name == "hello" and decorated.crash_policy == "fail"
    plain = load_tool("beside_config:plain", tmp_path)
    assert plain.input_schema["properties"] == {"n": {"type": "integer"}}
    with pytest.raises(ToolLoadError, match="beside_config:missing"):
        load_tool("beside_config:missing", tmp_path)
    with pytest.raises(ToolLoadError, match="no_such_module_xyz"):
        load_tool("no_such_module_xyz:f", tmp_path)

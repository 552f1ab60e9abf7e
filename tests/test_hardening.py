"""Hardening, by class: list fields refuse scalars, tools that fail to import, providers.

Each test sweeps a class of hostile input rather than one case of it: every list field of the
config (found by walking the config classes, so a new field is covered the day it is added) and
every way a Python tool module can fail at import.
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import attrs
import pytest
import yaml

from fisk_sm.cli.main import main
from fisk_sm.config.agent import AgentConfig, ConfigError, ToolSpec, parse_config
from fisk_sm.config.exec import Argument, ExecToolSpec
from fisk_sm.config.harness import RemoteHost
from fisk_sm.config.mcp import McpServer

CLI = [sys.executable, "-m", "fisk_sm.cli"]

#: Where each class that appears inside a list field sits in FULL, as a YAML path.
CONTAINERS: dict[type, tuple[str, ...]] = {
    ToolSpec: ("tools", "0"),
    ExecToolSpec: ("tools", "1"),
    Argument: ("tools", "1", "arguments", "0"),
    RemoteHost: ("remote_tools", "0"),
    McpServer: ("mcp_servers", "0"),
}
#: A valid config holding one of each of those classes.
FULL: dict[str, Any] = {
    "llm": {"model": "m"},
    "tools": [
        {"python": "mod:fn"},
        {
            "name": "t",
            "command": ["echo", "{x}"],
            "arguments": [{"name": "x", "type": "enum", "values": ["a"]}],
        },
    ],
    "remote_tools": [{"alias": "a", "subject": "s"}],
    "mcp_servers": [{"alias": "m", "command": ["mcp-server"]}],
}


def _item_types(hint: Any) -> tuple[type, ...]:
    item = get_args(hint)[0]
    return tuple(t for t in (get_args(item) or (item,)) if attrs.has(t))


def list_fields(cls: type, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The YAML path of every list (tuple) field reachable from `cls`, items included."""
    hints = get_type_hints(cls)
    for field in attrs.fields(cls):
        hint = hints[field.name]
        if get_origin(hint) is tuple:
            yield (*path, field.name)
            for item in _item_types(hint):
                yield from list_fields(item, CONTAINERS[item])
        elif attrs.has(hint):
            yield from list_fields(hint, (*path, field.name))


def config_with_scalar_at(path: tuple[str, ...]) -> dict[str, Any]:
    """FULL, except that the list at `path` is given as the string 'ai:confirm'."""
    data: dict[str, Any] = copy.deepcopy(FULL)
    node: Any = data
    for key in path[:-1]:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[path[-1]] = "ai:confirm"
    return data


LIST_FIELDS = sorted(set(list_fields(AgentConfig)))


def test_the_full_config_is_valid() -> None:
    parse_config(FULL, source="agent.yaml", env={})


def test_the_sweep_finds_the_list_fields_we_know_of() -> None:
    """The walk over the config classes is what drives the sweep: make sure it walks."""
    found = {".".join(p) for p in LIST_FIELDS}
    expected = {
        "tools",
        "tools.0.tags",
        "tools.1.tags",
        "tools.1.command",
        "tools.1.arguments",
        "tools.1.arguments.0.values",
        "remote_tools",
        "mcp_servers",
        "mcp_servers.0.command",
        "mcp_servers.0.tags",
        "harness.confirm_tags",
        "harness.tools.include.names",
        "harness.tools.include.tags",
        "harness.tools.exclude.names",
        "harness.tools.exclude.tags",
    }
    assert expected <= found, expected - found


@pytest.mark.parametrize("path", LIST_FIELDS, ids=".".join)
def test_every_list_field_refuses_a_scalar(path: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config_with_scalar_at(path), source="agent.yaml", env={})
    error = info.value
    assert error.source == "agent.yaml"
    # the field is named in full, e.g. `harness.tools.include.names` or `tools[1] (t).tags`
    shown = ".".join(f"[{k}]" if k.isdigit() else k for k in path).replace(".[", "[")
    if path[:2] == ("tools", "1") and len(path) > 2:
        shown = "tools[1] (t)" + shown.removeprefix("tools[1]")
    assert error.field == shown
    assert error.problem.startswith("expected a list")
    assert "\n" not in str(error)


@pytest.mark.parametrize("path", LIST_FIELDS, ids=".".join)
def test_the_cli_exits_2_with_one_line_for_a_scalar_list(
    path: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump(config_with_scalar_at(path)))
    assert main(["info", "-c", str(agent)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"fisk-sm: {agent}: ") and "expected a list" in line


def test_a_gated_tag_given_as_a_string_no_longer_escapes_the_gate(tmp_path: Path) -> None:
    """The original hole: `tags: 'ai:confirm'` became the tags a, i, :, c, ... (ungated)."""
    (tmp_path / "mytools.py").write_text("def rm(path: str) -> str:\n    return path\n")
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\ntools: [{python: 'mytools:rm', tags: 'ai:confirm'}]\n")
    done = subprocess.run([*CLI, "info", "-c", str(agent)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"fisk-sm: {agent}: tools[0].tags: expected a list, got 'ai:confirm'"
    )


BROKEN_MODULES = {
    "syntax": ("def f(:\n    pass\n", "SyntaxError"),
    "raises": ("raise RuntimeError('boom at import')\n", "RuntimeError at import: boom"),
    "exits": ("import sys\nsys.exit(3)\n", "sys.exit(3)"),
    "exits_none": ("import sys\nsys.exit()\n", "sys.exit(None)"),
    "imports_missing": ("import no_such_dependency_xyz\n", "no_such_dependency_xyz"),
    "no_function": ("x = 1\n", "has no 'f'"),
    "not_callable": ("f = 42\n", "is not callable"),
    "keyboard": ("raise ValueError('\\x1b[31mred')\n", "ValueError at import"),
}


@pytest.mark.parametrize("case", [*BROKEN_MODULES, "missing_module"])
def test_a_python_tool_that_fails_to_load_names_the_file_and_entry(
    case: str, tmp_path: Path
) -> None:
    """Whatever a module does at import, the CLI prints one line naming agent.yaml and
    tools[N] and exits 2: no traceback, no silent exit 3."""
    module = f"broken_{case}"
    if case in BROKEN_MODULES:
        (tmp_path / f"{module}.py").write_text(BROKEN_MODULES[case][0])
        expected = BROKEN_MODULES[case][1]
    else:
        expected = "No module named 'broken_missing_module'"
    (tmp_path / "fine.py").write_text("def ok() -> str:\n    return 'ok'\n")
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        "llm: {model: m, base_url: 'http://127.0.0.1:9'}\n"
        f"tools: [{{python: 'fine:ok'}}, {{python: '{module}:f'}}]\n"
    )
    for command in (["info", "-c", str(agent)], ["run", "-c", str(agent), "hi"]):
        done = subprocess.run([*CLI, *command], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(f"fisk-sm: {agent}: tools[1].python: "), line
        assert expected in line
        assert "\x1b" not in line
        assert done.stdout == ""


def test_an_unknown_provider_is_refused_at_load(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m, provider: openai}\n")
    done = subprocess.run([*CLI, "run", "-c", str(agent), "hi"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (
        f"fisk-sm: {agent}: llm.provider: must be one of anthropic, got 'openai'\n"
    )


SUBJECTS = [
    "tools.ops",
    "a-b_c.d",
    "tools.*",
    "tools.>",
    "a..b",
    "tools/ops",
    "ops:1",
    "tö.ols",
    "",
]


@pytest.mark.parametrize("subject", SUBJECTS)
async def test_agent_yaml_and_serve_tools_agree_on_subjects(subject: str) -> None:
    """One copy of the NATS subject rules: what agent.yaml refuses, a tool host refuses too."""
    from fisk_sm.tools.remote import serve_tools

    data = {"llm": {"model": "m"}, "remote_tools": [{"alias": "a", "subject": subject}]}
    try:
        parse_config(data, source="agent.yaml", env={})
        config_ok = True
    except ConfigError:
        config_ok = False
    try:
        await serve_tools(None, subject, [], agent="host")  # type: ignore[arg-type]
        host_ok = True
    except ValueError:
        host_ok = False
    except AttributeError:  # got past the subject check to the (absent) connection
        host_ok = True
    assert config_ok == host_ok
    assert config_ok == (subject in ("tools.ops", "a-b_c.d"))


def test_a_bug_is_an_internal_error_not_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Exit 2 is for bad input; an unexpected exception says it is fisk-sm's fault and exits 70."""
    info = importlib.import_module("fisk_sm.cli.info")  # the command's module, imported on use

    def broken(args: object) -> int:
        raise ValueError("a programming error\nover two lines")

    monkeypatch.setattr(info, "cmd_info", broken)
    assert main(["info", "-c", str(tmp_path / "agent.yaml")]) == 70
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "fisk-sm: internal error: ValueError: a programming error over two lines"
        " (--debug shows the traceback)"
    )
    with pytest.raises(ValueError, match="a programming error"):
        main(["--debug", "info", "-c", str(tmp_path / "agent.yaml")])


def test_a_bug_while_structuring_the_config_is_not_reported_as_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fisk_sm.config import agent
    from fisk_sm.config.structure import Structurer

    def broken(value: object, _t: object) -> object:
        raise AttributeError("a bug in a structure hook")

    fields = {**agent._FIELD_HOOKS, agent.Budget: {"call_timeout": broken}}
    monkeypatch.setattr(agent, "_STRUCTURER", Structurer(fields, agent._TYPE_HOOKS))
    with pytest.raises(AttributeError, match="a bug in a structure hook"):
        parse_config({"llm": {"model": "m", "budget": {"call_timeout": "1s"}}}, env={})

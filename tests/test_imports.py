"""Import budgets: the package costs nothing to import, the core loads no command line, HTTP
stack, SDK or extra, `fisk-sm ctl` runs on the standard library, and the public API is small,
lazy and documented.

Each measurement runs in a fresh interpreter (`sys.executable`), since this process has imported
everything already; it reports the modules the statement added to `sys.modules`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fisk_sm
from fisk_sm.cli.main import COMMANDS, build_parser
from fisk_sm.events import ToolFinished
from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fisk_sm"
README = (ROOT / "README.md").read_text(encoding="utf-8")
STDLIB = frozenset(sys.stdlib_module_names)
#: What the core must never load: the command line, the supervisor, the HTTP stack, the SDK
#: (until a model client is built) and every extra.
NOT_IN_THE_CORE = (
    "fisk_sm.cli",
    "fisk_sm.client",
    "fisk_sm.supervisor",
    "fisk_sm.tui",
    "fisk_sm.mcpserve",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "prompt_toolkit",
    "anthropic",
    "httpx",
    "httpx2",
    "pydantic",
    "nats",
    "mcp",
    "opentelemetry",
    "aiohttp",
    "textual",
)
#: What `fisk-sm ctl` may load of fisk_sm: its own modules and the standard-library helpers.
CTL_MODULES = {
    "fisk_sm",
    "fisk_sm.cli",
    "fisk_sm.cli.main",
    "fisk_sm.cli.ctl",
    "fisk_sm.cli.ctl_client",
    "fisk_sm.cli.ctl_format",
    "fisk_sm.client",
    "fisk_sm.client.errors",
    "fisk_sm.client.locate",
    "fisk_sm.client.sse",
    "fisk_sm.config",
    "fisk_sm.config.lazy",
    "fisk_sm.journal",
    "fisk_sm.journal.ids",
    "fisk_sm.journal.statedir",
    "fisk_sm.operator",
    "fisk_sm.operator.sanitize",
}
#: The modules of the commands (their parsers and handlers).
COMMAND_MODULES = {w.split(":")[0] for c in COMMANDS.values() for w in (c.parser, c.handler)}


def ctl_may_load(module: str) -> bool:
    """Whether `fisk-sm ctl` may load `module` of fisk_sm: its own modules, the standard-library
    helpers it names, and the command line's shared modules (no other command's)."""
    shared_cli = module.startswith("fisk_sm.cli.") and module not in COMMAND_MODULES
    return module in CTL_MODULES or shared_cli


REPORT = """
import json, sys
before = set(sys.modules)
{code}
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded(code: str) -> list[str]:
    """The modules `code` adds to `sys.modules` in a fresh interpreter (output on stdout must
    end with the report: `code` writes to stderr or nowhere)."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT.format(code=code)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


def third_party(modules: list[str]) -> list[str]:
    """The modules of `modules` that are neither the standard library's nor fisk_sm's."""
    return [m for m in modules if m.split(".")[0] not in STDLIB | {"fisk_sm"}]


def under(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are one of `names` or inside one of them."""
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_importing_the_package_loads_no_third_party_module() -> None:
    modules = loaded("import fisk_sm")
    assert "fisk_sm" in modules
    assert third_party(modules) == []
    # Nothing of the package but the lazy-export helper either.
    assert {m for m in modules if m.startswith("fisk_sm")} == {
        "fisk_sm",
        "fisk_sm.config",
        "fisk_sm.config.lazy",
    }


def test_the_core_loads_no_command_line_http_stack_sdk_or_extra() -> None:
    # A run made, not just the class imported: `Run` imports the loop's modules with the first
    # run (tests/test_startup_imports.py), and the core is all of them.
    code = """
from fisk_sm import Run, RunOptions, parse_config, tool
from fisk_sm.loop.harness import NoModel
Run.create(parse_config({"llm": {"model": "m"}}, env={}), "hi", RunOptions(model=NoModel()))
"""
    modules = loaded(code)
    core = {"fisk_sm.loop.run", "fisk_sm.loop.actions", "fisk_sm.tools.base", "transitions"}
    assert core | {"attrs", "cattrs"} <= set(modules)
    assert under(modules, NOT_IN_THE_CORE) == []


def test_building_a_model_client_loads_the_sdk() -> None:
    """The SDK is lazy, not missing: the first model client imports it."""
    code = """
import asyncio
from fisk_sm import parse_config
from fisk_sm.model import AnthropicModel
async def build():
    model = AnthropicModel(parse_config({"llm": {"model": "m"}}, env={}).llm, api_key="k")
    await model.aclose()
print("before", "anthropic" in sys.modules, file=sys.stderr)
asyncio.run(build())
"""
    modules = loaded(code)
    assert "anthropic" in modules
    assert "fisk_sm.cli" not in modules


def test_each_subpackage_imports_without_loading_its_names() -> None:
    code = "import " + ", ".join(
        f"fisk_sm.{p}"
        for p in ("config", "events", "journal", "loop", "machine", "model", "operator", "tools")
    )
    modules = loaded(code)
    assert third_party(modules) == []


CTL_HELP = """
import contextlib, io
sys.argv = ["fisk-sm", "ctl", "--help"]
from fisk_sm.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main()
assert "supervise" in out.getvalue(), out.getvalue()
"""


def test_ctl_help_loads_only_the_standard_library_and_its_own_modules() -> None:
    modules = loaded(CTL_HELP)
    assert "fisk_sm.cli.ctl" in modules
    assert third_party(modules) == []
    assert [m for m in modules if m.startswith("fisk_sm") and not ctl_may_load(m)] == []


def test_ctl_talking_to_no_supervisor_loads_only_the_standard_library() -> None:
    """The request path (URL building, the id rule, the error mapping) too, not only --help."""
    code = """
import contextlib, io, os
os.environ["FISK_SM_URL"] = "http://127.0.0.1:9"
sys.argv = ["fisk-sm", "ctl", "show", "run-1"]
from fisk_sm.cli import main
with contextlib.redirect_stderr(io.StringIO()):
    code = main()
assert code == 69, code
"""
    modules = loaded(code)
    assert "fisk_sm.cli.ctl_client" in modules
    assert third_party(modules) == []
    assert [m for m in modules if m.startswith("fisk_sm") and not ctl_may_load(m)] == []


def importtime_modules(*args: str) -> set[str]:
    """The modules `python -X importtime ARGS` imports (from its stderr)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=ROOT
    )
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", done.stderr, re.M))


def test_the_installed_console_script_ctl_help_imports_no_third_party_module() -> None:
    """The real `fisk-sm` script of the venv, as a user runs it (no import in this process)."""
    script = Path(sys.executable).parent / "fisk-sm"
    assert script.exists(), script
    bare = importtime_modules("-c", "pass")  # what site imports in any interpreter
    modules = importtime_modules(str(script), "ctl", "--help") - bare
    # importtime misses what importlib.import_module loads (fisk_sm.cli.ctl), not its imports.
    assert {"fisk_sm.cli.main", "fisk_sm.cli.ctl_client", "fisk_sm.cli.ctl_format"} <= modules
    assert third_party(sorted(modules)) == []


def test_top_level_help_lists_every_command_and_imports_none() -> None:
    code = """
import contextlib, io
sys.argv = ["fisk-sm", "--help"]
from fisk_sm.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main()
print(out.getvalue(), file=sys.stderr)
"""
    done = subprocess.run(
        [sys.executable, "-c", REPORT.format(code=code)], capture_output=True, text=True, cwd=ROOT
    )
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    assert third_party(modules) == []
    assert "fisk_sm.cli.main" in modules
    assert [m for m in modules if m in COMMAND_MODULES] == []
    flat = " ".join(done.stderr.split())
    for name, command in COMMANDS.items():
        assert f"{name} {command.help}" in flat


def test_the_static_command_table_says_what_each_command_says() -> None:
    """`--help` shows the table's line without importing; the command's own parser must agree."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    real = {a.dest: a.help for a in sub._choices_actions}
    assert real == {name: command.help for name, command in COMMANDS.items()}


def test_each_command_builds_only_its_own_parser() -> None:
    """Choosing a command imports its parser's and its handler's modules, no other command's."""
    for name, command in COMMANDS.items():
        own = sorted({where.split(":")[0] for where in (command.parser, command.handler)})
        # (the command line's own modules first: a command may live outside it, as `tui` does)
        code = (
            f"import fisk_sm.cli.main, {', '.join(own)}\nimport json\nbefore = set(sys.modules)\n"
        )
        code += f"from fisk_sm.cli.main import build_parser\nbuild_parser({{{name!r}}})\n"
        code += "print(json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr)"
        done = subprocess.run(
            [sys.executable, "-c", "import sys\n" + code],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        more = json.loads(done.stderr.splitlines()[-1])
        assert [m for m in more if m.startswith("fisk_sm.cli")] == [], name


# The public API.


def test_the_root_exports_at_most_30_names_each_resolving_and_documented() -> None:
    assert len(fisk_sm.__all__) <= 30
    assert len(set(fisk_sm.__all__)) == len(fisk_sm.__all__)
    section = README[README.index("## Python API") :]
    section = section[: section.index("\n## ", 1)]
    for name in fisk_sm.__all__:
        assert getattr(fisk_sm, name) is not None
        assert f"`{name}`" in section, f"{name} is not in the README's Python API section"
    assert set(fisk_sm.__all__) <= set(dir(fisk_sm))


def test_the_readme_imports_only_documented_names_from_the_root() -> None:
    for names in re.findall(r"^from fisk_sm import ([^\n(]+)$", README, re.M):
        for name in (n.strip() for n in names.split(",")):
            assert name in fisk_sm.__all__, name


def test_a_moved_name_says_where_it_lives_now() -> None:
    with pytest.raises(AttributeError, match=r"import it from fisk_sm\.events"):
        fisk_sm.StateEntered  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        fisk_sm.nothing_here  # type: ignore[attr-defined]  # noqa: B018
    for name, where in fisk_sm._MOVED.items():
        assert getattr(importlib.import_module(where), name) is not None, (name, where)


#: The package and each subpackage that exports names lazily (cli, supervisor and testing import
#: their modules on purpose: nothing below them imports them).
INITS = [
    p
    for p in [PACKAGE / "__init__.py", *sorted(PACKAGE.rglob("*/__init__.py"))]
    if "_EXPORTS" in p.read_text()
]


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_type_checking_imports_match_the_lazy_table(init: Path) -> None:
    """What mypy and IDEs see (the TYPE_CHECKING block) is what the package serves lazily."""
    tree = ast.parse(init.read_text())
    table = next(
        (
            n.value
            for n in tree.body
            if isinstance(n, ast.Assign | ast.AnnAssign)
            and isinstance(n.targets[0] if isinstance(n, ast.Assign) else n.target, ast.Name)
            and (n.targets[0] if isinstance(n, ast.Assign) else n.target).id == "_EXPORTS"  # type: ignore[union-attr]
        ),
        None,
    )
    assert table is not None
    lazy = ast.literal_eval(table)
    checked = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert checked == lazy
    package = importlib.import_module(
        ".".join(["fisk_sm", *init.parent.relative_to(PACKAGE).parts])
    )
    assert sorted(package.__all__) == sorted(lazy)
    for name, where in lazy.items():
        assert getattr(package, name) is getattr(importlib.import_module(where), name)


async def test_the_readme_python_api_example_runs(
    monkeypatch: pytest.MonkeyPatch, api: FakeMessagesAPI
) -> None:
    """The example of the README's "Python API" section runs as written (on the fake API)."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
    api.add(Reply.tool_use("add", {"a": 2, "b": 3}, id="tu_1"), Reply.text("5"))
    section = README[README.index("## Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    namespace: dict[str, object] = {}
    body = textwrap.indent(code.group(1), "    ")
    exec(f"async def example():\n{body}\n    return run, events\n", namespace)
    run, events = await namespace["example"]()  # type: ignore[operator]
    assert run.state == "completed"
    assert [e.name for e in events.of(ToolFinished)] == ["add"]
    assert run.data.messages[2].to_json()["content"][0]["content"] == "5"

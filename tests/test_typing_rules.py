"""`Any` only where JSON is really open: the rule in pyproject.toml, and the code that keeps it.

mypy (`make test`'s lint step) enforces `disallow_any_explicit` on the core; these tests check
that the rule itself stays as written: the core packages have it on, each exemption is a module
that exists and is of an allowed kind (tool input and output, the JSON codec boundary) with its
reason written here, and no other core module so much as names `Any`.
"""

from __future__ import annotations

import ast
import itertools
import tomllib
from pathlib import Path

import pytest

import fisk_sm

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(fisk_sm.__file__).parent
PYPROJECT = ROOT / "pyproject.toml"
HEADER = "[[tool.mypy.overrides]]"

#: The core subpackages (issue 21): every one checked with `disallow_any_explicit`.
CORE = ("config", "events", "journal", "loop", "machine", "model", "operator")
#: The kinds of module that may keep an explicit `Any`.
TOOL_IO = "tool input and output"
JSON_CODEC = "the JSON codec boundary"
#: Each exempt module, its kind, and why. An exemption is added here and in pyproject.toml.
EXEMPT = {
    "fisk_sm.journal.decode": (
        JSON_CODEC,
        "one journal line back into its record: it reads json.loads output field by field, on"
        " the resume path, before any record exists to type it",
    ),
    "fisk_sm.model.anthropic": (
        JSON_CODEC,
        "the Messages API's wire form: the request as keyword arguments for the SDK's typed"
        " create overloads, and the SSE stream's events assembled into the reply's JSON, which"
        " model.reply checks and model.blocks types",
    ),
}


def overrides() -> dict[str, dict[str, object]]:
    """pyproject.toml's mypy overrides: the exemptions (marked `# exempt:`) and the core's (the
    one turning `disallow_any_explicit` on), by role. Any other override that turns it off is
    an exemption without its reason, and fails here."""
    text = PYPROJECT.read_text(encoding="utf-8")
    chunks = text.split(HEADER)
    found: dict[str, dict[str, object]] = {}
    for before, chunk in itertools.pairwise(chunks):
        body = chunk.split("\n[", 1)[0]  # up to the next table
        table = tomllib.loads(HEADER + body)["tool"]["mypy"]["overrides"][0]
        comment = []  # the comment lines just above the header; the first names the role
        for line in reversed(before.rstrip().splitlines()):
            if not line.startswith("#"):
                break
            comment.insert(0, line)
        marker = comment[0] if comment else ""
        if marker.startswith("# exempt:"):
            assert "exempt" not in found, "one exemption list, not two"
            found["exempt"] = table
        elif table.get("disallow_any_explicit") is True:
            found["core"] = table
        else:
            assert "disallow_any_explicit" not in table, f"an unmarked exemption: {table}"
    return found


def modules(role: str) -> list[str]:
    table = overrides().get(role)
    assert table is not None, f"pyproject.toml has no {role} override"
    names = table["module"]
    assert isinstance(names, list)
    return [str(name) for name in names]


def module_file(name: str) -> Path:
    parts = name.split(".")
    assert parts[0] == "fisk_sm", name
    path = PACKAGE.joinpath(*parts[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def names_any(path: Path) -> list[int]:
    """The lines of `path` that import or name `Any` (`Any`, `typing.Any`, or inside a quoted
    annotation such as `"dict[str, Any]"`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            annotations.append(node.returns)
    quoted = [
        (n.lineno, n.value)
        for a in annotations
        for n in ast.walk(a)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    lines = [line for line, text in quoted if any(map(_is_any, ast.walk(_expression(text))))]
    lines += [node.lineno for node in ast.walk(tree) if _is_any(node)]
    return sorted(set(lines))


def _expression(text: str) -> ast.AST:
    """A quoted annotation's expression; a string that is none (a `Literal["a b"]` value) is
    an empty module."""
    try:
        return ast.parse(text, "", "eval")
    except (SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def _is_any(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return any(alias.name == "Any" for alias in node.names)
    if isinstance(node, ast.Name):
        return node.id == "Any"
    return isinstance(node, ast.Attribute) and node.attr == "Any"


def test_the_core_packages_disallow_explicit_any() -> None:
    core = overrides().get("core")
    assert core is not None, "no override turns disallow_any_explicit on"
    assert sorted(modules("core")) == sorted(f"fisk_sm.{name}.*" for name in CORE)
    assert all((PACKAGE / name / "__init__.py").is_file() for name in CORE)


def test_each_exemption_exists_and_is_of_an_allowed_kind() -> None:
    exempt = modules("exempt")
    assert overrides()["exempt"]["disallow_any_explicit"] is False
    assert sorted(exempt) == sorted(EXEMPT), "an exemption needs its reason in EXEMPT"
    for name, (kind, why) in EXEMPT.items():
        assert kind in (TOOL_IO, JSON_CODEC), name
        assert why, name
        assert module_file(name).is_file(), f"{name} is exempt but does not exist"
        assert name.split(".")[1] in CORE, f"{name} is not in the core"


def core_files() -> list[Path]:
    """The core's modules, but the exempt ones."""
    exempt = {module_file(name) for name in EXEMPT}
    return sorted(f for name in CORE for f in (PACKAGE / name).rglob("*.py") if f not in exempt)


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_other_core_module_names_any(path: Path) -> None:
    """A grep with the meaning of Python: `Any` imported or named, quoted annotations too."""
    assert names_any(path) == [], f"{path.relative_to(PACKAGE)} names Any"

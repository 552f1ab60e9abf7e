"""The package is layered: a subpackage imports only from the layers below it (or itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fisk_sm

PACKAGE = Path(fisk_sm.__file__).parent
#: Bottom to top. `testing` (the fake API) sits just below the command line that serves it;
#: `client` (of the control API) below `ctl`, which shares its URL and token lookup.
LAYERS = [
    "config",
    "events",
    "model",
    "journal",
    "machine",
    "operator",
    "tools",
    "loop",
    "testing",
    "client",
    "supervisor",
    "cli",
]
IMPORT = re.compile(r"^\s*(?:from|import)\s+fisk_sm\.(\w+)", re.MULTILINE)


def test_every_subpackage_is_a_known_layer() -> None:
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert found == set(LAYERS)
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"]  # no loose modules


def test_imports_only_point_down() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module in PACKAGE.rglob("*.py"):
        layer = module.relative_to(PACKAGE).parts[0]
        if layer not in rank:
            continue
        for target in IMPORT.findall(module.read_text()):
            if rank[target] > rank[layer]:
                upward.append(f"{module.relative_to(PACKAGE)} imports fisk_sm.{target}")
    assert upward == []


#: What no module below `testing` may import at its top level: the SDK is imported where a
#: model client is built; the HTTP stack and the terminal UI belong to the supervisor and the
#: command line. (tests/test_imports.py checks what importing really loads.)
HEAVY = (
    "anthropic",
    "httpx",
    "httpx2",
    "pydantic",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "prompt_toolkit",
)
CORE = LAYERS[: LAYERS.index("testing")]


def module_level_imports(tree: ast.Module) -> list[str]:
    """The modules a module imports when it is imported (not in a function, not for typing)."""
    found: list[str] = []
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Try):
            statements += [*node.body, *node.orelse, *node.finalbody]
            statements += [s for handler in node.handlers for s in handler.body]
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            statements += [*node.body, *node.orelse]
    return found


def test_the_core_imports_no_sdk_http_stack_or_terminal_ui_at_module_level() -> None:
    heavy = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.relative_to(PACKAGE).parts[0] not in CORE:
            continue
        for name in module_level_imports(ast.parse(module.read_text())):
            if name.split(".")[0] in HEAVY:
                heavy.append(f"{module.relative_to(PACKAGE)} imports {name}")
    assert heavy == []


# The parts of the supervisor (the HTTP side first; see fisk_sm/supervisor/api/__init__.py).

SUPERVISOR = PACKAGE / "supervisor"
API = SUPERVISOR / "api"
#: `fisk_sm.supervisor.api`, imported (TYPE_CHECKING imports too) or named as `from ... import api`.
IMPORTS_THE_API = re.compile(
    r"^\s*(?:from\s+fisk_sm\.supervisor\.api\b|import\s+fisk_sm\.supervisor\.api\b"
    r"|from\s+fisk_sm\.supervisor\s+import\s+(?:\(\s*)?(?:[\w\s,]*,\s*)?api\b)",
    re.MULTILINE,
)


def test_nothing_in_the_supervisor_imports_its_api() -> None:
    """The API calls the supervisor, never the other way: no module of fisk_sm/supervisor/
    outside api/ imports it (the command line, above the supervisor, does)."""
    climbs = [
        str(module.relative_to(PACKAGE))
        for module in sorted(SUPERVISOR.rglob("*.py"))
        if API not in module.parents and IMPORTS_THE_API.search(module.read_text())
    ]
    assert climbs == []
    assert IMPORTS_THE_API.search((PACKAGE / "cli" / "supervise.py").read_text())  # it sees one


VIEW = SUPERVISOR / "view"
#: What the read model must not import: the API, the host that drives runs, the cluster.
#: (A prefix: "cluster" is also cluster_runs and cluster_setup.)
NOT_FOR_THE_VIEW = ("api", "supervisor", "cluster", "ownership", "desk", "registry")
SUPERVISOR_IMPORT = re.compile(
    r"^\s*(?:from|import)\s+fisk_sm\.supervisor\.(\w+)"
    r"|^\s*from\s+fisk_sm\.supervisor\s+import\s+\(?\s*([\w\s,]+)",
    re.MULTILINE,
)
#: Known exceptions until the host split (design step 4): a row shows the registry's disposition
#: names (ABORTED, OPERATOR_SUSPENDED) and is built from a RegistryEntry.
KNOWN_VIEW_CLIMBS = {("tracked.py", "registry")}


def test_the_read_model_imports_neither_the_host_nor_the_api() -> None:
    """The view reads journals and drives nothing: no module of fisk_sm/supervisor/view/ imports
    the API, the supervisor module, the cluster, ownership, the desk or the registry."""
    climbs = set()
    for module in sorted(VIEW.rglob("*.py")):
        for direct, named in SUPERVISOR_IMPORT.findall(module.read_text()):
            targets = [direct] if direct else [n.strip() for n in named.split(",")]
            climbs |= {(module.name, t) for t in targets if t.startswith(NOT_FOR_THE_VIEW)}
    assert climbs == KNOWN_VIEW_CLIMBS

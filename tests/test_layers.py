"""The package is layered: a subpackage imports only from the layers below it (or itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fisk_sm

PACKAGE = Path(fisk_sm.__file__).parent
#: Bottom to top. `testing` (the fake API) sits just below the command line that serves it;
#: `client` (of the control API) below `ctl`, which shares its URL and token lookup; `tui` (the
#: full-screen UI, an extra) on top: the command line names its command module as a string.
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
    "tui",
    "mcpserve",
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
    "textual",
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


#: The parts of the supervisor, bottom to top (design: notes/i24-design.md §2.3): the shared
#: leaves, the NATS parts, the read model, the host that drives runs, its worker processes, the
#: HTTP API; the package's own lazy exports above them all. A part imports only its own or
#: lower parts' modules (TYPE_CHECKING imports too).
BASE = {"interface", "errors", "confine"}
PARTS = {"base": 0, "cluster": 1, "view": 2, "host": 3, "host.workers": 4, "api": 5, "package": 6}
#: The climbs (module, the part it imports) allowed: none. (It was a list that could only
#: shrink while the migration ran: notes/i24-design.md §4.)
KNOWN_CLIMBS: set[tuple[str, str]] = set()
SUPERVISOR_MODULE = re.compile(
    r"^\s*(?:from|import)\s+fisk_sm\.supervisor(?:\.(\w+)(?:\.(\w+))?)?\b", re.MULTILINE
)


def part_of(names: list[str]) -> str:
    """The part of the module `fisk_sm.supervisor.<names...>` (a file's, or an import's)."""
    if not names or names[0] == "__init__":
        return "package"
    first = names[0]
    if first == "host" and names[1:2] == ["workers"]:
        return "host.workers"
    if (SUPERVISOR / first).is_dir():
        return first
    assert first in BASE, f"fisk_sm.supervisor.{first}: a module outside every part"
    return "base"


def supervisor_imports(module: Path) -> list[list[str]]:
    """The modules of fisk_sm.supervisor that `module` imports, as name lists."""
    found = SUPERVISOR_MODULE.findall(module.read_text())
    return [[name for name in names if name] for names in found]


def climbs() -> set[tuple[str, str]]:
    """(module, part) of every import from a lower part to a higher one."""
    found = set()
    for module in sorted(SUPERVISOR.rglob("*.py")):
        names = list(module.relative_to(SUPERVISOR).with_suffix("").parts)
        rank = PARTS[part_of(names)]
        for target in supervisor_imports(module):
            part = part_of(target)
            if PARTS[part] > rank:
                found.add(("/".join(names), part))
    return found


def test_the_supervisor_parts_call_only_down() -> None:
    assert climbs() == KNOWN_CLIMBS


def test_the_api_imports_only_the_interface() -> None:
    """The API calls a `HostControl` (interface.py), and reaches nothing else of the supervisor:
    not the host, the read model, the hub, the desk, the cluster."""
    reached = set()
    for module in sorted(API.rglob("*.py")):
        for target in supervisor_imports(module):
            if target[:1] != ["api"] and not (len(target) == 1 and target[0] in BASE):
                reached.add((module.name, ".".join(target)))
    assert reached == set()


def test_the_interface_is_a_leaf() -> None:
    """interface.py imports no part of the supervisor, and of fisk_sm only the client's records
    and the machine's path (what crosses a worker's pipe is plain values)."""
    text = (SUPERVISOR / "interface.py").read_text()
    assert supervisor_imports(SUPERVISOR / "interface.py") == []
    assert set(IMPORT_PATH.findall(text)) == {"client.records", "machine.path"}


IMPORT_PATH = re.compile(r"^\s*(?:from|import)\s+fisk_sm\.([\w.]+)", re.MULTILINE)
#: What a module of the supervisor may be at most (dashboard.js is no module).
MAX_LINES = 400


def test_no_supervisor_module_passes_400_lines() -> None:
    long = {
        str(module.relative_to(SUPERVISOR)): lines
        for module in SUPERVISOR.rglob("*.py")
        if (lines := len(module.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


#: The host and its desk, which a part is given to, never a subclass of (a NATS member is a
#: plain `Host` with a `LeaseOwnership`, a `QueueIntake` and a book with the other members'
#: rows; its desk is given the cluster's `ApprovalsMirror`).
COMPOSED = ("fisk_sm.supervisor.host.host:Host", "fisk_sm.supervisor.host.desk:ApprovalDesk")


def test_no_class_of_the_supervisor_subclasses_the_host_or_its_desk() -> None:
    """A part is given to the host (tests/test_catch_alls.py checks a cluster member is a
    `Host`): every module of fisk_sm/supervisor imported, no class in it extends `COMPOSED`."""
    import importlib
    import inspect
    import pkgutil

    import fisk_sm.supervisor

    bases = []
    for spec in COMPOSED:
        module, name = spec.split(":")
        bases.append(getattr(importlib.import_module(module), name))
    found = set()
    prefix = fisk_sm.supervisor.__name__ + "."
    for info in pkgutil.walk_packages(fisk_sm.supervisor.__path__, prefix):
        for _, cls in inspect.getmembers(importlib.import_module(info.name), inspect.isclass):
            if any(issubclass(cls, base) and cls is not base for base in bases):
                found.add(f"{cls.__module__}.{cls.__qualname__}")
    assert found == set()

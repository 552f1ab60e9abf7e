"""The package is layered: a subpackage imports only from the layers below it (or itself)."""

from __future__ import annotations

import re
from pathlib import Path

import fisk_sm

PACKAGE = Path(fisk_sm.__file__).parent
#: Bottom to top. `testing` (the fake API) sits just below the command line that serves it.
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

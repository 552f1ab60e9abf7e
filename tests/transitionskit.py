"""The wheels of every `transitions` release pyproject.toml allows, for the contract test.

`make test` runs this once (a stamp file in the cache keeps it from running again until
pyproject.toml or the install changes):

    .venv/bin/python tests/transitionskit.py .venv/transitions-wheels

It asks the package index which releases of `transitions` exist (`pip index versions`), writes
them to `released.txt` in the cache, and downloads the wheel of each one the range in
pyproject.toml allows (`pip download --no-deps --only-binary=:all:`) unless it is already there.
tests/test_transitions_contract.py reads the range and that list, and imports each wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: Where `make test` puts the wheels; FISK_SM_TRANSITIONS_WHEELS overrides it.
CACHE = Path(os.environ.get("FISK_SM_TRANSITIONS_WHEELS", ROOT / ".venv" / "transitions-wheels"))
RELEASED = "released.txt"


def allowed(pyproject: Path = ROOT / "pyproject.toml") -> SpecifierSet:
    """The versions of `transitions` the project's dependencies allow."""
    project = tomllib.loads(pyproject.read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == "transitions":
            return requirement.specifier
    raise LookupError(f"{pyproject}: no transitions dependency")


def released_on_index() -> list[str]:
    """Every release of `transitions` the package index lists (pre-releases aside)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "transitions"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"^Available versions: (.+)$", done.stdout, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"pip index versions transitions: no versions in {done.stdout!r}")
    return [v.strip() for v in found.group(1).split(",")]


def released(cache: Path = CACHE) -> list[str]:
    """The releases the index listed when the cache was filled; empty if it never was."""
    listing = cache / RELEASED
    return listing.read_text().split() if listing.exists() else []


def wheel(version: str, cache: Path = CACHE) -> Path | None:
    """The cached wheel of one release, if it is there."""
    wheels = sorted(cache.glob(f"transitions-{version}-*.whl"))
    return wheels[0] if wheels else None


def fetch(cache: Path) -> list[Path]:
    """Fill `cache` with a wheel of each allowed release; return those wheels."""
    cache.mkdir(parents=True, exist_ok=True)
    versions = released_on_index()
    spec = allowed()
    wanted = sorted((v for v in versions if Version(v) in spec), key=Version)
    for version in wanted:
        if wheel(version, cache) is None:
            subprocess.run(
                [
                    *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                    *("--only-binary=:all:", "--dest", str(cache), f"transitions=={version}"),
                ],
                check=True,
            )
    # written last, so that an interrupted fetch leaves no list claiming wheels it lacks
    (cache / RELEASED).write_text("\n".join(versions) + "\n")
    return [w for v in wanted if (w := wheel(v, cache)) is not None]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE
    for path in fetch(target):
        print(f"transitions wheel: {path}")

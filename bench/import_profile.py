"""Where an entry point's import time goes: `-X importtime`, median over N fresh processes.

Each module's own (self) time is charged to a group: a fisk_sm module to itself, a third-party
module to its distribution's top-level package, and a standard-library module to whatever
non-standard-library module first imported it (`stdlib via attr`, `stdlib via
fisk_sm.loop.actions`), so that each line says whose choice a cost is. `-X importtime` inflates
every time it reports (by about a third), so the total is larger than `bench/startup.py`'s CPU
time; the shares are what to read.

    .venv/bin/python bench/import_profile.py -c "from fisk_sm import Run"
    .venv/bin/python bench/import_profile.py -n 15 --tree /tmp/startup-base -c "import fisk_sm"
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STDLIB = frozenset(sys.stdlib_module_names)
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)", re.M)


def _stdlib(name: str) -> bool:
    top = name.split(".")[0]
    return top in STDLIB or top.startswith("_")


def _group(name: str, importers: list[str]) -> str:
    """The group `name`'s self time is charged to; `importers` from the nearest outward."""
    if name.split(".")[0] == "fisk_sm":
        return name
    if not _stdlib(name):
        return name.split(".")[0]
    for importer in importers:
        if not _stdlib(importer):
            owner = importer if importer.startswith("fisk_sm") else importer.split(".")[0]
            return f"stdlib via {owner}"
    return "stdlib (the bare interpreter's)"


def profile(code: str, tree: Path) -> dict[str, int]:
    """Microseconds of self time per group, for one fresh `python -X importtime -c CODE`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tempfile.gettempdir(),  # no fisk_sm here to shadow the tree
        check=True,
    )
    rows = [(int(us), len(indent), name) for us, indent, name in _LINE.findall(done.stderr)]
    groups: dict[str, int] = {}
    for i, (us, depth, name) in enumerate(rows):
        # A module's line comes after its imports': its importer is the next line less indented.
        importers, level = [], depth
        for _, later_depth, later in rows[i + 1 :]:
            if later_depth < level:
                importers.append(later)
                level = later_depth
        key = _group(name, importers)
        groups[key] = groups.get(key, 0) + us
    return groups


def main() -> int:
    """Print the groups, largest first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", dest="code", required=True, help="the statement to profile")
    parser.add_argument("-n", type=int, default=9, help="processes (default 9)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout (PYTHONPATH)")
    parser.add_argument("--top", type=int, default=30, help="groups shown (default 30)")
    args = parser.parse_args()
    runs = [profile(args.code, args.tree.resolve()) for _ in range(args.n)]
    names = set().union(*runs)
    median = {k: statistics.median(run.get(k, 0) for run in runs) for k in names}
    total = sum(median.values())
    fisk = sum(v for k, v in median.items() if k.startswith("fisk_sm"))
    print(f"{args.code!r}: median self time of {args.n} runs, -X importtime (inflated)")
    print(f"total {total / 1000:.1f} ms, of it fisk_sm's own modules {fisk / 1000:.1f} ms")
    for name, us in sorted(median.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{us / 1000:8.2f} ms {100 * us / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

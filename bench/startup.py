"""Startup cost: how much slower than a bare interpreter each entry point starts.

Each row is the median wall time of N fresh processes (default 10), divided by the median of
`python -c pass`: importing the package, importing `Run`, `fisk-sm --help`, `fisk-sm ctl --help`
and `fisk-sm ctl ls` against a running supervisor (`fisk-sm supervise` on loopback, its model the
bundled fake Messages API, one finished run in its list). The `fisk-sm` rows run what the console
script runs (`from fisk_sm.cli import main; sys.exit(main())`) so that a tree other than the
installed one can be measured the same way.

`--base DIR` adds the same rows for another checkout (PYTHONPATH=DIR), e.g. the commit before a
change, from a pristine clone:

    git clone -q . /tmp/startup-base && git -C /tmp/startup-base checkout -q be621ac
    .venv/bin/python bench/startup.py --base /tmp/startup-base

The supervisor is this tree's in both cases (ctl speaks the same API). Each tree is byte-compiled
first (`compileall`), as an installed package is: a run with PYTHONDONTWRITEBYTECODE set would
otherwise compile every module from source each time. Besides the wall time, each row shows
the processes' CPU time (user + system), which a loaded machine disturbs less. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The working directory of the measured processes: `python -c` puts it first on sys.path, so
#: it must hold no fisk_sm (else it would shadow the tree PYTHONPATH names).
NEUTRAL = tempfile.gettempdir()
sys.path.insert(0, str(ROOT))

from fisk_sm.testing import FakeMessagesAPI, Reply  # noqa: E402  (after the path is set)

CONSOLE = (
    "import sys; sys.argv = ['fisk-sm', *{args!r}]; from fisk_sm.cli import main; sys.exit(main())"
)


def rows(url: str) -> list[tuple[str, list[str]]]:
    """(label, python arguments) of each measured entry point."""

    def console(*args: str) -> list[str]:
        return ["-c", CONSOLE.format(args=list(args))]

    return [
        ("python -c pass", ["-c", "pass"]),
        ("import fisk_sm", ["-c", "import fisk_sm"]),
        ("from fisk_sm import Run", ["-c", "from fisk_sm import Run"]),
        ("fisk-sm --help", console("--help")),
        ("fisk-sm ctl --help", console("ctl", "--help")),
        ("fisk-sm ctl ls", console("ctl", "--url", url, "ls")),
    ]


def measure(argv: list[str], tree: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh `python ARGV` importing from `tree`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=NEUTRAL,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        again = subprocess.run([sys.executable, *argv], env=env, capture_output=True, cwd=NEUTRAL)
        raise SystemExit(f"{argv}: exit {process.returncode}: {again.stderr.decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def modules(argv: list[str], tree: Path) -> int:
    """How many modules one such process imports (`-X importtime` lines, site's included)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=NEUTRAL,
    )
    return len(re.findall(r"^import time:\s+\d+ \|", done.stderr, re.M)) - 1  # the header


@contextmanager
def supervisor() -> Iterator[str]:
    """A `fisk-sm supervise` on a free loopback port with one completed run; its URL."""
    with tempfile.TemporaryDirectory() as tmp, FakeMessagesAPI() as api:
        api.add(Reply.text("done"))
        agent = Path(tmp) / "agent.yaml"
        agent.write_text(f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        env |= {"ANTHROPIC_API_KEY": "bench", "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "fisk_sm.cli", "supervise", "-c", str(agent)]
        argv += ["--listen", "127.0.0.1:0", "--state-dir", str(Path(tmp) / "state")]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp
        )
        try:
            assert process.stderr is not None
            url = ""
            for line in process.stderr:
                found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
                if found:
                    url = found.group(1)
                    break
            if not url:
                raise SystemExit(f"supervise exited {process.wait()} before listening")
            run_id = _post(url + "/api/runs", {"prompt": "hello", "name": "bench-1"})["run_id"]
            deadline = time.monotonic() + 120
            while _get(f"{url}/api/runs/{run_id}")["status"] != "completed":
                if time.monotonic() > deadline:
                    raise SystemExit("the bench run did not complete")
                time.sleep(0.05)
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: dict[str, object] = json.load(response)
        return body


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, object] = json.load(response)
        return answer


def main() -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="processes per row (default 10)")
    parser.add_argument("--base", type=Path, help="also measure this checkout (PYTHONPATH)")
    args = parser.parse_args()
    trees = [("now", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    for _, tree in trees:
        compile_all = [sys.executable, "-m", "compileall", "-q", str(tree / "fisk_sm")]
        subprocess.run(compile_all, check=True)
    with supervisor() as url:
        table = rows(url)
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        # Round robin, so that a change in the machine's load weighs on every row alike.
        for _ in range(args.n):
            for label, argv in table:
                for name, tree in trees:
                    runs.setdefault((label, name), []).append(measure(argv, tree))
        counts = {
            (label, name): modules(argv, tree) for label, argv in table for name, tree in trees
        }
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    print(f"median of {args.n} fresh processes each; ×bare = median / median of `python -c pass`")
    head = f"{'entry point':24}"
    for name, _ in trees:
        head += f" | {name + ' ms':>8} | {'×bare':>6} | {'cpu ms':>7} | {'cpu ×bare':>9}"
        head += f" | {'modules':>7}"
    print(head)
    print("-" * len(head))
    for label, _ in table:
        line = f"{label:24}"
        for name, _ in trees:
            key, bare = (label, name), ("python -c pass", name)
            line += f" | {wall[key] * 1000:8.1f} | {wall[key] / wall[bare]:6.2f}"
            line += f" | {cpu[key] * 1000:7.1f} | {cpu[key] / cpu[bare]:9.2f} | {counts[key]:7d}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A program that leaves processes behind outside its process group, for the containment tests.

    python tests/mcp_server_spawner.py PID_FILE [--serve] [--clear-env]

It starts two processes that sleep for ever and appends their pids to PID_FILE, one per line:
`setsid PID` (a child in a session of its own) and `double PID` (a grandchild, double-forked
into a session of its own: its parent exits at once, so it is an orphan). With `--clear-env`
the double-forked one runs with an empty environment (as `env -i` would). Then it prints
`spawned` and exits, as an exec tool; with `--serve` it goes on as the demo MCP server over
stdio (tests/mcp_server_demo.py's tools).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

FOREVER = ["sleep", "100000"]


def double_fork(clear_env: bool) -> int:
    """Start a grandchild in a new session whose parent exits at once; its pid."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve(sleep, FOREVER, {} if clear_env else dict(os.environ))
        os.write(write_end, str(grandchild).encode())
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(child, 0)
    return pid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pid_file", type=Path)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--clear-env", action="store_true")
    args = parser.parse_args()
    setsid = subprocess.Popen(
        FOREVER,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    double = double_fork(args.clear_env)
    with args.pid_file.open("a") as out:
        out.write(f"setsid {setsid.pid}\ndouble {double}\n")
    if args.serve:
        from mcp_server_demo import build  # beside this file, so on sys.path

        build(1).run("stdio")
    else:
        print("spawned", flush=True)


if __name__ == "__main__":
    main()

"""A small MCP server over stdio, written with the `mcp` SDK, for the MCP tests.

    python tests/mcp_server_demo.py [--pid-file PATH] [--child] [--variant 2] [--http PORT] [--big]

`--pid-file` appends this process's pid (and, with `--child`, the pid of a `sleep` it leaves
running in its process group) to PATH, one per line, so a test can check by PID that the run
took both down. `--variant 2` changes the tool list (a server that changed its tools).
`--http PORT` serves streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio.
`--big` adds `big_text` and `big_image` (results of a given size, for the output caps).

Tools: `add` (text), `fail` (an `isError` result), `dot` (an image), `env` (whether a variable
reached the server), `wait_for` (blocks until a file exists, writing `<path>.started` first).
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

#: A 1x1 PNG.
DOT_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def big_text(size: int) -> str:
    """`size` characters: `HEAD<` first, `>TAIL` last, dots between."""
    return "HEAD<" + "." * (size - 10) + ">TAIL"


def build(variant: int, big: bool = False) -> MCPServer:
    server = MCPServer("demo")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return f"{a} + {b} = {a + b}"

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails, with `reason`."""
        raise ToolError(f"failed on purpose: {reason}")

    @server.tool()
    def dot() -> Image:
        """A one-pixel PNG."""
        return Image(data=DOT_PNG, format="png")

    @server.tool()
    def env(name: str) -> str:
        """Whether the variable `name` is set in the server's environment."""
        return "set" if name in os.environ else "unset"

    @server.tool()
    def wait_for(path: str) -> str:
        """Write `<path>.started`, then wait until `path` exists."""
        Path(f"{path}.started").write_text(str(os.getpid()))
        while not Path(path).exists():
            time.sleep(0.05)
        return f"{path} is there"

    if big:

        @server.tool(name="big_text")
        def big_text_tool(size: int) -> str:
            """A text of `size` characters (`HEAD<`, dots, `>TAIL`)."""
            return big_text(size)

        @server.tool()
        def big_image(size: int) -> Image:
            """A PNG-typed image of `size` bytes."""
            return Image(data=DOT_PNG + bytes(size - len(DOT_PNG)), format="png")

    if variant == 2:

        @server.tool()
        def multiply(a: int, b: int) -> str:
            """Multiply two integers."""
            return str(a * b)

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-file")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--variant", type=int, default=1)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP instead")
    parser.add_argument("--big", action="store_true", help="add big_text and big_image")
    args = parser.parse_args()
    if args.pid_file:
        pids = [os.getpid()]
        if args.child:
            child = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
            pids.append(child.pid)
        with Path(args.pid_file).open("a") as out:
            out.writelines(f"{pid}\n" for pid in pids)
    if args.http is not None:
        build(args.variant, args.big).run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        build(args.variant, args.big).run("stdio")


if __name__ == "__main__":
    main()

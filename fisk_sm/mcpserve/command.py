"""`fisk-sm mcp-serve`: the command line of the agent's MCP server (stdio).

Importing this module imports neither the `mcp` SDK nor the loop: `--help` and a missing
`fisk-sm[mcp]` extra (one line, exit 2) are answered without them. On stdio, stdout carries
only MCP messages; everything fisk-sm says goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fisk_sm.config.agent import AgentConfig

__all__ = ["add_mcp_serve_parser", "cmd_mcp_serve"]


def add_mcp_serve_parser(sub: Any) -> None:
    """The `mcp-serve` command's parser."""
    serve = sub.add_parser(
        "mcp-serve",
        help="serve an agent as an MCP tool (ask), its sessions durable chats",
        description="Serve the agent in agent.yaml over MCP on stdio (revision 2026-07-28), as"
        " one tool: ask(prompt, session?) returns the final answer. Each session is a"
        " journaled chat: ask with its id is the next turn, or resumes it. Progress goes out per"
        " model call and per tool; a cancelled call suspends the run (a tool in flight finishes"
        " and is journaled); a gated tool comes back as an input request (once, always, deny).",
    )
    serve.add_argument("-c", "--config", required=True, type=Path, help="the agent.yaml")
    serve.add_argument(
        "--state-dir", type=Path, help="the sessions directory (default: the config's, or XDG)"
    )


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    """`fisk-sm mcp-serve`."""
    try:
        import mcp  # noqa: F401 (the extra's presence)
    except ImportError:
        sys.stderr.write("fisk-sm: mcp-serve needs the mcp extra: pip install 'fisk-sm[mcp]'\n")
        return 2
    import asyncio

    from fisk_sm.config.agent import load_config

    config = load_config(args.config)
    return asyncio.run(_serve(args, config))


async def _serve(args: argparse.Namespace, config: AgentConfig) -> int:
    import asyncio
    import contextlib

    from fisk_sm.cli.run import session_store
    from fisk_sm.mcpserve.server import AgentServer
    from fisk_sm.model.clients import warm_up

    await warm_up(config.llm)  # the SDK's import and client, off the loop
    async with session_store(args.state_dir, config) as store:
        server = AgentServer(config, store)
        try:
            await server.mcp.run_stdio_async()
        finally:  # the client left: every run still going is suspended, its tool finished
            for served in server.sessions.values():
                if served.run is not None and served.live:
                    served.run.request_suspend(now=True)
            tasks = [s.task for s in server.sessions.values() if s.task is not None]
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)  # each closes its run
    return 0

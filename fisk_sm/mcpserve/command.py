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
    from mcp.server.mcpserver import MCPServer

    from fisk_sm.config.agent import AgentConfig

__all__ = ["add_mcp_serve_parser", "cmd_mcp_serve", "serve"]


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
    serve.add_argument("-c", "--config", type=Path, help="the agent.yaml to serve")
    serve.add_argument(
        "--supervisor",
        metavar="URL",
        help="serve the supervisor at URL instead: its control API as tools, its runs as"
        " resources ($FISK_SM_URL and the URL supervise wrote are not read: name it)",
    )
    serve.add_argument("--token", help="with --supervisor: its bearer token ($FISK_SM_TOKEN)")
    serve.add_argument(
        "--state-dir", type=Path, help="the sessions directory (default: the config's, or XDG)"
    )
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (loopback unless"
        " a token is set, as for supervise; port 0 picks one, said on stderr)",
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="with --listen: the token HTTP clients must send, read from FILE"
        " (default: $FISK_SM_TOKEN, if set)",
    )


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    """`fisk-sm mcp-serve`."""
    try:
        import mcp  # noqa: F401 (the extra's presence)
    except ImportError:
        sys.stderr.write("fisk-sm: mcp-serve needs the mcp extra: pip install 'fisk-sm[mcp]'\n")
        return 2
    import asyncio

    from fisk_sm.cli.run import UsageError
    from fisk_sm.cli.supervise import served_token
    from fisk_sm.config.agent import load_config

    if (args.config is None) == (args.supervisor is None):
        raise UsageError("mcp-serve serves -c agent.yaml or --supervisor URL (one of them)")
    if args.supervisor is not None and args.state_dir is not None:
        raise UsageError("--state-dir is the agent's: --supervisor takes none")
    if args.token is not None and args.supervisor is None:
        raise UsageError("--token needs --supervisor")
    if args.token_file is not None and args.listen is None:
        raise UsageError("--token-file needs --listen")
    token = served_token(args) if args.listen is not None else None
    if args.listen is not None:  # refused at once, in one line: a bad address, or no token
        from fisk_sm.supervisor.api.server import ListenError, check_token_rule, parse_listen

        try:
            check_token_rule(parse_listen(args.listen)[0], token)
        except ListenError as exc:
            raise UsageError(str(exc)) from None
    if args.supervisor is not None:
        from fisk_sm.mcpserve.fleet import serve_fleet

        return asyncio.run(serve_fleet(args.supervisor, args.token, args.listen, token))
    config = load_config(args.config)
    return asyncio.run(_serve(args, config, token))


async def _serve(args: argparse.Namespace, config: AgentConfig, token: str | None) -> int:
    import asyncio

    from fisk_sm.cli.run import session_store
    from fisk_sm.mcpserve.server import AgentServer
    from fisk_sm.model.clients import warm_up

    await warm_up(config.llm)  # the SDK's import and client, off the loop
    async with session_store(args.state_dir, config) as store:
        server = AgentServer(config, store)
        try:
            await serve(server.mcp, args.listen, token, "mcp-serve")
        finally:  # the client left: every run still going is suspended, its tool finished
            for served in server.sessions.values():
                if served.run is not None and served.live:
                    served.run.request_suspend(now=True)
            tasks = [s.task for s in server.sessions.values() if s.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)  # each closes its run
    return 0


async def serve(mcp: MCPServer, listen: str | None, token: str | None, name: str) -> None:
    """Serve `mcp` on stdio, or on streamable HTTP at `listen` until SIGINT or SIGTERM."""
    import asyncio
    import signal

    if listen is None:
        await mcp.run_stdio_async()
        return
    from fisk_sm.mcpserve.http import serve_http

    task = asyncio.ensure_future(serve_http(mcp, listen, token, name))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise

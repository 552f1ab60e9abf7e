"""`fisk-sm info`: what an agent.yaml amounts to, without calling the model.

The model section, then a table of the tools the model is offered (name, kind, description,
tags, gated or not), the tools the selection leaves out, the MCP servers (started to list their
tools, then stopped), and the session and memory backends.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import shlex
import sys
from collections import Counter
from typing import TextIO

from fisk_sm.cli.run import store_for
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.loop.harness import Harness, NoModel, RunOptions, configured_tools, memory_store
from fisk_sm.operator.prompter import NoOperator
from fisk_sm.operator.sanitize import strip_control
from fisk_sm.tools.base import Tool
from fisk_sm.tools.gate import Gate

__all__ = ["cmd_info", "describe"]


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


async def _list_mcp_tools(harness: Harness) -> None:
    """Start the MCP servers for their tool lists, and stop them."""
    try:
        await harness.start_mcp_servers()
    finally:
        await harness.aclose()


def _kind(tool: Tool) -> str:
    return f"mcp ({tool.agent})" if tool.kind == "mcp" else tool.kind


def _mcp_servers(config: AgentConfig, harness: Harness, out: TextIO) -> None:
    listed = Counter(t.agent for t in harness.tools.tools.values() if t.kind == "mcp")
    out.write("\nmcp servers\n")
    for server in config.mcp_servers:
        target = shlex.join(server.command) if server.command else server.url
        gate = "gated" if server.confirm else "not gated (confirm: false)"
        count = listed[server.alias]
        out.write(f"  {server.alias}  {server.transport}: {target}  ({count} tools, {gate})\n")


def describe(config: AgentConfig, out: TextIO) -> None:
    """Write the description of `config` to `out`."""
    llm = config.llm
    budget = llm.budget
    out.write(
        "model\n"
        f"  provider        {llm.provider}\n"
        f"  model           {llm.model}\n"
        f"  base_url        {llm.base_url or 'https://api.anthropic.com (SDK default)'}\n"
        f"  thinking        {llm.resolved_thinking.label}\n"
        f"  output cap      {llm.output_cap} tokens per reply\n"
        f"  max_tokens      {budget.max_tokens} (whole run, four tiers)\n"
        f"  max_iterations  {budget.max_iterations}\n"
        f"  call_timeout    {budget.call_timeout:g}s\n"
        f"  identity        {config.identity}\n\n"
    )
    harness = Harness.build(config, RunOptions(model=NoModel()))  # info never calls the model
    if config.mcp_servers:
        asyncio.run(_list_mcp_tools(harness))
    gate = Gate(NoOperator(), config.harness.confirm_tags)
    rows = [["NAME", "KIND", "DESCRIPTION", "TAGS", "GATED"]]
    for tool in harness.tools.tools.values():
        summary = (tool.description.splitlines() or [""])[0][:60]
        gated = gate.gated_tag(tool)
        rows.append(
            [
                tool.name,
                _kind(tool),
                summary,
                ", ".join(tool.tags),
                f"yes ({gated})" if gated else "no",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out.write(f"tools ({len(rows) - 1} offered)\n")
    out.writelines(f"  {_row(r, widths)}\n" for r in rows)
    offered = set(harness.tools.tools)
    left_out = [t.name for t in configured_tools(config) if t.name not in offered]
    if left_out:
        out.write(f"  not offered (ai:deny or the tool selection): {', '.join(left_out)}\n")
    for kind, name, detail in harness.warnings:
        out.write(f"  warning: {kind} {name} {detail}".rstrip() + "\n")
    if config.mcp_servers:
        _mcp_servers(config, harness, out)
    sessions = store_for(None, config)
    memory = config.harness.memory
    out.write(
        "\nsessions\n"
        f"  backend         {config.harness.sessions.backend}\n"
        f"  directory       {sessions.directory}\n"
        "\nmemory\n"
        f"  enabled         {'yes' if memory.enabled else 'no'}\n"
    )
    if memory.enabled:
        out.write(
            f"  backend         {memory.backend}\n"
            f"  location        {memory_store(config).location}\n"
            f"  index in prompt {'no' if memory.no_index else 'yes'}\n"
        )


def cmd_info(args: argparse.Namespace) -> int:
    """`fisk-sm info -c agent.yaml`."""
    text = io.StringIO()
    describe(load_config(args.config), text)
    # Descriptions and tags may come from tool modules or remote hosts: strip what a terminal
    # would act on.
    sys.stdout.write(strip_control(text.getvalue()))
    return 0

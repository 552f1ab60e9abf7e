"""`fisk-sm info`: what an agent.yaml amounts to, without calling the model.

The model section, then a table of the tools the model is offered (name, kind, description,
tags, gated or not), the tools the selection leaves out, and the session and memory backends.
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import TextIO

from fisk_sm.cli.run import store_for
from fisk_sm.config.agent import AgentConfig, load_config
from fisk_sm.loop.harness import Harness, NoModel, RunOptions, configured_tools, memory_store
from fisk_sm.operator.prompter import NoOperator
from fisk_sm.operator.sanitize import strip_control
from fisk_sm.tools.gate import Gate

__all__ = ["cmd_info", "describe"]


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def describe(config: AgentConfig, out: TextIO) -> None:
    """Write the description of `config` to `out`."""
    llm = config.llm
    budget = llm.budget
    out.write(
        "model\n"
        f"  provider        {llm.provider}\n"
        f"  model           {llm.model}\n"
        f"  base_url        {llm.base_url or 'https://api.anthropic.com (SDK default)'}\n"
        f"  thinking        {'adaptive' if llm.thinking.enabled else 'off'}\n"
        f"  output cap      {llm.output_cap} tokens per reply\n"
        f"  max_tokens      {budget.max_tokens} (whole run, four tiers)\n"
        f"  max_iterations  {budget.max_iterations}\n"
        f"  call_timeout    {budget.call_timeout:g}s\n"
        f"  identity        {config.identity}\n\n"
    )
    harness = Harness.build(config, RunOptions(model=NoModel()))  # info never calls the model
    gate = Gate(NoOperator(), config.harness.confirm_tags)
    rows = [["NAME", "KIND", "DESCRIPTION", "TAGS", "GATED"]]
    for tool in harness.tools.tools.values():
        summary = (tool.description.splitlines() or [""])[0][:60]
        gated = gate.gated_tag(tool)
        rows.append(
            [
                tool.name,
                tool.kind,
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
            f"  directory       {memory_store(config).directory}\n"
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

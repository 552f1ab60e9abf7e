"""An agent.yaml against the fake Messages API, with tools written next to it: `add`, `slow`
(says when it starts and ends in effects.txt) and the gated `deploy` (writes its target there).

Each test file names its own tools module: a module is imported once per process, and its
`EFFECTS` file must be the test's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fisk_sm.testing import FakeMessagesAPI

TOOLS = '''
import time
from pathlib import Path

from fisk_sm import tool

EFFECTS = Path(__file__).with_name("effects.txt")


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@tool
def slow(seconds: float) -> str:
    """Work a while, saying when it starts and ends.

    Args:
        seconds: how long
    """
    with EFFECTS.open("a") as f:
        f.write("started\\n")
    time.sleep(seconds)
    with EFFECTS.open("a") as f:
        f.write("done\\n")
    return "slept"


@tool(tags=["ai:confirm"])
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: where to
    """
    with EFFECTS.open("a") as f:
        f.write(f"deployed {target}\\n")
    return f"deployed {target}"
'''


def write_agent(
    tmp_path: Path,
    api: FakeMessagesAPI,
    module: str,
    names: Sequence[str] = ("add", "slow", "deploy"),
    more: str = "",
) -> Path:
    """tmp_path/agent.yaml with the tools `names` of tmp_path/`module`.py (`TOOLS`, then
    `more` source), its model the fake API's (prompt caching off)."""
    (tmp_path / f"{module}.py").write_text(TOOLS + more)
    path = tmp_path / "agent.yaml"
    tools = ", ".join(f"{{python: '{module}:{name}'}}" for name in names)
    path.write_text(
        f"llm: {{model: claude-test, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        f"tools: [{tools}]\n"
    )
    return path


def effects(tmp_path: Path) -> list[str]:
    """What the tools wrote to effects.txt, line by line."""
    path = tmp_path / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []

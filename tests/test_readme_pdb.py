"""The README's `(Pdb)` session works at a real pdb prompt: a `breakpoint()` inside a coroutine
(whose event loop is running, and blocked by the prompt) that holds `agent_run`, with the
README's lines typed at the prompt, gives the README's answers. And the name it teaches does not
clash with a pdb command, as `run` does (pdb's `run` restarts the program)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "(Pdb) "
SCRIPT = """\
import asyncio
from fisk_sm import Run, RunOptions, load_config, tool
from fisk_sm.testing import FakeMessagesAPI, Reply

@tool
def multiply(a: float, b: float) -> float:
    \"\"\"Multiply two numbers.\"\"\"
    return a * b

async def main() -> None:
    script = [Reply.tool_use("multiply", {"a": 5, "b": 4}, id="tu_1"), Reply.text("20")]
    with FakeMessagesAPI(script) as api:
        with open("agent.yaml", "w") as f:
            f.write(f"llm: {{model: m, base_url: '{api.base_url}'}}\\n")
        config = load_config("agent.yaml")
        agent_run = Run.create(config, "What is (2 + 3) * 4?", RunOptions(tools=[multiply]))
        run = agent_run
        breakpoint()
        print("after the prompt:", agent_run.state, agent_run.answer())

asyncio.run(main())
"""


def readme_session() -> list[tuple[str, list[str]]]:
    """The README's `(Pdb)` lines, each with the output lines the README shows after it."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    session: list[tuple[str, list[str]]] = []
    for line in lines:
        text = line.strip()
        if text.startswith(PROMPT):
            session.append((text.removeprefix(PROMPT), []))
        elif session and line.startswith("    ") and text:
            session[-1][1].append(text)
        elif session:
            break  # the first indented block of (Pdb) lines only
    return session


def pdb(tmp_path: Path, commands: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "debugged.py").write_text(SCRIPT)
    env = {**os.environ, "ANTHROPIC_API_KEY": "test", "PYTHONBREAKPOINT": "pdb.set_trace"}
    return subprocess.run(
        [sys.executable, "debugged.py"],
        cwd=tmp_path,
        input="".join(f"{c}\n" for c in [*commands, "c"]),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_readme_pdb_session_works_at_a_real_pdb_prompt(tmp_path: Path) -> None:
    session = readme_session()
    assert [c for c, _ in session][:1] == ["debugger = agent_run.sync()"]
    done = pdb(tmp_path, [command for command, _ in session])
    assert done.returncode == 0, done.stdout + done.stderr
    # each answer the README shows, in order
    answers = [answer for _, shown in session for answer in shown]
    assert answers, "the README shows what the prompt answers"
    position = 0
    for answer in answers:
        position = done.stdout.index(answer, position) + len(answer)
    assert "after the prompt: completed 20" in done.stdout


def test_a_run_named_run_is_pdbs_run_command(tmp_path: Path) -> None:
    """Why the README does not call it `run`: the same line restarts the program instead."""
    done = pdb(tmp_path, ["run.step()"])
    assert "Restart" in done.stdout + done.stderr

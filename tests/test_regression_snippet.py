"""The README's session-to-regression-test example runs under plain pytest: the test it shows,
copied as written next to a real recorded session, passes with the pytest-asyncio plugin
disabled, and fails once the agent's behaviour changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "fisk_sm.cli"]
RECORD = ["--state-dir", "state", "summarise the logs"]
LEAD = "A recorded session is a regression test."
TOOLS = '''
def count_logs(folder: str) -> int:
    """How many log files `folder` holds."""
    return 3
'''


def readme_example() -> str:
    """The ```python fence that follows the README's regression-test paragraph."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(LEAD))
    opening = next(i for i in range(start, len(lines)) if lines[i].strip() == "```python")
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    return "\n".join(lines[opening + 1 : closing]) + "\n"


def write_agent(folder: Path, base_url: str, system: str) -> None:
    (folder / "agent.yaml").write_text(
        f"system_prompt: {system}\n"
        f"llm: {{model: m, base_url: '{base_url}'}}\n"
        "tools: [{python: 'log_tools:count_logs'}]\n"
    )


def plain_pytest(folder: Path) -> subprocess.CompletedProcess[str]:
    """pytest on the copied test, with the asyncio plugin (and this repo's settings) left out."""
    command = [sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider"]
    command += ["-p", "no:randomly", "-q", "tests/test_nightly.py"]
    env = {**os.environ, "ANTHROPIC_API_KEY": "test", "PYTHONPATH": str(folder)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=120)


def test_the_readme_regression_test_runs_under_plain_pytest(tmp_path: Path) -> None:
    (tmp_path / "log_tools.py").write_text(TOOLS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this repo's config
    script = [
        Reply.tool_use("count_logs", {"folder": "logs"}),
        Reply.text("All 3 log files summarised."),
    ]
    with FakeMessagesAPI(script) as api:
        write_agent(tmp_path, api.base_url, "You summarise logs.")
        recorded = subprocess.run(
            [*CLI, "run", "-c", "agent.yaml", "--checkpoint", "--name", "nightly", *RECORD],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "ANTHROPIC_API_KEY": "test"},
            timeout=60,
        )
        assert recorded.returncode == 0, recorded.stderr
        assert recorded.stdout.strip() == "All 3 log files summarised."
    # as the README says: copy the journal next to the tests, and the test as written
    (tmp_path / "tests" / "sessions").mkdir(parents=True)
    shutil.copy(tmp_path / "state" / "nightly.json", tmp_path / "tests" / "sessions")
    (tmp_path / "tests" / "test_nightly.py").write_text(readme_example())

    passed = plain_pytest(tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "1 passed" in passed.stdout

    # the agent changes (its system prompt): the same test now fails, and says why
    write_agent(tmp_path, "http://127.0.0.1:9", "You summarise logs briefly.")
    failed = plain_pytest(tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 failed" in failed.stdout
    assert "replay diverged at iteration 0: the system prompt differs" in failed.stdout

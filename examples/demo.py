"""The offline demo behind `make demo`.

It serves examples/calculator/script.yaml with the bundled fake Messages API on 127.0.0.1, then
runs `fisk-sm run --trace` on the calculator agent as a real subprocess, through the real
anthropic SDK. The final answer is printed on stdout; the transitions, tool calls and the summary
on stderr. No network is used but loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fisk_sm.testing import FakeMessagesAPI, load_script

HERE = Path(__file__).resolve().parent / "calculator"


def main() -> int:
    """Run the demo; returns the agent's exit code."""
    with FakeMessagesAPI(load_script(HERE / "script.yaml")) as api:
        env = {**os.environ, "ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "offline"}
        command = [sys.executable, "-m", "fisk_sm.cli", "run", "--trace"]
        command += ["-c", str(HERE / "agent.yaml"), "What is (17 + 25) * 3?"]
        print(f"$ fisk-sm run --trace -c {HERE / 'agent.yaml'} 'What is (17 + 25) * 3?'")
        print(f"  (model: the fake Messages API at {api.base_url})", file=sys.stderr)
        sys.stdout.flush()
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())

"""The terminal prompter through the approval states, on a real pseudo-terminal: Ctrl-C at the
approval prompt suspends the run with the approval pending (journaled as asked, never denied),
and `--resume` asks again; answered `once`, the tool runs exactly once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import ApprovalAnswered, ApprovalRequested, Terminal, ToolResult
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
HANG = 60  # a guard against a hang, far above what any machine needs

TOOLS = '''
from pathlib import Path


def rm(path: str) -> str:
    """Remove a path (pretend: note it in effects.txt).

    Args:
        path: what to remove
    """
    with open(Path(__file__).parent / "effects.txt", "a") as f:
        f.write(path + "\\n")
    return "removed " + path
'''


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    return pexpect.spawn(
        CLI[0],
        [*CLI[1:], "run", "-c", str(tmp_path / "agent.yaml"), "--state-dir", "s", *args],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=HANG,
        dimensions=(50, 200),
    )


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return int(child.exitstatus)


def test_ctrl_c_at_the_approval_prompt_leaves_it_pending(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    (tmp_path / "rm_tools.py").write_text(TOOLS)
    (tmp_path / "agent.yaml").write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "tools: [{python: 'rm_tools:rm', tags: [ai:confirm]}]\n"
    )
    api.add(Reply.tool_use("rm", {"path": "/tmp/x"}, id="toolu_1"), Reply.text("removed it"))
    child = spawn(tmp_path, "--checkpoint", "--name", "gated", "remove /tmp/x")
    child.expect_exact("[o]nce / [a]lways / [N]o: ")
    child.sendintr()  # Ctrl-C, as the terminal sends it
    assert finish(child) == 0  # suspended is a clean stop
    records = FileStore(tmp_path / "s").load("gated")
    assert [type(r).__name__ for r in records[1:]] == [
        "Assistant",
        "ApprovalRequested",
        "Terminal",
    ]
    assert isinstance(records[2], ApprovalRequested) and records[2].tool_use_id == "toolu_1"
    assert isinstance(records[3], Terminal) and records[3].reason == "suspended"
    assert fold(records).state == "awaiting_approval"
    assert not (tmp_path / "effects.txt").exists()

    child = spawn(tmp_path, "--resume", "gated")
    child.expect_exact("[o]nce / [a]lways / [N]o: ")  # asked again, not denied
    child.sendline("o")
    child.expect_exact("removed it")
    assert finish(child) == 0
    assert (tmp_path / "effects.txt").read_text() == "/tmp/x\n"
    records = FileStore(tmp_path / "s").load("gated")
    answers = [r for r in records if isinstance(r, ApprovalAnswered)]
    assert [(a.tool_use_id, a.answer) for a in answers] == [("toolu_1", "once")]
    result = next(r for r in records if isinstance(r, ToolResult))
    assert result.result["content"] == "removed /tmp/x"
    assert fold(records).status == "completed"
    assert len(api.requests) == 2  # the turn was never asked for again

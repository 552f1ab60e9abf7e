"""Text that cannot be encoded as UTF-8 (invalid UTF-8, a lone surrogate) has one rule per
channel (`fisk_sm.config.text`):

- from a person (a prompt on argv, a chat line on a terminal or stdin, an answer at the
  approval prompt, `Supervisor.say` or `submit`): refused with one line; the chat (or the
  question) asks again, nothing is sent or journaled, and the session stays resumable;
- from a tool or an existing journal: replaced with U+FFFD before it is journaled or sent, so
  that the SDK (a strict UTF-8 request encoder) never sees a surrogate.

Real processes on a real pty (pexpect) and on pipes, the real SDK against the fake API, real
journals.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from ctlkit import http

from fisk_sm.config.agent import load_config
from fisk_sm.config.text import UnencodableText, refuse_unencodable, scrub, scrub_json
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult, User
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.api import build_app
from fisk_sm.supervisor.api.server import bind, serve_app, url_of
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
HANG = 60  # a guard against a hang, far above what any machine needs
REFUSED = "holds text that cannot be encoded (invalid UTF-8 or a lone surrogate)"
#: Bytes a person may type that are not UTF-8: stray bytes, and U+D800 as UTF-8 would spell it
#: (a strict decoder refuses it; `surrogateescape` keeps it as three lone surrogates).
NOT_UTF8 = (b"bad \xff\xfe bytes", b"\xed\xa0\x80")
TOOLS = '''
def rm(path: str) -> str:
    """Remove a path (pretend).

    Args:
        path: what to remove
    """
    return "removed " + path


def odd(what: str) -> str:
    """Return text holding a lone surrogate (a Python str may).

    Args:
        what: anything
    """
    return "a\\ud800b " + what
'''


@pytest.fixture
def agent(tmp_path: Path, api: FakeMessagesAPI) -> Path:
    (tmp_path / "odd_tools.py").write_text(TOOLS)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n"
        "tools: [{python: 'odd_tools:odd'}, {python: 'odd_tools:rm', tags: ['ai:confirm']}]\n"
    )
    return path


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return {**env, "ANTHROPIC_API_KEY": "test", "PROMPT_TOOLKIT_NO_CPR": "1"}


def cli(tmp_path: Path, *args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    # a strict stdin, as under a UTF-8 locale (the C locale gives a lenient one)
    env = {**environment(), "PYTHONIOENCODING": "utf-8:strict"}
    done = subprocess.run(
        [*CLI, *args], input=stdin, cwd=tmp_path, env=env, capture_output=True, timeout=HANG
    )
    out, err = (b.decode("utf-8", "replace") for b in (done.stdout, done.stderr))
    return subprocess.CompletedProcess(done.args, done.returncode, out, err)


def journal_text(tmp_path: Path, name: str) -> str:
    return (tmp_path / "st" / f"{name}.json").read_bytes().decode("utf-8")  # strict: valid UTF-8


def last_user_texts(api: FakeMessagesAPI) -> list[object]:
    return [r["messages"][-1]["content"] for r in api.requests]


def test_chat_on_a_terminal_refuses_unencodable_lines_asks_again_and_resumes(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("first answer"), Reply.text("second answer"), Reply.text("third answer"))
    journaled = ["--state-dir", "st"]

    def spawn(*args: str) -> pexpect.spawn:
        argv = [*CLI[1:], "chat", "-c", str(agent), *journaled, *args]
        return pexpect.spawn(
            CLI[0], argv, cwd=str(tmp_path), env=environment(), encoding="utf-8",
            codec_errors="replace", timeout=HANG, dimensions=(50, 200),
        )  # fmt: skip

    child = spawn("--checkpoint", "--name", "talk")
    try:
        child.expect_exact("you>")
        child.sendline("hello")
        child.expect_exact("first answer")
        child.expect_exact("you>")
        for typed in NOT_UTF8:
            os.write(child.child_fd, typed + b"\r")
            child.expect_exact(f"fisk-sm: line: {REFUSED}; not sent, type it again")
            child.expect_exact("you>")
        child.sendline("ordinary")
        child.expect_exact("second answer")
        child.expect_exact("you>")
        child.sendeof()  # a journaled chat ends suspended, resumable
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert last_user_texts(api) == ["hello", "ordinary"]
    assert "bytes" not in journal_text(tmp_path, "talk")
    child = spawn("--resume", "talk")
    try:
        child.expect_exact("you>")
        child.sendline("again")
        child.expect_exact("third answer")
        child.expect_exact("you>")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert last_user_texts(api) == ["hello", "ordinary", "again"]
    assert len(api.requests[2]["messages"]) == 5  # the whole conversation, nothing refused in it


def test_an_answer_at_the_approval_prompt_that_is_not_utf8_is_asked_again(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("rm", {"path": "/x"}, id="toolu_rm"), Reply.text("cleaned"))
    env = {**environment(), "PYTHONIOENCODING": "utf-8:strict"}  # as under a UTF-8 locale
    child = pexpect.spawn(
        CLI[0], [*CLI[1:], "run", "-c", str(agent), "clean up"], cwd=str(tmp_path), env=env,
        encoding="utf-8", codec_errors="replace", timeout=HANG,
    )  # fmt: skip
    try:
        for typed in (*NOT_UTF8, b"o"):
            child.expect_exact("[o]nce / [a]lways / [N]o: ")
            os.write(child.child_fd, typed + b"\r")
            if typed != b"o":
                child.expect_exact(f"answer: {REFUSED}; type it again")
        child.expect_exact("cleaned")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    result = {"type": "tool_result", "tool_use_id": "toolu_rm", "content": "removed /x"}
    assert api.requests[1]["messages"][-1]["content"] == [result]  # approved once: it ran


def test_chat_from_stdin_refuses_unencodable_lines_and_goes_on(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("one"), Reply.text("two"), Reply.text("three"))
    lines = [b"\xff first?", b"hello", *NOT_UTF8, b"ordinary"]
    done = cli(
        tmp_path, "chat", "-c", str(agent), "--checkpoint", "--name", "piped", "--state-dir", "st",
        stdin=b"\n".join(lines) + b"\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(REFUSED) == 3  # one line each, then the next line is read
    assert "Traceback" not in done.stderr
    assert last_user_texts(api) == ["hello", "ordinary"]
    records = FileStore(tmp_path / "st").load("piped")
    assert [r.message["content"] for r in records if isinstance(r, User)] == ["ordinary"]
    resumed = cli(tmp_path, "chat", "-c", str(agent), "--state-dir", "st", "--resume", "piped",
                  stdin=b"\xed\xa0\x80\nmore\n")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "three\n"
    assert last_user_texts(api) == ["hello", "ordinary", "more"]


@pytest.mark.parametrize("command", ["run", "step"])
def test_an_argv_prompt_that_is_not_utf8_is_refused_with_one_line(
    command: str, agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    done = cli(tmp_path, command, "-c", str(agent), "--checkpoint", "--state-dir", "st",
               "say", b"\xed\xa0\x80 \xff")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"fisk-sm: prompt: {REFUSED}\n"
    assert api.requests == []
    assert not list((tmp_path / "st").glob("*.json"))  # nothing journaled


def test_a_python_tool_returning_a_lone_surrogate_is_journaled_and_sent_as_fffd(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.tool_use("odd", {"what": "x"}, id="toolu_1"), Reply.text("done"))
    done = cli(tmp_path, "run", "-c", str(agent), "--checkpoint", "--name", "t",
               "--state-dir", "st", "go")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    text = journal_text(tmp_path, "t")
    assert "\\ud800" not in text and "a\ufffdb x" in text
    [result] = [r for r in FileStore(tmp_path / "st").load("t") if isinstance(r, ToolResult)]
    assert result.result["content"] == "a\ufffdb x"
    sent = api.requests[1]["messages"][-1]["content"]
    assert sent == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\ufffdb x"}]


def test_a_journal_holding_a_lone_surrogate_escape_resumes_and_sends_fffd(
    agent: Path, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.text("first answer"), Reply.text("second answer"))
    done = cli(tmp_path, "chat", "-c", str(agent), "--checkpoint", "--name", "old",
               "--state-dir", "st", stdin=b"hello\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = tmp_path / "st" / "old.json"
    # as an older build wrote a lone surrogate (or a hand edit): a \u escape in a JSON line
    body = path.read_bytes()
    assert body.count(b'"text":"first answer"') == 1
    path.write_bytes(body.replace(b'"text":"first answer"', b'"text":"first \\ud800 answer"'))
    resumed = cli(tmp_path, "chat", "-c", str(agent), "--state-dir", "st", "--resume", "old",
                  stdin=b"next\n")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "second answer\n"
    assert api.requests[1]["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "first \ufffd answer"}],
    }
    journal_text(tmp_path, "old")  # still valid UTF-8: the old line is kept, new ones are clean


async def test_supervisor_say_and_submit_refuse_unencodable_text_and_the_chat_goes_on(
    tmp_path: Path, api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    path = tmp_path / "agent.yaml"
    path.write_text(f"llm: {{model: m, base_url: '{api.base_url}', no_prompt_cache: true}}\n")
    api.add_conversation("hello", Reply.text("one"), Reply.text("two"))
    store = FileStore(tmp_path / "state")
    sup = Supervisor(load_config(path), store)
    await sup.start()
    sock = bind("127.0.0.1", 0)
    server, serving = await serve_app(build_app(sup), sock)
    try:
        with pytest.raises(UnencodableText, match=f"^prompt: {re.escape(REFUSED)}$"):
            await sup.submit_chat("hi \ud800")
        assert not sup.runs
        tracked = await sup.submit_chat("hello")
        run_id = tracked.entry.run_id

        async def at_input(turns: int) -> None:
            end = asyncio.get_running_loop().time() + HANG
            while len(api.requests) != turns or sup.get(run_id).state != "awaiting_input":
                assert asyncio.get_running_loop().time() < end, "gave up waiting"
                await asyncio.sleep(0.01)

        await at_input(1)
        for text in ("\ud800", "ok \udced\udca0\udc80"):
            with pytest.raises(UnencodableText, match=f"^text: {re.escape(REFUSED)}$"):
                await sup.say(run_id, text)
        url = f"{url_of(sock)}/api/runs/{run_id}"
        status, body = await asyncio.to_thread(http, "GET", url)
        assert (status, body["state"]) == (200, "awaiting_input")
        await sup.say(run_id, "more")
        await at_input(2)
        status, body = await asyncio.to_thread(http, "GET", url)
        assert (status, body["state"]) == (200, "awaiting_input")
    finally:
        server.should_exit = True
        await serving
        await sup.shutdown()
    assert last_user_texts(api) == ["hello", "more"]
    said = [r.message["content"] for r in store.load(run_id) if isinstance(r, User)]
    assert said == ["more"]


def test_the_rule_itself() -> None:
    assert scrub("a\ud800b\udfff") == "a\ufffdb\ufffd"
    plain = "naïve 😀"
    assert scrub(plain) is plain
    value = {"k\udc80": ["x", {"t": "\ud83d"}], "n": 1}
    assert scrub_json(value) == {"k\ufffd": ["x", {"t": "\ufffd"}], "n": 1}
    clean = {"a": ["b", {"c": 1}]}
    assert scrub_json(clean) is clean
    assert refuse_unencodable(plain, "f") is plain
    with pytest.raises(UnencodableText, match=f"^f: {re.escape(REFUSED)}$"):
        refuse_unencodable("\udcff", "f")

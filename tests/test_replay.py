"""Replay: `fisk-sm run --replay ID` and the replay API, against sessions recorded for real.

Each test records a session first, with the real CLI against the fake Messages API: two tool
turns (a Python tool that appends to a side-effect file), then an answer. The replays then run
with the fake API closed, so any HTTP request would fail the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from fisk_sm.config.agent import load_config, parse_config
from fisk_sm.journal.base import MemoryJournal
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Meta, ToolResult
from fisk_sm.loop.harness import RunOptions
from fisk_sm.loop.replay import ReplayDiverged, ReplayModel, recorded_tools, replay
from fisk_sm.loop.run import Run
from fisk_sm.loop.sessions import start_session
from fisk_sm.model.blocks import message_of
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import tool

CLI = [sys.executable, "-m", "fisk_sm.cli"]
TOOLS = '''
from pathlib import Path

def mark(label: str) -> str:
    """Append label to the side-effect file."""
    with (Path(__file__).parent / "effects.txt").open("a") as f:
        f.write(label + "\\n")
    return "marked " + label
'''
SYSTEM = "You mark things."


@attrs.frozen
class Recording:
    """A session recorded by `fisk-sm run --checkpoint --name rec`, and where it lives."""

    agent: Path
    state: Path
    effects: Path
    events: Path
    answer: str

    def replay(self, *flags: str, agent: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`fisk-sm run --replay rec` with `flags`, its events in replay.jsonl."""
        events = self.events.with_name("replay.jsonl")
        config = str(agent or self.agent)
        where = ["--state-dir", str(self.state), "--events", str(events)]
        return fisk("run", "-c", config, *where, "--replay", "rec", *flags)


def fisk(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `fisk-sm` command, as a subprocess."""
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)


def states(events: Path) -> list[str]:
    """The states a run entered, in order, from its `--events` file."""
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return [e["state"] for e in lines if e["event"] == "state_entered"]


def write_agent(path: Path, base_url: str, system: str = SYSTEM) -> Path:
    """An agent.yaml with the `mark` tool, pointed at `base_url`."""
    path.write_text(
        f"system_prompt: {system}\n"
        f"llm: {{model: m, base_url: '{base_url}'}}\n"
        "tools: [{python: 'effect_tools:mark'}]\n"
    )
    return path


@pytest.fixture
def recording(tmp_path: Path) -> Recording:
    """Record session `rec` with the CLI, then close the fake API: replays must not need it."""
    (tmp_path / "effect_tools.py").write_text(TOOLS)
    script = [
        Reply.tool_use("mark", {"label": "a"}),
        Reply.tool_use("mark", {"label": "b"}),
        Reply.text("marked both"),
    ]
    with FakeMessagesAPI(script) as api:
        agent = write_agent(tmp_path / "agent.yaml", api.base_url)
        events = tmp_path / "record.jsonl"
        where = ["--state-dir", str(tmp_path / "state"), "--events", str(events)]
        recorded = fisk("run", "-c", str(agent), "--checkpoint", "--name", "rec", *where, "go")
        assert recorded.returncode == 0, recorded.stderr
        assert len(api.requests) == 3
    effects = tmp_path / "effects.txt"
    assert effects.read_text() == "a\nb\n"
    return Recording(agent, tmp_path / "state", effects, events, recorded.stdout.strip())


def test_recorded_replay_calls_no_model_runs_no_tool_and_walks_the_same_states(
    recording: Recording,
) -> None:
    replayed = recording.replay()
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.strip() == recording.answer == "marked both"
    assert recording.effects.read_text() == "a\nb\n"  # the tool did not run again
    assert "-> mark" in replayed.stderr  # the calls are shown as in a normal run
    replay_events = recording.events.with_name("replay.jsonl")
    assert states(replay_events) == states(recording.events)
    assert len(states(replay_events)) > 10


def test_a_changed_system_prompt_diverges_at_iteration_0(recording: Recording) -> None:
    changed = write_agent(recording.agent.with_name("changed.yaml"), "http://127.0.0.1:9", "Hi.")
    replayed = recording.replay(agent=changed)
    assert replayed.returncode == 1
    assert (
        "failed: replay diverged at iteration 0: the system prompt differs from the recording"
        in replayed.stderr
    )
    assert recording.effects.read_text() == "a\nb\n"


def test_live_tools_run_again_and_a_changed_result_diverges(recording: Recording) -> None:
    replayed = recording.replay("--replay-tools", "live")
    assert replayed.returncode == 0, replayed.stderr
    assert recording.effects.read_text() == "a\nb\na\nb\n"
    # A live tool whose result is not the recorded one: the next request departs.
    tools = recording.agent.with_name("effect_tools.py")
    tools.write_text(TOOLS.replace('"marked " + label', '"now " + label'))
    replayed = recording.replay("--replay-tools", "live")
    assert replayed.returncode == 1
    assert "failed: replay diverged at iteration 1: message 2 differs" in replayed.stderr


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--replay", "rec", "a prompt"], "--replay runs the recorded prompt; it takes no prompt"),
        (["--replay", "rec", "--checkpoint"], "--replay and --checkpoint cannot be combined"),
        (["--replay-tools", "live", "hi"], "--replay-tools needs --replay"),
        (["--replay", "../x"], "session id"),
    ],
)
def test_bad_replay_flags_exit_2(tmp_path: Path, flags: list[str], problem: str) -> None:
    agent = write_agent(tmp_path / "agent.yaml", "http://127.0.0.1:9")
    result = fisk("run", "-c", str(agent), *flags)
    assert result.returncode == 2
    assert problem in result.stderr


async def test_a_recorded_session_is_a_regression_test(recording: Recording) -> None:
    """The example to copy: a session recorded by `fisk-sm run --checkpoint --name rec` turns
    into a test that runs offline, fails on any change to the prompt, the tools or the
    conversation, and checks the answer."""
    config = load_config(recording.agent)
    records = FileStore(recording.state).load("rec")
    async with replay(config, records) as run:
        assert await run.run() == "completed", run.outcome
        assert run.answer() == "marked both"
    assert recording.effects.read_text() == "a\nb\n"


async def test_tools_in_code_replay_through_run_create(tmp_path: Path) -> None:
    """The lower-level form: `ReplayModel` and `recorded_tools` in `RunOptions`, and a recorded
    is_error result comes back as is_error."""
    effects: list[str] = []

    @tool
    def mark(label: str) -> str:
        """Mark `label`; refuses "x"."""
        if label == "x":
            raise ValueError("no x")
        effects.append(label)
        return f"marked {label}"

    script = [
        Reply.tool_use("mark", {"label": "x"}),
        Reply.tool_use("mark", {"label": "a"}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(script) as api:
        config = parse_config({"llm": {"model": "m", "base_url": api.base_url}}, env={})
        options = RunOptions(tools=[mark])
        async with await start_session(config, "go", FileStore(tmp_path), options) as recorded:
            assert await recorded.run() == "completed"
    records = FileStore(tmp_path).load(recorded.data.run_id)
    assert effects == ["a"]

    meta = records[0]
    assert isinstance(meta, Meta)
    model = ReplayModel.from_records(records)
    journal = MemoryJournal()
    options = RunOptions(model=model, tools=recorded_tools(records, [mark]), journal=journal)
    async with Run.create(config, meta.prompt, options) as run:
        assert await run.run() == "completed", run.outcome
        assert run.answer() == "done"
    replayed = [r for r in journal.records if isinstance(r, ToolResult)]
    assert effects == ["a"]
    original = [r for r in records if isinstance(r, ToolResult)]
    assert [(r.result, r.is_error) for r in replayed] == [(r.result, r.is_error) for r in original]
    assert replayed[0].is_error
    assert model.calls == 3

    # The recording had no system prompt: a replay that adds one departs at once.
    llm = {"model": "m", "base_url": "http://127.0.0.1:9"}
    changed = parse_config({"system_prompt": "New.", "llm": llm}, env={})
    options = RunOptions(model=ReplayModel.from_records(records))
    async with Run.create(changed, meta.prompt, attrs.evolve(options, tools=[mark])) as run:
        assert await run.run() == "failed"
    assert run.outcome == (
        "replay diverged at iteration 0: the system prompt differs from the recording"
    )


async def test_cache_breakpoints_are_ignored_and_a_call_past_the_recording_diverges(
    recording: Recording,
) -> None:
    records = FileStore(recording.state).load("rec")
    async with replay(load_config(recording.agent), records) as run:
        assert await run.run() == "completed", run.outcome
    before_answer = run.harness.request(list(run.data.messages[:-1]))
    caching = attrs.evolve(before_answer, cache_ttl="5m")
    sent = attrs.evolve(caching, messages=[message_of(m) for m in caching.params()["messages"]])
    assert "cache_control" in sent.messages[-1].to_json()["content"][-1]
    model = ReplayModel.from_records(records)
    model.calls = 2  # the request of iteration 2, as the SDK would get it
    reply = await model.create(sent)
    assert reply["content"] == [{"type": "text", "text": "marked both"}]
    after = run.harness.request(list(run.data.messages))
    ends = r"^replay diverged at iteration 3: the recording ends after 3 model call\(s\)$"
    with pytest.raises(ReplayDiverged, match=ends):
        await model.create(after)

"""Shared fixtures: a loopback fake Messages API and runs wired to it through the real SDK, and a
group-commit writer of a test's own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import natskit
import pytest
from nats.aio.client import Client

from fisk_sm import AgentConfig, MemoryJournal, Recorder, Run, Tool, parse_config
from fisk_sm.journal import filejournal
from fisk_sm.journal.writer import GroupCommitWriter
from fisk_sm.loop.harness import RunOptions
from fisk_sm.operator.prompter import Prompter
from fisk_sm.testing import FakeMessagesAPI

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> GroupCommitWriter:
    """A group-commit writer of the test's own, standing in for the process's shared one."""
    mine = GroupCommitWriter()
    monkeypatch.setattr(filejournal, "shared_writer", lambda: mine)
    return mine


def make_config(api: FakeMessagesAPI, **budget: Any) -> AgentConfig:
    """A config pointed at the fake API, with budget overrides.

    Prompt caching is off, so that tests can compare the requests the fake API received with the
    conversation itself; tests/test_prompt_cache.py covers the breakpoints.
    """
    llm = {"model": "claude-test", "base_url": api.base_url, "budget": budget}
    return parse_config(
        {"system_prompt": "You are a test agent.", "llm": {**llm, "no_prompt_cache": True}},
        env={},
    )


def make_run(
    api: FakeMessagesAPI,
    tools: list[Tool] | None = None,
    *,
    prompter: Prompter | None = None,
    **budget: Any,
) -> tuple[Run, Recorder, MemoryJournal]:
    """A run against the fake API with a recorder and an in-memory journal (and `prompter`
    as its operator, if given: none by default)."""
    events, journal = Recorder(), MemoryJournal()
    options = RunOptions(tools=tools or [], events=events, journal=journal, prompter=prompter)
    run = Run.create(make_config(api, **budget), "do the thing", options, run_id="test-run")
    return run, events, journal


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A real loopback nats-server with JetStream, for this test (`natskit`)."""
    with natskit.nats_server(tmp_path) as url:
        yield url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A connection to it (the agent's, where a test needs a second one of its own)."""
    client = await nats.connect(nats_url)
    yield client
    await client.close()


#: The timeout of a test marked slow (the default, `timeout` in pyproject.toml, is for the rest).
SLOW_TIMEOUT = 600


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-tui-snapshots",
        action="store_true",
        help="rewrite tests/snapshots/tui/*.svg from the screens drawn (tests/tuikit.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give slow tests the longer timeout, unless a test sets its own."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))

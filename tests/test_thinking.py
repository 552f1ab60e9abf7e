"""`llm.thinking` per model: its YAML forms, the model table, the request the API receives, the
one line for a 400 the setting caused, and old sessions resuming (issue 22, items 10 and 11).

Real parts: YAML files read by `load_config`, the real SDK over loopback to the fake Messages
API, the `fisk-sm` command in a subprocess, the compatibility fixtures resumed by the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_compat_fixtures import copied, finished, resume

from fisk_sm import MemoryJournal, Run, load_config
from fisk_sm.config.agent import ConfigError
from fisk_sm.loop.fingerprint import fingerprint
from fisk_sm.loop.harness import Harness, RunOptions
from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
ADAPTIVE = {"type": "adaptive", "display": "summarized"}


def budget(tokens: int) -> dict[str, Any]:
    """The request's `thinking` for a budget of `tokens`."""
    return {"type": "enabled", "budget_tokens": tokens}


BUDGET_8192 = budget(8192)


def agent(tmp_path: Path, model: str, thinking: str | None, extra: str = "") -> Path:
    """An agent.yaml for `model`, with `thinking:` written as given (YAML text), if any."""
    lines = ["llm:", f"  model: {model}", "  no_prompt_cache: true"]
    if thinking is not None:
        lines.append(f"  thinking: {thinking}")
    path = tmp_path / "agent.yaml"
    path.write_text("\n".join([*lines, extra]) + "\n")
    return path


@pytest.mark.parametrize(
    ("thinking", "model", "label"),
    [
        (None, "claude-opus-4-6", "off"),  # unset stays off, as before: no drift, no new cost
        ("off", "claude-opus-4-6", "off"),  # YAML reads a bare `off` as false
        ("'off'", "claude-opus-4-6", "off"),
        ("on", "claude-opus-4-6", "adaptive"),
        ("on", "claude-sonnet-4-5-20250929", "budget_tokens=8192"),
        ("adaptive", "claude-sonnet-4-5", "adaptive"),  # the config overrides the table
        ("{budget_tokens: 2048}", "claude-opus-4-6", "budget_tokens=2048"),
        ("{enabled: true}", "claude-x", "adaptive"),  # the old form, as it always was
        ("{enabled: true}", "claude-sonnet-4-6", "adaptive"),
        ("{enabled: true}", "claude-haiku-4-5", "budget_tokens=8192"),
        ("{enabled: false}", "claude-opus-4-6", "off"),
        ("{enabled: false, budget_tokens: 2048}", "claude-opus-4-6", "off"),
        ("{}", "claude-opus-4-6", "off"),  # the old empty mapping was off
    ],
)
def test_each_form_resolves_for_the_model(
    tmp_path: Path, thinking: str | None, model: str, label: str
) -> None:
    config = load_config(agent(tmp_path, model, thinking), env={})
    assert config.llm.resolved_thinking.label == label
    assert fingerprint(Harness.build(config, RunOptions()))["thinking"] == label


@pytest.mark.parametrize(
    ("thinking", "model", "extra", "line"),
    [
        ("sometimes", "m", "", "llm.thinking: expected off, on, adaptive or {budget_tokens: N}"),
        ("7", "m", "", "llm.thinking: expected off, on, adaptive or {budget_tokens: N}, got 7"),
        ("{enabled: maybe}", "m", "", "llm.thinking.enabled: expected a boolean, got 'maybe'"),
        ("{budget_tokens: 100}", "m", "", "llm.thinking.budget_tokens: expected an integer of"),
        ("{budget_tokens: lots}", "m", "", "llm.thinking.budget_tokens: expected an integer"),
        ("{adaptive: true}", "m", "", "llm.thinking.adaptive: unknown key"),
        ("on", "claude-3-5-haiku-20241022", "", "llm.thinking: model claude-3-5-haiku-20241022"),
        (
            "{budget_tokens: 4096}",
            "m",
            "  budget: {max_output_tokens: 4000}",
            "llm.thinking: budget_tokens 4096 needs llm.budget.max_output_tokens above it",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field(
    tmp_path: Path, thinking: str, model: str, extra: str, line: str
) -> None:
    path = agent(tmp_path, model, thinking, extra)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {line}")


def test_the_cli_refuses_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    path = agent(tmp_path, "m", "sometimes")
    env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
    done = subprocess.run(
        [*CLI, "run", "-c", str(path), "hi"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if "llm.thinking" in x]
    assert f"{path}: llm.thinking: expected off, on, adaptive" in line


async def run_once(api: FakeMessagesAPI, path: Path) -> tuple[Run, str]:
    """A run of the config at `path` against `api`, to its end: the run and its outcome."""
    config = load_config(path, env={"ANTHROPIC_BASE_URL": api.base_url})
    run = Run.create(config, "think", RunOptions(journal=MemoryJournal()), run_id="thinking")
    return run, await run.run()


@pytest.mark.parametrize(
    ("model", "thinking", "extra", "sent", "max_tokens"),
    [
        # one model per row of the table, thinking on without a form: the row's form
        ("claude-opus-4-6", "on", "", ADAPTIVE, 16384),
        ("claude-sonnet-4-6-20260101", "on", "", ADAPTIVE, 16384),
        ("claude-opus-4-1-20250805", "on", "", BUDGET_8192, 16384),
        ("claude-sonnet-4-5", "{enabled: true}", "", BUDGET_8192, 16384),
        ("claude-haiku-4-5", "on", "", BUDGET_8192, 16384),
        ("claude-3-7-sonnet-latest", "on", "", BUDGET_8192, 16384),
        ("claude-3-5-haiku-latest", "off", "", None, 8192),
        ("claude-unknown", "on", "", ADAPTIVE, 16384),
        # overrides: the config's form wins; a budget raises the automatic cap above it
        ("claude-sonnet-4-5", "adaptive", "", ADAPTIVE, 16384),
        ("claude-sonnet-4-5", "{budget_tokens: 12000}", "", budget(12000), 20192),
        (
            "claude-x",
            "{budget_tokens: 2048}",
            "  budget: {max_output_tokens: 3000}",
            budget(2048),
            3000,
        ),
        ("claude-opus-4-6", None, "", None, 8192),
    ],
)  # fmt: skip
async def test_the_request_carries_the_models_thinking(
    tmp_path: Path,
    api: FakeMessagesAPI,
    model: str,
    thinking: str | None,
    extra: str,
    sent: dict[str, Any] | None,
    max_tokens: int,
) -> None:
    api.add(Reply.text("thought"))
    _, outcome = await run_once(api, agent(tmp_path, model, thinking, extra))
    assert outcome == "completed"
    [request] = api.requests
    assert request["model"] == model
    assert request.get("thinking") == sent
    assert request["max_tokens"] == max_tokens


REFUSAL = "adaptive thinking is not supported on this model"


async def test_a_400_about_thinking_fails_the_run_with_one_line_naming_the_setting(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.error(400, REFUSAL))
    run, outcome = await run_once(api, agent(tmp_path, "claude-sonnet-4-5", "adaptive"))
    assert outcome == "failed"
    assert run.data.error == (
        f"llm.thinking: model claude-sonnet-4-5 refused adaptive thinking (400: {REFUSAL})"
    )
    assert api.requests[0]["thinking"] == ADAPTIVE


async def test_a_400_about_a_budget_names_the_budget(tmp_path: Path, api: FakeMessagesAPI) -> None:
    api.add(Reply.error(400, "thinking.budget_tokens: must be less than max_tokens"))
    run, outcome = await run_once(api, agent(tmp_path, "claude-opus-4-1", "{budget_tokens: 4096}"))
    assert outcome == "failed"
    assert run.data.error.startswith(
        "llm.thinking: model claude-opus-4-1 refused budget_tokens=4096 thinking (400: "
    )


async def test_a_400_about_something_else_is_not_blamed_on_thinking(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add(Reply.error(400, "messages.0.content: bad block"))
    run, outcome = await run_once(api, agent(tmp_path, "claude-opus-4-6", "adaptive"))
    assert outcome == "failed"
    assert run.data.error == "llm call: HTTP 400: messages.0.content: bad block"


def test_the_cli_prints_the_thinking_refusal_in_one_line(tmp_path: Path) -> None:
    path = agent(tmp_path, "claude-sonnet-4-5", "adaptive")
    with FakeMessagesAPI([Reply.error(400, REFUSAL)]) as api:
        env = {**os.environ, "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.base_url}
        done = subprocess.run(
            [*CLI, "run", "-c", str(path), "hi"], capture_output=True, text=True, env=env,
            timeout=60,
        )  # fmt: skip
        assert api.requests[0]["thinking"] == ADAPTIVE
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    line = f"llm.thinking: model claude-sonnet-4-5 refused adaptive thinking (400: {REFUSAL})"
    assert [x for x in done.stderr.splitlines() if "llm.thinking" in x] == [f"failed: {line}"]


@pytest.mark.parametrize("spelling", ["off", "'off'", "{enabled: false}"])
def test_an_old_session_resumes_with_its_thinking_spelled_the_new_way(
    tmp_path: Path, api: FakeMessagesAPI, spelling: str
) -> None:
    """A compatibility fixture (started with thinking off, unset) resumes without --force when
    its agent.yaml says `thinking: off` in any spelling: the fingerprint is unchanged."""
    where = copied("mid_batch", tmp_path)
    yaml = where / "agent.yaml"
    old = "llm: {model: claude-compat, no_prompt_cache: true}"
    assert yaml.read_text().startswith(old)
    yaml.write_text(yaml.read_text().replace(old, old[:-1] + f", thinking: {spelling}}}", 1))
    recorded = json.loads((where / "fingerprint.txt").read_text())
    config = load_config(yaml, env={})
    assert fingerprint(Harness.build(config, RunOptions())) == recorded
    resume(where, api, "run")
    assert all("thinking" not in request for request in api.requests)
    finished("mid_batch", where)

"""Tests for fisk_sm.config.agent: loading agent.yaml into frozen attrs classes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest

from fisk_sm.config.agent import (
    AgentConfig,
    Budget,
    ConfigError,
    LLMConfig,
    Thinking,
    ToolSpec,
    check_base_url,
    load_config,
    parse_config,
    parse_duration,
)

NO_ENV: dict[str, str] = {}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=NO_ENV if env is None else env)
    err = info.value
    assert "\n" not in str(err) and "\r" not in str(err)
    assert str(err) == f"{path}: {err.field}: {err.problem}"
    assert err.source == str(path)
    return err


def test_defaults_applied(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "llm:\n  model: claude-x\n"), env=NO_ENV)
    assert config.llm == LLMConfig(model="claude-x")
    assert config.llm.provider == "anthropic"
    assert config.llm.base_url is None
    assert config.llm.budget == Budget(200_000, 50, 120.0, 0)
    assert config.llm.thinking == Thinking(enabled=False)
    assert (config.system_prompt, config.identity, config.tools) == ("", "fisk-sm", ())
    assert config.path == (tmp_path / "agent.yaml").absolute()
    assert config.base_dir == tmp_path.absolute()


def test_full_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        llm:
          model: claude-x
          base_url: https://proxy.example.com/v1
          budget: {max_tokens: 1000, max_iterations: 3, call_timeout: 1m30s, max_output_tokens: 77}
          thinking: {enabled: true}
        system_prompt: Be brief.
        identity: my_agent-1
        tools:
          - python: tools.files:read_file
          - {python: pkg.mod:run, crash_policy: ask}
        """,
    )
    config = load_config(path, env=NO_ENV)
    assert config.llm.base_url == "https://proxy.example.com/v1"
    assert config.llm.budget == Budget(1000, 3, 90.0, 77)
    assert config.llm.thinking.enabled is True
    assert config.system_prompt == "Be brief."
    assert config.identity == "my_agent-1"
    assert config.tools == (
        ToolSpec("tools.files:read_file", "retry"),
        ToolSpec("pkg.mod:run", "ask"),
    )


def test_classes_are_frozen() -> None:
    config = parse_config({"llm": {"model": "m"}}, env=NO_ENV)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.identity = "x"  # type: ignore[misc]
    assert AgentConfig(llm=LLMConfig(model="m")).base_dir == Path.cwd()


def test_zero_means_default(tmp_path: Path) -> None:
    path = write(tmp_path, "llm:\n  model: m\n  budget: {max_tokens: 0, max_iterations: 0}\n")
    budget = load_config(path, env=NO_ENV).llm.budget
    assert (budget.max_tokens, budget.max_iterations) == (200_000, 50)


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("llm:\n  model: m\n  budgett: {}\n", "llm.budgett", "unknown key"),
        ("llm:\n  model: m\n  budget: {max_tokenz: 1}\n", "llm.budget.max_tokenz", "unknown key"),
        ("llm: {model: m}\nextra: 1\n", "extra", "unknown key"),
        ("llm: {model: m}\npath: /x\n", "path", "unknown key"),
        ("llm: {model: m}\ntools: [{python: 'a:b', when: x}]\n", "tools[0].when", "unknown key"),
        ("system_prompt: hi\n", "llm.model", "required"),
        ("llm:\n  provider: anthropic\n", "llm.model", "required"),
        ("llm: {model: ''}\n", "llm.model", "must not be empty"),
        ("llm: m\n", "llm", "expected a mapping, got 'm'"),
        (
            "llm:\n  model: m\n  budget: {max_tokens: abc}\n",
            "llm.budget.max_tokens",
            "expected an integer, got 'abc'",
        ),
        (
            "llm:\n  model: m\n  budget: {max_iterations: true}\n",
            "llm.budget.max_iterations",
            "expected an integer, got True",
        ),
        (
            "llm:\n  model: m\n  budget: {max_tokens: -1}\n",
            "llm.budget.max_tokens",
            "must not be negative",
        ),
        (
            "llm:\n  model: m\n  budget: {max_iterations: -5}\n",
            "llm.budget.max_iterations",
            "must not be negative",
        ),
        (
            "llm:\n  model: m\n  budget: {max_output_tokens: -1}\n",
            "llm.budget.max_output_tokens",
            "must not be negative",
        ),
        (
            "llm:\n  model: m\n  thinking: {enabled: maybe}\n",
            "llm.thinking.enabled",
            "expected a boolean, got 'maybe'",
        ),
        ("llm: {model: 42}\n", "llm.model", "expected a string, got 42"),
        ("llm: {model: m}\nsystem_prompt: [a]\n", "system_prompt", "expected a string"),
        ("llm: {model: m}\nidentity: 'has space'\n", "identity", "must match [a-zA-Z0-9_-]+"),
        ("llm: {model: m}\ntools: {python: 'a:b'}\n", "tools", "expected a list"),
        ("llm: {model: m}\ntools: ['a:b']\n", "tools[0]", "expected a mapping"),
        ("llm: {model: m}\ntools: [{crash_policy: fail}]\n", "tools[0]", "a tool needs"),
        (
            "llm: {model: m}\ntools: [{python: 'a:b'}, {python: nocolon}]\n",
            "tools[1].python",
            "expected 'module:function', got 'nocolon'",
        ),
        (
            "llm: {model: m}\ntools: [{python: 'a:b', crash_policy: explode}]\n",
            "tools[0].crash_policy",
            "must be one of",
        ),
        (
            "llm: {model: m, base_url: 'http://localhost.evil.com'}\n",
            "llm.base_url",
            "http:// is only allowed",
        ),
        ("- llm\n", "(top level)", "expected a mapping"),
    ],
)
def test_field_errors(tmp_path: Path, text: str, field: str, problem: str) -> None:
    err = load_error(tmp_path, text)
    assert err.field == field
    assert problem in err.problem
    assert f": {field}: " in str(err)


def test_unknown_key_message_exact(tmp_path: Path) -> None:
    err = load_error(tmp_path, "llm:\n  model: m\n  budgett: {}\n")
    assert str(err).endswith("agent.yaml: llm.budgett: unknown key")


def test_identity_rejects_trailing_newline() -> None:
    with pytest.raises(ConfigError, match="identity"):
        parse_config({"llm": {"model": "m"}, "identity": "abc\n"}, env=NO_ENV)


@pytest.mark.parametrize("value", ["abc", "'10'", "5 parsecs", "-1s", "-3", "''", "1.5x", "s"])
def test_bad_durations(tmp_path: Path, value: str) -> None:
    err = load_error(tmp_path, f"llm:\n  model: m\n  budget: {{call_timeout: {value}}}\n")
    assert err.field == "llm.budget.call_timeout"
    assert err.problem.startswith("invalid duration")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120s", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5s", 1.5), ("0", 0.0), ("45", 45.0)],
)
def test_call_timeout_values(tmp_path: Path, value: str, seconds: float) -> None:
    path = write(tmp_path, f"llm:\n  model: m\n  budget: {{call_timeout: {value}}}\n")
    assert load_config(path, env=NO_ENV).llm.budget.call_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2h", 7200.0),
        ("250us", 250e-6),
        ("250µs", 250e-6),
        ("10ns", 10e-9),
        ("1h1m1s", 3661.0),
        ("0", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "abc", "-1s", "1 s", "1s ", "1d", "1.5.2s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_env_base_url_used(tmp_path: Path) -> None:
    path = write(tmp_path, "llm: {model: m}\n")
    env = {"ANTHROPIC_BASE_URL": "http://127.0.0.2:8080"}
    assert load_config(path, env=env).llm.base_url == "http://127.0.0.2:8080"
    assert load_config(path, env={"ANTHROPIC_BASE_URL": ""}).llm.base_url is None


def test_yaml_base_url_wins_over_env(tmp_path: Path) -> None:
    path = write(tmp_path, "llm: {model: m, base_url: 'https://a.example'}\n")
    env = {"ANTHROPIC_BASE_URL": "http://10.0.0.1"}
    assert load_config(path, env=env).llm.base_url == "https://a.example"


def test_env_base_url_validated(tmp_path: Path) -> None:
    err = load_error(tmp_path, "llm: {model: m}\n", env={"ANTHROPIC_BASE_URL": "http://10.0.0.1"})
    assert err.field == "llm.base_url (from ANTHROPIC_BASE_URL)"
    assert "http:// is only allowed" in err.problem


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://from-env.example")
    assert parse_config({"llm": {"model": "m"}}).llm.base_url == "https://from-env.example"


@pytest.mark.parametrize(
    "url",
    [
        "https://api.anthropic.com",
        "https://proxy.internal:8443/v1",
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://127.0.0.2:8080",
        "http://[::1]:9",
    ],
)
def test_base_url_accepted(url: str) -> None:
    assert check_base_url(url) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost.evil.com", "http:// is only allowed"),
        ("http://10.0.0.1", "http:// is only allowed"),
        ("http://[::2]", "http:// is only allowed"),
        ("https://user:pw@api.example.com", "credentials"),
        ("http://user:pw@localhost", "credentials"),
        ("ftp://localhost", "scheme"),
        ("localhost:8080", "scheme"),
        ("https://", "no host"),
        ("https://exa mple.com", "whitespace"),
    ],
)
def test_base_url_refused(url: str, problem: str) -> None:
    result = check_base_url(url)
    assert result is not None and problem in result


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env=NO_ENV)
    assert info.value.field == "(file)"
    assert str(info.value) == f"{path}: (file): No such file or directory"


def test_yaml_syntax_error(tmp_path: Path) -> None:
    err = load_error(tmp_path, "llm:\n  model: [unclosed\n")
    assert err.field == "(yaml)"
    assert "line " in err.problem and "column " in err.problem


def test_empty_file_needs_model(tmp_path: Path) -> None:
    assert load_error(tmp_path, "").field == "llm.model"


def test_parse_config_default_source() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"llm": {"model": "m", "budget": {"max_tokens": "abc"}}}, env=NO_ENV)
    assert str(info.value) == "<config>: llm.budget.max_tokens: expected an integer, got 'abc'"


def test_config_error_is_one_line() -> None:
    err = ConfigError("a\nb.yaml", "x", "line1\nline2")
    assert "\n" not in str(err)
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("budget", "thinking", "cap"),
    [(Budget(), False, 8192), (Budget(), True, 16384), (Budget(max_output_tokens=500), True, 500)],
)
def test_output_cap(budget: Budget, thinking: bool, cap: int) -> None:
    assert LLMConfig(model="m", budget=budget, thinking=Thinking(thinking)).output_cap == cap

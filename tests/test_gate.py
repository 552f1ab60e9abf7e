"""The confirm gate and the prompters it asks through (REFERENCE §6 "Confirm gate", §9 6–8)."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Mapping
from typing import Any

import pytest

from fisk_sm.events.types import Recorder
from fisk_sm.operator.prompter import (
    Approval,
    ApprovalRequest,
    NoOperator,
    PromptCancelled,
    PromptError,
    ScriptedPrompter,
    TerminalPrompter,
)
from fisk_sm.operator.sanitize import sanitize, strip_control
from fisk_sm.tools.base import Outcome, Tool
from fisk_sm.tools.gate import Audit, Gate, denial

NO_OPERATOR = "no interactive terminal is attached, so no operator could be asked"
FINAL = "this decision is final, do not retry"


def make_tool(
    name: str = "deploy",
    tags: tuple[str, ...] = ("ai:confirm",),
    kind: str = "python",
    **extra: Any,
) -> Tool:
    return Tool(
        name, "a test tool", {"type": "object"}, lambda **_: "ok", tags=tags, kind=kind, **extra
    )


def argv_line(name: str, arguments: Mapping[str, Any]) -> str:
    """An exec tool's display: the command line, raw, as the model supplied it."""
    return " ".join(arguments["argv"])


def denial_reason(outcome: Outcome | None) -> str:
    assert outcome is not None, "the call was allowed"
    assert (outcome.is_error, outcome.warning) == (False, "")
    body = json.loads(outcome.content)
    assert body["allowed"] is False
    assert set(body) == {"allowed", "reason"}
    reason: str = body["reason"]
    return reason


AUDIT = Audit("run-1", "toolu_01", Recorder())


async def check(
    gate: Gate, tool: Tool, arguments: Mapping[str, Any], allowed: set[str] | None = None
) -> Outcome | None:
    """One call through the gate's two halves, as the `gate` and `awaiting_approval` states
    take it: None if it may run, else the denial handed to the model; an "always" answer adds
    the tool to `allowed` (the run's memory)."""
    allowed = set() if allowed is None else allowed
    verdict = gate.screen(tool, arguments, AUDIT, allowed)
    if verdict is None:
        return None
    if isinstance(verdict, str):
        return denial(verdict)
    answer, reason = await gate.ask(verdict, AUDIT)
    if answer is Approval.ALWAYS:
        allowed.add(tool.name)
    return denial(reason) if answer is Approval.NO else None


def asked(tool: str, display: str, tag: str = "ai:confirm", **arguments: Any) -> ApprovalRequest:
    return ApprovalRequest(
        tool, display, tag, run_id="run-1", tool_use_id="toolu_01", arguments=arguments
    )


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def is_safe(text: str) -> bool:
    return all(c in "\n\t" or (c >= " " and not "\x7f" <= c <= "\x9f") for c in text)


async def test_nobody_to_ask_is_a_non_error_denial() -> None:
    gate = Gate(NoOperator())
    outcome = await check(gate, make_tool(), {"env": "prod"})
    assert denial_reason(outcome) == NO_OPERATOR
    silent = ScriptedPrompter(available=False)
    assert denial_reason(await check(Gate(silent), make_tool(), {})) == NO_OPERATOR
    assert silent.asked == []


async def test_ungated_tool_runs_without_asking() -> None:
    prompter = ScriptedPrompter()
    assert await check(Gate(prompter, ["deploy"]), make_tool(tags=("read",)), {}) is None
    assert prompter.asked == []


async def test_once_allows_and_asks_again_next_time() -> None:
    prompter = ScriptedPrompter(approvals=[Approval.ONCE, Approval.ONCE])
    gate = Gate(prompter)
    assert await check(gate, make_tool(), {"env": "prod"}) is None
    assert await check(gate, make_tool(), {"env": "prod"}) is None
    request = asked("deploy", 'deploy {"env": "prod"}', env="prod")
    assert prompter.asked == [("approve", request), ("approve", request)]


async def test_always_is_remembered_by_tool_name_for_any_arguments() -> None:
    prompter = ScriptedPrompter(approvals=[Approval.ALWAYS, Approval.ONCE])
    gate = Gate(prompter)
    allowed: set[str] = set()
    assert await check(gate, make_tool(), {"env": "prod"}, allowed) is None
    assert await check(gate, make_tool(), {"env": "staging", "force": True}, allowed) is None
    assert len(prompter.asked) == 1
    # Another gated tool is still asked about.
    assert await check(gate, make_tool("drop_table"), {}, allowed) is None
    assert [r.tool for _, r in prompter.asked] == ["deploy", "drop_table"]
    assert allowed == {"deploy"}
    # The memory is the run's (`RunData.allowed`), not the gate's.
    with pytest.raises(AssertionError, match="unscripted approve"):
        await check(Gate(ScriptedPrompter()), make_tool(), {})


async def test_no_is_final_and_asks_again_next_time() -> None:
    prompter = ScriptedPrompter(approvals=[Approval.NO, Approval.ONCE])
    gate = Gate(prompter)
    reason = denial_reason(await check(gate, make_tool(), {}))
    assert "declined" in reason and "do not retry" in reason
    assert reason == f"the operator declined to permit this command; {FINAL}"
    assert await check(gate, make_tool(), {}) is None
    assert len(prompter.asked) == 2


async def test_prompt_errors_deny_without_remembering() -> None:
    prompter = ScriptedPrompter(
        approvals=[PromptError("stdin closed"), PromptCancelled("interrupted"), PromptError()]
    )
    gate = Gate(prompter)
    assert denial_reason(await check(gate, make_tool(), {})) == (
        f"the operator did not permit this command: stdin closed; {FINAL}"
    )
    with pytest.raises(PromptCancelled):  # no answer: the approval stays pending
        await check(gate, make_tool(), {})
    assert denial_reason(await check(gate, make_tool(), {})) == (
        f"the operator did not permit this command: PromptError; {FINAL}"
    )
    assert len(prompter.asked) == 3


async def test_confirm_tags_match_exactly_trimmed_and_deduplicated() -> None:
    gate = Gate(ScriptedPrompter(), [" deploy ", "deploy", "", "  ", "db"])
    assert gate.confirm_tags == ("deploy", "db")
    assert gate.gated_tag(make_tool(tags=("deploy",))) == "deploy"
    assert gate.gated_tag(make_tool(tags=("deploy-prod",))) is None
    assert gate.gated_tag(make_tool(tags=("Deploy",))) is None
    assert gate.gated_tag(make_tool(tags=("read", "db", "deploy"))) == "db"
    assert gate.gated_tag(make_tool(tags=("deploy", "ai:confirm"))) == "ai:confirm"
    assert gate.gated_tag(make_tool(tags=())) is None
    tools = [
        make_tool("a", tags=("deploy-prod",)),
        make_tool("b", tags=("db",)),
        make_tool("c", tags=("ai:confirm",)),
    ]
    assert gate.gated_tools(tools) == ["b", "c"]
    with pytest.raises(TypeError):
        Gate(NoOperator(), "deploy")


async def test_a_confirm_tag_gates_with_that_tag() -> None:
    prompter = ScriptedPrompter(approvals=[Approval.ONCE])
    gate = Gate(prompter, ["deploy"])
    assert await check(gate, make_tool("ship", tags=("deploy",)), {}) is None
    assert await check(gate, make_tool("ship_prod", tags=("deploy-prod",)), {}) is None
    assert prompter.asked == [("approve", asked("ship", "ship {}", "deploy"))]


def test_unmatched_tags_are_reported() -> None:
    gate = Gate(NoOperator(), ["deploy", "db", "ops"])
    tools = [
        make_tool("a", tags=("deploy",)),
        make_tool("b", tags=("db-admin",)),
        make_tool("r", tags=("ops",), kind="remote"),
    ]
    assert gate.unmatched_tags(tools) == ["db", "ops"]
    assert gate.unmatched_tags([]) == ["deploy", "db", "ops"]
    assert Gate(NoOperator()).unmatched_tags(tools) == []


async def test_remote_tools_are_never_gated_locally() -> None:
    remote = make_tool("remote_deploy", tags=("ai:confirm", "deploy"), kind="remote")
    prompter = ScriptedPrompter()
    gate = Gate(prompter, ["deploy"])
    assert gate.gated_tag(remote) is None
    assert await check(gate, remote, {}) is None
    assert await check(Gate(NoOperator(), ["deploy"]), remote, {}) is None
    assert prompter.asked == []
    assert gate.gated_tools([remote]) == []


async def test_display_is_one_sanitized_capped_line() -> None:
    prompter = ScriptedPrompter(approvals=[Approval.ONCE, Approval.ONCE, Approval.ONCE])
    gate = Gate(prompter)
    shell = make_tool("sh", display=argv_line)
    await check(gate, shell, {"argv": ["echo", "a\n\n  b", "x" * 3000]})
    await check(gate, shell, {"argv": ["echo", "\x1b]0;t\x07safe"]})

    def broken(name: str, arguments: Mapping[str, Any]) -> str:
        raise RuntimeError("renderer bug")

    await check(gate, make_tool("odd", display=broken), {"k": "v"})
    long, marked, fallback = (request.display for _, request in prompter.asked)
    assert long.startswith("echo a b xxx") and "\n" not in long
    assert len(long) == 2000 and long.endswith("…")
    assert marked == "echo safe [terminal control sequences removed]"
    assert fallback == 'odd {"k": "v"}'


async def test_model_escape_sequences_never_reach_the_approval_prompt() -> None:
    hostile = [
        "rm",
        "\x1b[31mred\x1b[0m",
        "\x1b]0;pwned\x07",
        "\x1b[2J",
        "\x9b2Jcsi8",
        "over\rwrite",
        "bell\x07",
        "\x1bPdcs\x1b\\",
        "\x1b]8;;http://evil\x1b\\link",
        "\x1b]unterminated",
        "\u202eevil",
        "del\x7f",
    ]
    out = FakeTTY()
    gate = Gate(TerminalPrompter(FakeTTY("a\n"), out))
    shell = make_tool("sh", display=argv_line)
    allowed: set[str] = set()
    assert await check(gate, shell, {"argv": hostile}, allowed) is None
    shown = out.getvalue()
    for bad in ("\x1b", "\x07", "\x9b", "\r", "\x7f", "\u202e", "pwned"):
        assert bad not in shown, repr(bad)
    assert is_safe(shown)
    for visible in ("sh: approve", "rm red", "csi8", "overwrite", "bell", "link", "unterminated"):
        assert visible in shown, visible
    assert "[ai:confirm]? [o]nce / [a]lways / [N]o: " in shown
    assert "[terminal control sequences removed]" in shown
    # Answered "always": the next call is not asked about, and nothing more is shown.
    assert await check(gate, shell, {"argv": ["rm", "\x1b[2J"]}, allowed) is None
    assert out.getvalue() == shown
    # The default JSON rendering escapes C0 controls visibly; C1 and bidi are stripped.
    out = FakeTTY()
    assert (
        await check(Gate(TerminalPrompter(FakeTTY("o\n"), out)), make_tool("py"), {"argv": hostile})
        is None
    )
    shown = out.getvalue()
    assert is_safe(shown) and "\u202e" not in shown
    assert "py: approve" in shown and "\\u001b]0;pwned\\u0007" in shown


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        ("o\n", Approval.ONCE),
        ("once\n", Approval.ONCE),
        (" A \n", Approval.ALWAYS),
        ("always\n", Approval.ALWAYS),
        ("n\n", Approval.NO),
        ("\n", Approval.NO),
        ("yes\n", Approval.NO),
    ],
)
async def test_terminal_approval_answers(line: str, answer: Approval) -> None:
    prompter = TerminalPrompter(FakeTTY(line), FakeTTY())
    assert await prompter.approve(ApprovalRequest("t", "t {}", "ai:confirm")) is answer


async def test_terminal_prompter_needs_two_ttys_and_denies_at_end_of_input() -> None:
    assert not TerminalPrompter(io.StringIO("o\n"), FakeTTY()).available
    assert not TerminalPrompter(FakeTTY("o\n"), io.StringIO()).available
    assert (
        denial_reason(
            await check(Gate(TerminalPrompter(io.StringIO("o\n"), FakeTTY())), make_tool(), {})
        )
        == NO_OPERATOR
    )
    gate = Gate(TerminalPrompter(FakeTTY(""), FakeTTY()))
    assert denial_reason(await check(gate, make_tool(), {})) == (
        f"the operator did not permit this command: end of input; {FINAL}"
    )


def test_strip_control_leaves_no_control_character() -> None:
    assert strip_control("a\x1b[1;31mb\x1b[0m\tc\nd\x1b(Be\x00f\x85g") == "ab\tc\ndefg"
    assert strip_control("\x1b]0;title\x1b\\x\x9d2;t\x9cy") == "xy"
    assert strip_control("keep \x1b]0;no terminator here") == "keep 0;no terminator here"
    alphabet = "\x1b\x07\x9b\x9c\x9d\x90\\[]P;0123m J\r\n\t\x00\x7f\x85ab"
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert is_safe(strip_control(text)), repr(text)


def test_sanitize_collapses_and_caps() -> None:
    assert sanitize("  a \n\n\t b\r\n c  ") == "a b c"
    assert sanitize("x" * 600) == "x" * 499 + "…"
    assert sanitize("é" * 10, limit=5) == "éééé…"
    assert sanitize("exactly5", limit=8) == "exactly5"
    assert sanitize("\x1b[2J") == ""


async def test_terminal_prompter_sanitizes_whatever_it_is_handed() -> None:
    # A careless caller passing raw model text still cannot reach the terminal with it.
    hostile = "x\x1b[2J\x1b]0;pwned\x07\x9b31m\ry\n\x1b]52;c;Y2xpcA==\x07z"
    out = FakeTTY()
    terminal = TerminalPrompter(FakeTTY("o\ny\n1\nv\n"), out)
    await terminal.approve(ApprovalRequest(hostile, hostile, hostile))
    await terminal.confirm(hostile)
    await terminal.select(hostile, [hostile, hostile])
    await terminal.ask(hostile, hostile)
    shown = out.getvalue()
    assert is_safe(shown) and "\r" not in shown and "pwned" not in shown
    assert shown.count("xy z") == 9


async def test_may_rerun_asks_and_defaults_to_no() -> None:
    tool = make_tool("charge", tags=())
    prompter = ScriptedPrompter(confirms=[True, False, PromptError("gone")])
    gate = Gate(prompter)
    assert await gate.may_rerun(tool, {"amount": 5}) is True
    assert await gate.may_rerun(tool, {"amount": 5}) is False
    assert await gate.may_rerun(tool, {"amount": 5}) is False
    assert prompter.asked[0] == (
        "confirm",
        'charge was interrupted by a crash; run it again? charge {"amount": 5}',
    )
    assert await Gate(NoOperator()).may_rerun(tool, {}) is False
    assert await Gate(ScriptedPrompter(available=False)).may_rerun(tool, {}) is False

"""The debugger's stops, second round ([15/19]): names are checked with a "did you mean",
keyword conditions combine with AND and `any_of` with OR, a run stops before the operator is
asked at a gated tool, and `explain()` shows the gate's decision."""

from __future__ import annotations

import pytest
from conftest import make_run

from fisk_sm import Tool, tool
from fisk_sm.journal.records import ApprovalAnswered, ApprovalRequested
from fisk_sm.loop.stops import Stops
from fisk_sm.operator.prompter import Approval, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply

DEPLOYED: list[str] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@tool(tags=["ai:confirm"])
def deploy(target: str) -> str:
    """Deploy (pretend; each deploy is noted in DEPLOYED).

    Args:
        target: where to
    """
    DEPLOYED.append(target)
    return f"deployed {target}"


TOOLS: list[Tool] = [add, deploy]


def adds_twice(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("add", {"a": 2, "b": 3}, id="toolu_1"),
        Reply.tool_use("add", {"a": 5, "b": 1}, id="toolu_2"),
        Reply.text("6"),
    )


def deploys_twice(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("add", {"a": 1, "b": 1}, id="toolu_1"),
        Reply.tool_use("deploy", {"target": "staging"}, id="toolu_2"),
        Reply.tool_use("deploy", {"target": "prod"}, id="toolu_3"),
        Reply.text("done"),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tool": "delpoy"}, "unknown tool 'delpoy'; did you mean 'deploy'?"),
        ({"states": ("exeucte",)}, "unknown state 'exeucte'; did you mean 'execute'?"),
        ({"approval": "deplyo"}, "unknown tool 'deplyo'; did you mean 'deploy'?"),
        ({"any_of": [{"tool": "ad"}]}, "unknown tool 'ad'; did you mean 'add'?"),
        ({"tool": "zzz"}, "unknown tool 'zzz'"),
    ],
)
async def test_an_unknown_name_is_an_error_with_a_did_you_mean(
    api: FakeMessagesAPI, kwargs: dict[str, object], message: str
) -> None:
    adds_twice(api)
    run, _, journal = make_run(api, TOOLS)
    states = kwargs.pop("states", ())
    with pytest.raises(ValueError) as caught:
        await run.run_until(*states, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message
    assert run.state == "suspend_check"  # refused before any step
    assert api.requests == []
    assert journal.records == []


async def test_keyword_conditions_combine_with_and(api: FakeMessagesAPI) -> None:
    adds_twice(api)
    run, _, _ = make_run(api, TOOLS)
    # add is about to run in iteration 1 too: both must hold, so not there
    assert await run.run_until(tool="add", iteration=2) == "execute"
    assert run.data.iteration == 2
    assert run.data.pending[0].input == {"a": 5, "b": 1}
    reason = await run.run_to(Stops.of(("feed_back",), iteration=2))
    assert reason == "state feed_back and iteration 2"


async def test_any_of_gives_or(api: FakeMessagesAPI) -> None:
    adds_twice(api)
    run, _, _ = make_run(api, TOOLS)
    either = [Stops.of(("feed_back",)), {"tool": "add", "iteration": 2}]
    assert await run.run_until(any_of=either) == "feed_back"
    assert run.data.iteration == 1
    assert await run.run_until(any_of=either) == "execute"
    assert run.data.pending[0].input == {"a": 5, "b": 1}
    assert await run.run_until(any_of=either) == "feed_back"
    assert await run.run_until(any_of=either) == "completed"


async def test_a_run_stops_before_the_operator_is_asked(api: FakeMessagesAPI) -> None:
    deploys_twice(api)
    DEPLOYED.clear()
    prompter = ScriptedPrompter(approvals=[Approval.ALWAYS])
    run, _, journal = make_run(api, TOOLS, prompter=prompter)
    assert await run.run_until(approval=True) == "gate"  # add (ungated) is passed by
    assert run.data.pending[0].name == "deploy"
    assert prompter.asked == []  # nothing asked, nothing journaled yet
    assert not any(isinstance(r, ApprovalRequested) for r in journal.records)
    told = str(run.explain())
    assert "gate: deploy is gated by ai:confirm: the operator will be asked" in told
    await run.step()
    assert run.state == "awaiting_approval"
    assert "gate: deploy is gated by ai:confirm: awaiting the operator's answer" in str(
        run.explain()
    )
    assert prompter.asked == []
    await run.step()
    answered = [r for r in journal.records if isinstance(r, ApprovalAnswered)]
    assert [a.answer for a in answered] == ["always"]
    # the second deploy is not asked about (remembered): no approval stop, to the end
    assert await run.run_until(approval="deploy", any_of=[{"states": ["gate"]}]) == "gate"
    assert "gate: deploy is gated by ai:confirm: an earlier `always` is remembered" in str(
        run.explain()
    )
    assert await run.run_until(approval="deploy") == "completed"
    assert DEPLOYED == ["staging", "prod"]
    assert len(prompter.asked) == 1


async def test_explain_at_the_gate_of_an_ungated_tool(api: FakeMessagesAPI) -> None:
    deploys_twice(api)
    run, _, _ = make_run(api, TOOLS)
    assert await run.run_until("gate") == "gate"
    assert "gate: add is ungated: it runs" in str(run.explain())
    # without an operator nobody is asked: no approval stop, the deploys are denied
    assert await run.run_until("gate", tool="deploy") == "gate"
    assert "gate: deploy is gated by ai:confirm: nobody to ask: it is denied" in str(run.explain())
    assert await run.run_until(approval=True) == "completed"


def test_the_blocking_facade_takes_the_same_conditions(api: FakeMessagesAPI) -> None:
    """`run.sync().run_until` (a `(Pdb)` prompt) has `approval=` and `any_of=` too."""
    deploys_twice(api)
    DEPLOYED.clear()
    prompter = ScriptedPrompter(approvals=[Approval.ALWAYS])
    run, _, _ = make_run(api, TOOLS, prompter=prompter)
    debugger = run.sync()
    assert debugger.run_until(approval="deploy") == "gate"
    assert prompter.asked == []
    assert debugger.run_until(any_of=[{"states": ["feed_back"]}]) == "feed_back"
    with pytest.raises(ValueError, match="did you mean 'deploy'"):
        debugger.run_until(approval="delpoy")

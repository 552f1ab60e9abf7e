"""Approval is a state: a gated call is journaled as asked, the run waits in `awaiting_approval`,
and the answer is journaled. A suspend leaves the approval pending, never denied; a resume asks
again; "always" is remembered for the rest of the run, across a resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from conftest import make_config

from fisk_sm import RunOptions, resume_session, start_session, tool
from fisk_sm.events.types import ApprovalAsked, ApprovalDenied, ApprovalGranted, Recorder
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.fold import fold
from fisk_sm.journal.records import (
    ApprovalAnswered,
    ApprovalRequested,
    Record,
    Terminal,
    ToolResult,
    ToolStarted,
)
from fisk_sm.journal.snapshot import PendingApproval
from fisk_sm.machine.path import session_path
from fisk_sm.operator.prompter import Approval, ApprovalRequest, ScriptedPrompter
from fisk_sm.testing import FakeMessagesAPI, Reply

DECLINED = "the operator declined to permit this command; this decision is final, do not retry"
RAN: list[str] = []


@tool(tags=["ai:confirm"])
def rm(path: str) -> str:
    """Remove a path (pretend; each run is noted in RAN).

    Args:
        path: what to remove
    """
    RAN.append(path)
    return f"removed {path}"


class Waiting:
    """A prompter whose operator never answers: `asked` is set once a request arrives."""

    available = True

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.requests: list[ApprovalRequest] = []

    async def approve(self, request: ApprovalRequest) -> Approval:
        self.requests.append(request)
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def confirm(self, question: str) -> bool:
        raise AssertionError(question)

    async def select(self, question: str, options: Any) -> int | None:
        raise AssertionError(question)

    async def ask(self, question: str, default: str | None) -> str | None:
        raise AssertionError(question)


def kinds(records: list[Record]) -> list[str]:
    return [type(r).__name__ for r in records[1:]]


async def start(api: FakeMessagesAPI, store: FileStore, prompter: Any, run_id: str) -> Any:
    options = RunOptions(tools=[rm], events=Recorder(), prompter=prompter)
    return await start_session(make_config(api), "clean up", store, options, run_id=run_id)


async def test_an_answer_is_journaled_between_the_request_and_the_tool(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    RAN.clear()
    api.add(Reply.tool_use("rm", {"path": "/a"}, id="t1"), Reply.text("done"))
    store = FileStore(tmp_path)
    run = await start(api, store, ScriptedPrompter(approvals=[Approval.ONCE]), "once")
    entered = []
    while not run.finished:
        entered.append((await run.step()).destination)
    await run.aclose()
    assert entered[4:8] == ["gate", "awaiting_approval", "execute", "feed_back"]
    records = store.load("once")
    assert kinds(records) == [
        "Assistant", "ApprovalRequested", "ApprovalAnswered", "ToolStarted", "ToolResult",
        "Assistant", "Terminal",
    ]  # fmt: skip
    asked, answered = records[2], records[3]
    assert asked == ApprovalRequested(
        seq=3, run_id="once", tool_use_id="t1", name="rm", input={"path": "/a"}, tag="ai:confirm"
    )
    assert isinstance(answered, ApprovalAnswered) and answered.at  # the time of the answer
    assert answered == ApprovalAnswered(
        seq=4, tool_use_id="t1", answer="once", by="script", at=answered.at
    )
    assert RAN == ["/a"]
    assert session_path(records).states == ("suspend_check", *entered)


async def test_a_suspend_during_the_wait_leaves_the_approval_pending_and_a_resume_asks_again(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    RAN.clear()
    api.add(Reply.tool_use("rm", {"path": "/b"}, id="t1"), Reply.text("done"))
    store = FileStore(tmp_path)
    waiting = Waiting()
    run = await start(api, store, waiting, "parked")
    task = asyncio.create_task(run.run())
    await asyncio.wait_for(waiting.asked.wait(), 30)
    assert run.state == "awaiting_approval"
    assert run.data.approval == PendingApproval("parked", "t1", "rm", {"path": "/b"}, "ai:confirm")
    request = waiting.requests[0]
    assert (request.run_id, request.tool_use_id, request.arguments) == (
        "parked",
        "t1",
        {"path": "/b"},
    )
    run.request_suspend()  # not `now`: a wait for an answer is cut by any suspend
    assert await asyncio.wait_for(task, 30) == "suspended"
    assert run.outcome == "suspended awaiting approval of rm (t1)"
    await run.aclose()
    records = store.load("parked")
    assert kinds(records) == ["Assistant", "ApprovalRequested", "Terminal"]  # never denied
    assert isinstance(records[-1], Terminal) and records[-1].reason == "suspended"
    snapshot = fold(records)
    assert snapshot.state == "awaiting_approval"
    assert snapshot.approval == run.data.approval
    assert session_path(records).states[-3:] == ("gate", "awaiting_approval", "suspended")
    assert RAN == []

    events = Recorder()
    prompter = ScriptedPrompter(approvals=[Approval.ONCE])
    options = RunOptions(tools=[rm], events=events, prompter=prompter)
    resumed = await resume_session(make_config(api), "parked", store, options)
    assert resumed.state == "awaiting_approval"
    assert await resumed.run() == "completed"
    await resumed.aclose()
    assert [r.tool_use_id for _, r in prompter.asked] == ["t1"]  # asked again, same call
    assert RAN == ["/b"]
    assert [type(e).__name__ for e in events.of(ApprovalGranted)] == ["ApprovalGranted"]
    records = store.load("parked")
    assert kinds(records)[3:] == [
        "ApprovalAnswered", "ToolStarted", "ToolResult", "Assistant", "Terminal",
    ]  # fmt: skip
    # the model saw one request for the turn, then the result: nothing of the wait
    second = api.requests[-1]["messages"][-1]["content"][0]
    assert (second["tool_use_id"], second["content"]) == ("t1", "removed /b")


async def test_deny_hands_back_the_reference_denial_and_survives_a_crash_before_the_result(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    RAN.clear()
    api.add(Reply.tool_use("rm", {"path": "/c"}, id="t1"), Reply.text("ok, not removed"))
    store = FileStore(tmp_path)
    events = Recorder()
    options = RunOptions(
        tools=[rm], events=events, prompter=ScriptedPrompter(approvals=[Approval.NO])
    )
    run = await start_session(make_config(api), "clean up", store, options, run_id="denied")
    assert await run.run() == "completed"
    await run.aclose()
    assert RAN == []
    result = api.requests[-1]["messages"][-1]["content"][0]
    assert json.loads(result["content"]) == {"allowed": False, "reason": DECLINED}
    assert "is_error" not in result
    records = store.load("denied")
    assert kinds(records) == [
        "Assistant", "ApprovalRequested", "ApprovalAnswered", "ToolResult", "Assistant",
        "Terminal",
    ]  # fmt: skip
    assert [e.reason for e in events.of(ApprovalDenied)] == ["declined"]
    # A crash after the answer, before the result: the fold resumes at execute with the
    # denial, and no one is asked again.
    cut = records[:4]
    snapshot = fold(cut)
    assert (snapshot.state, snapshot.denials, snapshot.approval) == ("execute", {"t1": ""}, None)


async def test_always_is_remembered_across_a_resume(api: FakeMessagesAPI, tmp_path: Path) -> None:
    RAN.clear()
    api.add(
        Reply.tool_use("rm", {"path": "/d"}, id="t1"),
        Reply.tool_use("rm", {"path": "/e"}, id="t2"),
        Reply.text("done"),
    )
    store = FileStore(tmp_path)
    run = await start(api, store, ScriptedPrompter(approvals=[Approval.ALWAYS]), "always")
    await run.run_until("feed_back")
    run.request_suspend()
    assert await run.run() == "suspended"
    await run.aclose()
    assert fold(store.load("always")).allowed == ("rm",)
    events = Recorder()
    prompter = ScriptedPrompter()  # any question would fail: none may be asked
    options = RunOptions(tools=[rm], events=events, prompter=prompter)
    resumed = await resume_session(make_config(api), "always", store, options)
    assert await resumed.run() == "completed"
    await resumed.aclose()
    assert prompter.asked == [] and RAN == ["/d", "/e"]
    assert [e.answer for e in events.of(ApprovalGranted)] == ["remembered"]
    assert events.of(ApprovalAsked) == []


async def test_nobody_to_ask_is_a_denial_with_no_approval_records(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    RAN.clear()
    api.add(Reply.tool_use("rm", {"path": "/f"}, id="t1"), Reply.text("fine"))
    store = FileStore(tmp_path)
    run = await start(api, store, None, "nobody")
    assert await run.run() == "completed"
    await run.aclose()
    records = store.load("nobody")
    assert kinds(records) == ["Assistant", "ToolResult", "Assistant", "Terminal"]
    result = next(r for r in records if isinstance(r, ToolResult))
    assert "no operator could be asked" in result.result["content"]
    assert not any(isinstance(r, ToolStarted) for r in records) and RAN == []

"""The full-screen UI's Operate mode (`fisk_sm.tui.operate`) against a real `fisk-sm supervise`.

The supervisor is a subprocess on loopback (tests/ctlkit.py) whose agent calls `deploy`, tagged
`ai:confirm`, so each run parks for an approval; the model is the fake Messages API. The operator
is Textual's Pilot pressing keys; what it did is checked three ways: in the supervisor (the runs'
outcomes, and which deploys really ran: `effects_lines`), in the messages the app posted
(`message_hook`), and on the screen. The snapshot and the hostile-text screens are drawn from
fixed `Run` records through a `Control` of the test's own, so no clock or run id gets in.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
from ctlkit import DEADLINE, Supervisor
from textual.app import App
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import DataTable, Static
from tuikit import check_snapshot, settle

from fisk_sm.client import AsyncClient
from fisk_sm.client.records import Approval, Entry, EventsGap, Run, StreamEvent, Tokens
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tui.dialogs import ApprovalDialog, ConfirmDialog
from fisk_sm.tui.operate import OperateApp
from fisk_sm.tui.runs_table import Cell, RunsTable

T = TypeVar("T")
M = TypeVar("M", bound=Message)
SIZE = (120, 40)
#: How long a wait lets the app run: generous (machines are noisy), and within pytest's timeout.
WAIT = min(DEADLINE, 90.0)
#: Markup, an escape sequence and a bidi override in a run's name.
HOSTILE = "[bold]x[/bold] [@click=app.quit]q[/] \x1b[31mred\u202eevil"
#: What the screen must show of it: the markup as typed, the controls gone.
HOSTILE_SHOWN = "[bold]x[/bold] [@click=app.quit]q[/] redevil"


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def sup(api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with Supervisor(tmp_path_factory.mktemp("operate"), api, args=("--workers", "0")) as found:
        yield found
    assert found.process is not None and found.process.returncode == 0


async def until(pilot: Pilot[int], probe: Callable[[], T | None], what: str) -> T:
    """Let the app run until `probe` gives something truthy; fail naming `what` (before the
    test's timeout)."""
    end = time.monotonic() + WAIT
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def posted(messages: list[Message], kind: type[M]) -> list[M]:
    """The messages of `kind` the app posted."""
    return [m for m in messages if isinstance(m, kind)]


def sent(messages: list[Message], run_id: str) -> str | None:
    """What the app sent the supervisor for `run_id` (the first request's action)."""
    return next(
        (m.action for m in posted(messages, OperateApp.Sent) if m.run.run_id == run_id), None
    )


def cell(table: RunsTable, run_id: str, column: str) -> str:
    """The text of a cell of the table."""
    return table.get_cell(run_id, column).plain


def status_line(app: App[int]) -> str:
    return str(app.query_one("#status", Static).visual)


async def filter_to(pilot: Pilot[int], text: str, run_id: str) -> None:
    """`/`, type `text`, Enter: the table shows the one run, highlighted, focused."""
    await pilot.press("slash", *text, "enter")
    app = pilot.app
    assert isinstance(app, OperateApp)
    await until(
        pilot,
        lambda: app.table.row_count == 1 and app.table.highlighted() == run_id,
        f"the filter {text!r} to leave {run_id}",
    )
    assert app.focused is app.table


def deploy_then(target: str, answer: str) -> list[Reply]:
    return [Reply.tool_use("deploy", {"target": target}), Reply.text(answer)]


@pytest.mark.timeout(300)
async def test_the_operator_approves_one_run_and_denies_the_other(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    api.add_conversation("tui: deploy alpha", *deploy_then("alpha", "alpha is live"))
    api.add_conversation("tui: deploy beta", *deploy_then("beta", "beta stays as it was"))
    messages: list[Message] = []
    async with AsyncClient(sup.url) as client:
        app = OperateApp(client)
        async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
            table = app.table
            # listed at once, and again once subscribed (the stream starts with a gap)
            await until(pilot, lambda: len(posted(messages, OperateApp.Loaded)) == 2, "loaded")
            alpha = (await client.submit("tui: deploy alpha", name="alpha deploy")).run_id
            beta = (await client.submit("tui: deploy beta", name="beta deploy")).run_id

            def parked() -> bool:  # as the table shows them
                shown = {alpha, beta} <= set(table.cells)
                return shown and all(cell(table, r, "status") == "parked" for r in (alpha, beta))

            await until(pilot, parked, "both runs parked, in the table")
            assert len(posted(messages, OperateApp.Loaded)) == 2  # the events alone brought them
            assert cell(table, alpha, "tool") == "deploy"
            assert sup.effects_lines().count("alpha") == 0

            await filter_to(pilot, "alpha", alpha)
            await pilot.press("a")
            dialog = await until(
                pilot, lambda: isinstance(app.screen, ApprovalDialog) and app.screen, "the dialog"
            )
            shown = str(dialog.query_one("#approval-input", Static).visual)
            assert '"target": "alpha"' in shown  # the input, whole, before the keypress
            await pilot.press("o")
            assert await until(pilot, lambda: sent(messages, alpha), "the answer sent") == "once"
            assert not isinstance(app.screen, ApprovalDialog)  # dismissed
            await until(pilot, lambda: cell(table, alpha, "status") == "completed", "alpha done")

            await filter_to(pilot, "beta", beta)
            await pilot.press("enter")  # Enter on the row: its approval, too
            await until(pilot, lambda: isinstance(app.screen, ApprovalDialog), "the dialog")
            await pilot.press("n")
            assert await until(pilot, lambda: sent(messages, beta), "the answer sent") == "deny"
            await until(pilot, lambda: cell(table, beta, "status") == "completed", "beta done")

            done = await client.run(alpha)
            denied = await client.run(beta)
    assert (done.status, done.answer) == ("completed", "alpha is live")
    assert denied.answer == "beta stays as it was"  # the model was told, and went on
    assert sup.effects_lines().count("alpha") == 1
    assert "beta" not in sup.effects_lines()
    highlighted = {m.row_key.value for m in posted(messages, DataTable.RowHighlighted)}
    assert {alpha, beta} <= highlighted
    assert posted(messages, DataTable.RowSelected)  # the Enter on beta's row
    assert [m.action for m in posted(messages, OperateApp.Sent)] == ["once", "deny"]
    assert not posted(messages, OperateApp.Refused)


@pytest.mark.timeout(300)
async def test_suspend_resume_abort_and_a_refusal_in_the_status_line(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    api.add_conversation("tui: deploy gamma", *deploy_then("gamma", "never"))
    messages: list[Message] = []
    async with AsyncClient(sup.url) as client:
        gamma = (await client.submit("tui: deploy gamma", name="gamma deploy")).run_id
        app = OperateApp(client)
        async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
            table = app.table

            def status_is(status: str) -> Callable[[], bool]:
                return lambda: (r := table.runs.get(gamma)) is not None and r.status == status

            await until(pilot, status_is("parked"), "gamma parked")
            await filter_to(pilot, "gamma", gamma)
            await pilot.press("u")
            await until(pilot, status_is("suspended"), "gamma suspended")
            await pilot.press("r")
            await until(pilot, status_is("parked"), "gamma parked again")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
            await pilot.press("n")
            await until(pilot, lambda: "not aborted" in status_line(app), "not aborted")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
            await pilot.press("y")
            await until(pilot, status_is("aborted"), "gamma aborted")
            await pilot.press("r")  # an aborted run cannot resume: the supervisor says 409
            await until(pilot, lambda: posted(messages, OperateApp.Refused), "the refusal")
            assert app.is_running
            line = status_line(app)
            assert line.startswith("resume: the supervisor answered 409") and "\n" not in line
    assert [m.action for m in posted(messages, OperateApp.Sent)] == [
        "suspend",
        "resume",
        "abort",
    ]
    assert "gamma" not in sup.effects_lines()


async def test_no_supervisor_is_a_line_in_the_status_bar() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    messages: list[Message] = []
    async with AsyncClient(f"http://127.0.0.1:{port}", retries=1, backoff=0.01) as client:
        app = OperateApp(client)
        async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
            await until(pilot, lambda: len(posted(messages, OperateApp.Refused)) == 2, "both")
            assert app.is_running
            line = status_line(app)
            assert line.startswith("events: the event stream of http://127.0.0.1:"), line
            assert line.endswith("(R follows them again)") and "\n" not in line
            await pilot.press("a")  # nothing to approve: said, not raised
            assert status_line(app) == "no run is highlighted"
            await pilot.press("q")
        assert app.return_code == 0
    first = posted(messages, OperateApp.Refused)[0]
    assert first.action == "runs" and "cannot reach the supervisor" in first.error


# -- fixed records: the snapshot and the hostile text ----------------------------------------


def record(
    n: int,
    name: str,
    status: str = "running",
    state: str = "call",
    total: int = 0,
    tool: str | None = None,
) -> Run:
    """A run record that never changes (its age is its `age_seconds`: the clock is stopped)."""
    run_id = f"20250101T0000{n:02d}-{n:08x}"
    approval = (
        None
        if tool is None
        else Approval(run_id, f"toolu_{n:02d}", tool, {"target": f"t{n}"}, "ai:confirm")
    )
    return Run(
        run_id=run_id,
        name=name,
        state=state,
        status=status,
        iteration=n % 7,
        tokens=Tokens(total // 2, total - total // 2, 0, 0, total),
        created=f"2025-01-01T00:00:{n:02d}Z",
        age_seconds=float((50 - n) * 37),
        approval=approval,
        outcome="completed" if status == "completed" else None,
        answer="done" if status == "completed" else "",
    )


class FixedControl:
    """A `Control` of fixed records: the stream is one gap (the app lists them), then ends."""

    def __init__(self, runs: list[Run]) -> None:
        self.listing = runs

    async def runs(self) -> list[Run]:
        return list(self.listing)

    async def run(self, run_id: str) -> Run:
        found = next(r for r in self.listing if r.run_id == run_id)
        said = Entry("assistant", "text", found.name)
        asked = Entry("assistant", "tool_use", '{"target": "prod"}', name="deploy")
        told = Entry("user", "tool_result", "denied by the operator", name="deploy", is_error=True)
        path = ("start", "call", "decide", "execute", found.state)
        return attrs.evolve(
            found, path=path, transcript=(Entry("user", "text", "go"), said, asked, told)
        )

    async def answer(self, run_id: str, tool_use_id: str, answer: str) -> Run:
        raise AssertionError("not asked in these tests")

    suspend = resume = abort = run

    async def events(
        self, run: str | None = None, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        yield EventsGap("EventsGap", "b0-1", {}, last_event_id=last_event_id or "", reason="boot")


def fixed_runs() -> list[Run]:
    statuses = [("running", "call", None), ("parked", "awaiting_approval", "deploy"),
                ("completed", "done", None), ("suspended", "call", None)]  # fmt: skip
    runs = [
        record(n, f"deploy service {n}", *statuses[n % 4][:2], n * 1234, statuses[n % 4][2])
        for n in range(1, 15)
    ]
    return [*runs, record(40, HOSTILE, "parked", "awaiting_approval", 99, "[red]rm -rf[/]")]


async def fixed_app(pilot: Pilot[int]) -> None:
    """Let the fixed app list its runs, flush them, highlight and fetch the first."""
    app = pilot.app
    assert isinstance(app, OperateApp)
    await settle(pilot)
    await until(pilot, lambda: app.full is not None, "the detail fetched")
    await settle(pilot)


async def test_the_operate_screen_snapshot(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    app = OperateApp(FixedControl(fixed_runs()), clock=lambda: 0.0)
    async with app.run_test(size=SIZE) as pilot:
        await fixed_app(pilot)
        await pilot.press("down", "down")  # the third row: a parked run
        await until(pilot, lambda: app.full is not None and app.table.cursor_row == 2, "row 3")
        await settle(pilot)
        check_snapshot(app, "operate", request.config, tmp_path)


async def test_a_hostile_run_name_shows_as_typed_and_breaks_no_layout() -> None:
    app = OperateApp(FixedControl(fixed_runs()), clock=lambda: 0.0)
    async with app.run_test(size=SIZE) as pilot:
        await fixed_app(pilot)
        table: RunsTable = app.table
        hostile = record(40, HOSTILE).run_id
        assert table.highlighted() == hostile  # the newest: first
        assert table.get_cell(hostile, "name").plain == HOSTILE_SHOWN
        assert table.get_cell(hostile, "tool").plain == "[red]rm -rf[/]"
        svg = app.export_screenshot()
        text = re.sub(r"<[^>]+>", "", svg).replace("&#160;", " ")
        assert HOSTILE_SHOWN in text  # whole in the detail pane (cut to the column in the table)
        assert "[bold]x[/bold] [@click=app.quit]q" in text and "[red]rm -rf[/]" in text
        assert "\x1b" not in svg and "\u202e" not in svg
        # one line a row, and the panes where they belong
        assert all(row.height == 1 for row in table.rows.values())
        assert app.query_one("#status").region.y == SIZE[1] - 2
        assert table.region.height == SIZE[1] - 1 - 1 - 14 - 1 - 1
        # a click on the name (a live [@click] would quit): the detail's, then the row's, which
        # selects the row: its approval's dialog, the tool's name as typed
        await pilot.click("#detail-text", offset=(20, 0))
        await pilot.click(RunsTable, offset=(20, 1))
        dialog = await until(
            pilot, lambda: isinstance(app.screen, ApprovalDialog) and app.screen, "the dialog"
        )
        assert "approve [red]rm -rf[/] [ai:confirm]" in str(
            dialog.query_one(".question", Static).visual
        )
        assert app.is_running and app.return_code is None


def names(table: RunsTable) -> list[str]:
    """The names in the table, top to bottom."""
    return [cell.plain for cell in table.get_column("name")]


async def test_sort_filter_and_live_updates_keep_the_highlight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = OperateApp(FixedControl(fixed_runs()), clock=lambda: 0.0)
    messages: list[Message] = []
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await fixed_app(pilot)
        table = app.table
        await pilot.press("s")  # by name
        by_name = [HOSTILE_SHOWN, "deploy service 1", "deploy service 10", "deploy service 11"]
        # (the first row alone would not do: the hostile run, the newest, is first by age too)
        await until(pilot, lambda: names(table)[:4] == by_name, "sorted by name")
        assert names(table)[1:4] == ["deploy service 1", "deploy service 10", "deploy service 11"]
        await pilot.press("s", "s", "s")  # status, state, tokens: the most first
        await until(pilot, lambda: names(table)[0] == "deploy service 14", "sorted by tokens")
        assert "sort tokens ↓" in str(app.query_one("#counts", Static).visual)
        await pilot.press("S")  # the other way round, and back
        await until(pilot, lambda: names(table)[0] == HOSTILE_SHOWN, "the fewest first")
        assert "sort tokens ↑" in str(app.query_one("#counts", Static).visual)
        await pilot.press("S")
        await until(pilot, lambda: names(table)[0] == "deploy service 14", "the most first")

        five = record(5, "deploy service 5", "parked", "awaiting_approval", 5 * 1234, "deploy")
        table.move_cursor(row=names(table).index(five.name))
        await until(pilot, lambda: app.current == five.run_id, "service 5 highlighted")
        calls: list[tuple[object, object]] = []
        update = table.update_cell

        def counted(row: str, column: str, value: Cell, *, update_width: bool = False) -> None:
            calls.append((row, column))
            update(row, column, value, update_width=update_width)

        monkeypatch.setattr(table, "update_cell", counted)
        for total in range(100_000, 100_050):  # fifty events between two ticks
            table.note(attrs.evolve(five, tokens=Tokens(0, total, 0, 0, total)))
        await until(pilot, lambda: names(table)[0] == five.name, "service 5 sorted first")
        assert calls == [(five.run_id, "tokens")]  # one cell, once
        assert table.highlighted() == five.run_id == app.current  # the highlight followed it
        assert table.cursor_row == 0

        await pilot.press("slash", *"parked", "enter")
        await until(pilot, lambda: table.row_count == 5, "the parked runs only")
        assert {cell(table, k, "status") for k in table.cells} == {"parked"}
        table.note(attrs.evolve(five, status="running", approval=None))  # no longer parked
        await until(pilot, lambda: table.row_count == 4 and five.run_id not in table.cells, "")
        assert app.current == table.highlighted() != five.run_id  # the highlight moved on
        await pilot.press("R")  # listed again: the fixed runs, service 5 parked as it was
        await until(pilot, lambda: len(posted(messages, OperateApp.Loaded)) == 4, "reloaded")
        await until(pilot, lambda: five.run_id in table.cells and table.row_count == 5, "")


def test_an_answer_overtaken_by_an_event_is_not_shown() -> None:
    table = RunsTable(lambda: 0.0)
    parked = record(1, "one", "parked", "awaiting_approval", 10, "deploy")
    table.note(parked)
    before = table.notes[parked.run_id]  # the answer is sent
    table.note(attrs.evolve(parked, status="completed", approval=None))  # the event, first
    table.note_unless(attrs.evolve(parked, status="running"), before)  # the answer, late
    assert table.runs[parked.run_id].status == "completed"
    table.note_unless(attrs.evolve(parked, status="suspended"), table.notes[parked.run_id])
    assert table.runs[parked.run_id].status == "suspended"  # nothing came in between

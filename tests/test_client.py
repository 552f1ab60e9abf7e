"""`fisk_sm.client` (sync `Client` and `AsyncClient`) against a real `fisk-sm supervise`.

The supervisor is a subprocess on loopback (tests/ctlkit.py) whose agent calls a tool tagged
`ai:confirm`, so each run parks until it is answered; the model is the fake Messages API. Every
route of the control API is called through the client and its answer checked as a typed record
(and against the tool's side-effect file); every refusal as a typed error with its status and
exit code. The URL and token are found as `fisk-sm ctl` finds them (the same function).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from ctlkit import Supervisor, wait_until

import fisk_sm.cli.ctl_client
from fisk_sm.client import (
    Approval,
    AsyncClient,
    BadAnswer,
    BadRequest,
    Client,
    ClientError,
    Conflict,
    EventsGap,
    NotFound,
    Run,
    StreamEvent,
    StreamLost,
    Unauthorized,
    Unavailable,
    WrongHost,
    default_token,
    default_url,
)
from fisk_sm.client.errors import error_for
from fisk_sm.client.records import run_from
from fisk_sm.testing import FakeMessagesAPI, Reply

T = TypeVar("T")
UNKNOWN = "20200101T000000-deadbeef"


def deploy_then(answer: str, target: str) -> list[Reply]:
    """The model calls the gated `deploy` once, then answers."""
    return [Reply.tool_use("deploy", {"target": target}), Reply.text(answer)]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def sup(api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    # one process: `replayed` reads a run's events from a lone supervisor's buffer, which holds
    # every event; workers send theirs only once someone reads (test_supervisor_workers.py)
    with Supervisor(tmp_path_factory.mktemp("client"), api, args=("--workers", "0")) as supervisor:
        yield supervisor
    assert supervisor.process is not None and supervisor.process.returncode == 0


def until(probe: Callable[[], T | None], what: str) -> T:
    return wait_until(probe, what)


def status_of(client: Client, run_id: str, *statuses: str) -> Run:
    """Poll through the client until the run's status is one of `statuses`."""
    return until(lambda: (r := client.run(run_id)).status in statuses and r, f"{run_id} {statuses}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replayed(client: Client, run_id: str, until_name: str) -> list[StreamEvent]:
    """The run's events from the first, replayed from the supervisor's buffer: a made-up id of
    another boot gives the gap (whose id tells this boot), then `<boot>-0` replays them all."""
    stream = client.events(last_event_id="0-0")
    gap = next(stream)
    stream.close()
    assert isinstance(gap, EventsGap) and gap.last_event_id == "0-0" and gap.id
    boot = gap.id.split("-")[0]
    found: list[StreamEvent] = []
    stream = client.events(run=run_id, last_event_id=f"{boot}-0")
    for event in stream:
        found.append(event)
        if event.name == until_name:
            break
    stream.close()
    return found


def test_the_sync_client_covers_every_route(sup: Supervisor, api: FakeMessagesAPI) -> None:
    api.add_conversation("client: deploy to prod", *deploy_then("prod is live", "prod"))
    with Client(sup.url) as client:
        run = client.submit("client: deploy to prod", name="the prod deploy")
        assert isinstance(run, Run) and run.name == "the prod deploy"
        parked = status_of(client, run.run_id, "parked")
        assert isinstance(parked.approval, Approval)
        assert parked.approval.tool == "deploy" and parked.approval.input == {"target": "prod"}
        assert parked.path and parked.path[-1] == "awaiting_approval"
        assert [a.tool_use_id for a in client.approvals() if a.run_id == run.run_id] == [
            parked.approval.tool_use_id
        ]
        assert run.run_id in {r.run_id: r for r in client.runs()}
        assert "<svg" in client.diagram_svg(run.run_id)
        assert client.openapi()["paths"]["/api/runs/{run_id}/end"]["post"]
        assert sup.effects_lines() == []

        client.answer(run.run_id, parked.approval.tool_use_id, "once")
        done = status_of(client, run.run_id, "completed")
        assert done.answer == "prod is live" and sup.effects_lines() == ["prod"]
        assert done.transcript and done.transcript[-1].text == "prod is live"

        events = replayed(client, run.run_id, "RunEnded")
        names = [e.name for e in events]
        assert names[0] == "RunSubmitted" and names[-1] == "RunEnded" and "RunParked" in names
        assert all(e.run_id == run.run_id for e in events)
        seqs = [int(e.id.split("-")[1]) for e in events if e.id]
        assert len(seqs) == len(events) and seqs == sorted(set(seqs))
        assert events[0].run().name == "the prod deploy"


def test_suspend_resume_abort_end_and_say(sup: Supervisor, api: FakeMessagesAPI) -> None:
    api.add_conversation("client: deploy to qa", *deploy_then("never", "qa"))
    api.add_conversation("client: chat", Reply.text("hello"), Reply.text("goodbye"))
    with Client(sup.url) as client:
        run_id = client.submit("client: deploy to qa").run_id
        status_of(client, run_id, "parked")
        assert client.suspend(run_id).run_id == run_id
        assert status_of(client, run_id, "suspended").approval is not None
        client.resume(run_id)
        status_of(client, run_id, "parked")
        client.abort(run_id)
        status_of(client, run_id, "aborted")
        with pytest.raises(Conflict) as refused:
            client.resume(run_id)
        assert refused.value.status == 409 and refused.value.exit_code == 1
        assert "qa" not in sup.effects_lines()

        chat = client.submit("client: chat", chat=True).run_id
        status_of(client, chat, "waiting")
        client.say(chat, "and now?")
        status_of(client, chat, "waiting")
        ended = client.end(chat)
        assert ended.run_id == chat
        assert status_of(client, chat, "completed").answer == "goodbye"
    requests = api.requests_for("client: chat")
    content = requests[-1]["messages"][-1]["content"]  # the follow-up reached the model
    assert (content if isinstance(content, str) else content[0]["text"]) == "and now?"


def test_the_async_client_covers_every_route(sup: Supervisor, api: FakeMessagesAPI) -> None:
    api.add_conversation("client: async deploy", *deploy_then("staging is live", "staging"))
    api.add_conversation("client: async chat", Reply.text("hi"), Reply.text("bye"))
    api.add_conversation("client: async abort", *deploy_then("never", "nowhere"))

    async def status(client: AsyncClient, run_id: str, *statuses: str) -> Run:
        for _ in range(2400):
            run = await client.run(run_id)
            if run.status in statuses:
                return run
            await asyncio.sleep(0.05)
        raise AssertionError(f"{run_id} never {statuses}")

    async def main() -> list[StreamEvent]:
        async with AsyncClient(sup.url) as client:
            run = await client.submit("client: async deploy", name="async")
            parked = await status(client, run.run_id, "parked")
            assert parked.approval is not None
            assert parked.approval in await client.approvals()
            assert run.run_id in [r.run_id for r in await client.runs()]
            assert "<svg" in await client.diagram_svg(run.run_id)
            assert (await client.openapi())["openapi"] == "3.1.0"
            await client.suspend(run.run_id)
            await status(client, run.run_id, "suspended")
            await client.resume(run.run_id)
            await status(client, run.run_id, "parked")
            await client.answer(run.run_id, parked.approval.tool_use_id, "always")
            assert (await status(client, run.run_id, "completed")).answer == "staging is live"

            doomed = (await client.submit("client: async abort")).run_id
            await status(client, doomed, "parked")
            await client.abort(doomed)
            await status(client, doomed, "aborted")
            with pytest.raises(NotFound):
                await client.run(UNKNOWN)

            chat = (await client.submit("client: async chat", chat=True)).run_id
            await status(client, chat, "waiting")
            await client.say(chat, "more")
            await status(client, chat, "waiting")
            await client.end(chat)
            assert (await status(client, chat, "completed")).answer == "bye"

            stream = client.events(last_event_id="0-0")
            gap = await anext(aiter(stream))
            await stream.aclose()
            assert isinstance(gap, EventsGap) and gap.id
            events = []
            stream = client.events(run=run.run_id, last_event_id=gap.id.split("-")[0] + "-0")
            async for event in stream:
                events.append(event)
                if event.name == "RunEnded":
                    break
            await stream.aclose()
            return events

    events = asyncio.run(main())
    assert events[0].name == "RunSubmitted" and events[-1].name == "RunEnded"
    assert "staging" in sup.effects_lines()
    assert "nowhere" not in sup.effects_lines()


def test_refusals_are_typed_errors_with_status_and_exit_code(sup: Supervisor) -> None:
    with Client(sup.url) as client:
        with pytest.raises(NotFound) as missing:
            client.run(UNKNOWN)
        assert (missing.value.status, missing.value.exit_code) == (404, 1)
        with pytest.raises(BadRequest) as empty:
            client.submit("   ")
        assert (empty.value.status, empty.value.exit_code) == (400, 2)
        assert "prompt: must not be empty" in str(empty.value)
        with pytest.raises(BadRequest) as bad_id:
            client.run("../etc")  # refused before it is sent
        assert bad_id.value.status is None and str(bad_id.value).startswith("run_id: ")
        with pytest.raises(BadRequest, match=r"^answer: "):
            client.answer(UNKNOWN, "toolu_1", "sometimes")
        with pytest.raises(BadRequest, match="Last-Event-ID"):
            next(client.events(last_event_id="not-an-id"))
    with Client(f"http://127.0.0.1:{free_port()}") as nobody:
        with pytest.raises(Unavailable) as away:
            nobody.runs()
        assert (away.value.status, away.value.exit_code) == (None, 69)
    with Client(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01) as nobody:
        with pytest.raises(StreamLost) as lost:
            next(nobody.events())
        assert lost.value.exit_code == 69 and lost.value.last_event_id is None
        assert "1 reconnection(s) failed" in str(lost.value)
    assert isinstance(error_for(421, "x"), WrongHost) and error_for(421, "x").exit_code == 1
    assert type(error_for(418, "x")) is ClientError
    with pytest.raises(BadRequest, match=r"^url: not an http"):
        Client("ftp://example.invalid")


def test_a_missing_field_is_one_line_naming_it() -> None:
    run = {"run_id": "r", "name": "n", "state": "s", "status": "queued", "iteration": 0}
    with pytest.raises(BadAnswer, match=r"^run\.tokens: missing from the supervisor's answer$"):
        run_from(run)
    tokens = dict.fromkeys(("input", "output", "cache_read", "cache_creation", "total"), 1)
    full = {**run, "tokens": tokens, "created": "c", "age_seconds": 1, "approval": None,
            "outcome": None, "answer": "", "new_field": "ignored"}  # fmt: skip
    assert run_from(full).age_seconds == 1.0
    with pytest.raises(BadAnswer, match=r"^run\.iteration: expected int, got str$"):
        run_from({**full, "iteration": "1"})
    with pytest.raises(BadAnswer, match=r"^run\.approval\.tool: missing"):
        run_from({**full, "approval": {"run_id": "r", "tool_use_id": "t"}})


def test_the_token_and_url_are_found_as_ctl_finds_them(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    assert fisk_sm.cli.ctl_client.default_url is default_url  # one lookup, not a copy
    with Supervisor(tmp_path, api, token="s3cret-token") as sup:
        with Client(env={"FISK_SM_URL": sup.url, "FISK_SM_TOKEN": "s3cret-token"}) as client:
            assert client.url == sup.url and client.runs() == []
        with (
            Client(sup.url, env={"FISK_SM_TOKEN": "wrong"}) as wrong,
            pytest.raises(Unauthorized) as refused,
        ):
            wrong.runs()
        assert (refused.value.status, refused.value.exit_code) == (401, 77)
        with Client(sup.url, env={}) as none, pytest.raises(Unauthorized):
            none.approvals()
        state = tmp_path / "xdg"
        written = state / "fisk-sm" / "runs" / "supervisor.url"
        written.parent.mkdir(parents=True)
        written.write_text(sup.url + "\n")
        env = {"XDG_STATE_HOME": str(state), "FISK_SM_TOKEN": "s3cret-token"}
        with Client(env=env) as found:
            assert found.url == sup.url and found.runs() == []
    assert default_token({"FISK_SM_TOKEN": "  t  "}) == "t"
    assert default_token({"FISK_SM_TOKEN": " "}) is None


def loaded_by(code: str) -> set[str]:
    """The modules `code` adds to a fresh interpreter's `sys.modules`."""
    script = f"import sys\nbefore = set(sys.modules)\n{code}\nprint(*(set(sys.modules) - before))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_importing_the_client_is_cheap_and_httpx2_comes_with_the_first_client() -> None:
    modules = loaded_by("import fisk_sm.client")
    assert "fisk_sm.client" in modules
    assert not {m for m in modules if m.split(".")[0] in ("httpx2", "attrs", "anthropic")}
    modules = loaded_by("from fisk_sm.client import AsyncClient, Client, ClientError, Run")
    assert "fisk_sm.client.sync" in modules and "fisk_sm.client.aio" in modules
    assert not {m for m in modules if m.split(".")[0] in ("httpx2", "httpx", "anthropic")}
    modules = loaded_by("from fisk_sm.client import Client\nClient('http://127.0.0.1:9')")
    assert "httpx2" in modules
    assert "fisk_sm.client" not in loaded_by("import fisk_sm")

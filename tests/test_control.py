"""The control API over `HostControl` answers what it answered when it reached into the
supervisor: every route's status and body, byte for byte, against a recording made before the
API was rewritten (tests/fixtures/control/routes.json), over a real supervisor driving real
runs (the real SDK against the fake API, real journals).

What changes from one run of the test to the next is replaced before the comparison, and only
that: each run id by `RUN<n>` (in the order they appear), `created` and `age_seconds`.
Set FISK_RECORD_CONTROL=1 to record anew (only on purpose: the recording is the contract).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from test_supervisor import agent, until

from fisk_sm.journal.filestore import FileStore
from fisk_sm.supervisor import Supervisor
from fisk_sm.supervisor.api import build_app
from fisk_sm.testing import FakeMessagesAPI, Reply

RECORDING = Path(__file__).parent / "fixtures" / "control" / "routes.json"
CONVERSATIONS = {
    "deploy": [Reply.tool_use("deploy", {"target": "prod"}, id="toolu_d"), Reply.text("done")],
    "chat": [Reply.text("hello"), Reply.text("again")],
    "hold": [Reply.tool_use("deploy", {"target": "x"}, id="toolu_h"), Reply.text("held")],
    "look": [Reply.tool_use("look", {"what": "sky"}, id="toolu_l"), Reply.text("blue")],
}
CREATED = re.compile(r'"created": ?"[0-9TZ:-]+"')
AGE = re.compile(r'"age_seconds": ?[0-9.e-]+')
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")


class Recorder:
    """Sends requests to the app and keeps each answer, its run ids replaced in order."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self.client = client
        self.ids: dict[str, str] = {}
        self.answers: list[list[Any]] = []

    def _id(self, found: re.Match[str]) -> str:
        return self.ids.setdefault(found.group(0), f"RUN{len(self.ids) + 1}")

    def normal(self, text: str) -> str:
        text = CREATED.sub('"created": "C"', AGE.sub('"age_seconds": 0', text))
        for real, alias in self.ids.items():
            text = text.replace(real, alias)
        return text

    async def __call__(self, method: str, path: str, body: Any = None) -> Any:
        for real, alias in self.ids.items():
            path = path.replace(alias, real)
        if method == "POST":
            answer = await self.client.post(path, json=body if body is not None else {})
        else:
            answer = await self.client.get(path)
        text = answer.text
        if answer.headers.get("content-type", "").startswith("application/json"):
            for run_id in _run_ids(answer.json()):
                self.ids.setdefault(run_id, f"RUN{len(self.ids) + 1}")
        kind = answer.headers.get("content-type", "").split(";")[0]
        shown = [method, self.normal(path), answer.status_code, kind, self.normal(text)]
        self.answers.append(shown)
        return answer.json() if kind == "application/json" else text


def _run_ids(value: Any) -> list[str]:
    if isinstance(value, dict):
        run_id = value.get("run_id")
        found = [run_id] if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else []
        return found + [i for v in value.values() for i in _run_ids(v)]
    if isinstance(value, list):
        return [i for v in value for i in _run_ids(v)]
    return []


async def scenario(sup: Supervisor, send: Recorder) -> None:
    """Every route, answered and refused."""
    status: Callable[[str], str] = lambda run_id: sup.get(run_id).status  # noqa: E731
    await send("GET", "/openapi.json")
    deploy = (await send("POST", "/api/runs", {"prompt": "deploy", "name": "d1"}))["run_id"]
    await until(lambda: status(deploy) == "parked", "the gated run to park")
    await send("GET", "/api/runs")
    await send("GET", f"/api/runs/{send.ids[deploy]}")
    await send("GET", "/api/approvals")
    await send("GET", f"/api/runs/{send.ids[deploy]}/diagram.svg")
    await send("POST", f"/api/runs/{send.ids[deploy]}/approvals/toolu_d", {"answer": "maybe"})
    await send("POST", f"/api/runs/{send.ids[deploy]}/approvals/toolu_x", {"answer": "once"})
    await send("POST", f"/api/runs/{send.ids[deploy]}/say", {"text": "hi"})
    await send("POST", f"/api/runs/{send.ids[deploy]}/end")
    await send("POST", f"/api/runs/{send.ids[deploy]}/approvals/toolu_d", {"answer": "once"})
    await until(lambda: status(deploy) == "completed", "the answered run to complete")
    await send("POST", f"/api/runs/{send.ids[deploy]}/approvals/toolu_d", {"answer": "deny"})
    await send("GET", f"/api/runs/{send.ids[deploy]}")
    await send("POST", f"/api/runs/{send.ids[deploy]}/suspend")
    await send("POST", f"/api/runs/{send.ids[deploy]}/abort")

    chat = (await send("POST", "/api/runs", {"prompt": "chat", "chat": True}))["run_id"]
    await until(lambda: status(chat) == "waiting", "the chat to wait")
    await send("POST", f"/api/runs/{send.ids[chat]}/say", {"text": "more"})
    await until(lambda: len(sup.get(chat).messages()) == 4, "the chat's second answer")
    await until(lambda: status(chat) == "waiting", "the chat to wait again")
    await send("POST", f"/api/runs/{send.ids[chat]}/end")
    await until(lambda: status(chat) == "completed", "the chat to end")
    await send("GET", f"/api/runs/{send.ids[chat]}")

    hold = (await send("POST", "/api/runs", {"prompt": "hold", "name": "h"}))["run_id"]
    await until(lambda: status(hold) == "parked", "the held run to park")
    await send("POST", f"/api/runs/{send.ids[hold]}/suspend")
    await until(lambda: not sup.get(hold).live, "the suspended run's task to stop")
    await send("GET", f"/api/runs/{send.ids[hold]}")
    await send("POST", f"/api/runs/{send.ids[hold]}/approvals/toolu_h", {"answer": "once"})
    await send("POST", f"/api/runs/{send.ids[hold]}/resume")
    await until(lambda: status(hold) == "parked", "the resumed run to park again")
    await send("POST", f"/api/runs/{send.ids[hold]}/resume")
    await send("POST", f"/api/runs/{send.ids[hold]}/abort")
    await until(lambda: not sup.get(hold).live, "the aborted run's task to stop")
    await send("GET", "/api/approvals")

    look = (await send("POST", "/api/runs", {"prompt": "look", "name": "l"}))["run_id"]
    await until(lambda: status(look) == "completed", "the looking run to complete")
    await send("GET", f"/api/runs/{send.ids[look]}")
    await send("GET", "/api/runs")

    for path in ("/api/runs/nope-1", "/api/runs/../x", "/api/runs/nope-1/diagram.svg"):
        await send("GET", path)
    await send("GET", "/api/events?run=nope-1")
    await send("GET", "/api/events?run=..")
    await send("GET", "/api/events?last_event_id=zz")
    for action in ("suspend", "resume", "abort", "end"):
        await send("POST", f"/api/runs/nope-1/{action}")
    await send("POST", "/api/runs/nope-1/say", {"text": "x"})
    await send("POST", "/api/runs", {"prompt": " "})
    await send("POST", "/api/runs", {"prompt": "x", "chat": "yes"})
    await send("POST", "/api/runs", {"prompt": "x", "config": "/etc/passwd"})


async def answers(tmp_path: Path) -> list[list[Any]]:
    os.environ.setdefault("ANTHROPIC_API_KEY", "test")
    with FakeMessagesAPI(conversations=CONVERSATIONS) as api:
        sup = Supervisor(agent(tmp_path, api), FileStore(tmp_path / "state"))
        await sup.start()
        try:
            transport = httpx2.ASGITransport(app=build_app(sup))
            base = "http://127.0.0.1:8"
            async with httpx2.AsyncClient(transport=transport, base_url=base) as client:
                send = Recorder(client)
                await scenario(sup, send)
        finally:
            await sup.shutdown()
        await asyncio.sleep(0)
    return send.answers


async def test_local_control_answers_the_same_json_as_before(tmp_path: Path) -> None:
    got = await answers(tmp_path)
    if os.environ.get("FISK_RECORD_CONTROL"):
        RECORDING.parent.mkdir(parents=True, exist_ok=True)
        RECORDING.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    recorded = json.loads(RECORDING.read_text())
    assert len(got) == len(recorded)
    for answer, before in zip(got, recorded, strict=True):
        assert answer == before

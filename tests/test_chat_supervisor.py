"""A supervisor chat: `POST /api/runs/{id}/say` and `fisk-sm ctl say` post a follow-up to a
chat run waiting in `awaiting_input`, against a real `fisk-sm supervise` on loopback."""

from __future__ import annotations

from pathlib import Path

from ctlkit import Supervisor, ctl, wait_until

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Meta, User
from fisk_sm.testing import FakeMessagesAPI, Reply


def test_a_chat_run_takes_follow_ups_over_the_api_and_ctl_say(
    tmp_path: Path, api: FakeMessagesAPI
) -> None:
    api.add_conversation("hello", Reply.text("one"), Reply.text("two"), Reply.text("three"))
    with Supervisor(tmp_path, api) as sup:
        done = ctl(sup.url, "submit", "hello", "--chat", "--name", "talk")
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()

        def at_input() -> bool:
            return sup.run(run_id)["state"] == "awaiting_input"

        wait_until(at_input, "the chat to wait for input")
        status, body = sup.api("POST", f"/api/runs/{run_id}/say", {"text": "and then?"})
        assert status == 202, body
        wait_until(lambda: len(api.requests) == 2 and at_input(), "the second answer")
        said = ctl(sup.url, "say", run_id, "more")
        assert said.returncode == 0, said.stderr
        assert said.stdout.strip() == f"{run_id}: follow-up posted"
        wait_until(lambda: len(api.requests) == 3 and at_input(), "the third answer")
        # a run that is not waiting for input refuses a follow-up; an empty one is bad input
        status, body = sup.api("POST", f"/api/runs/{run_id}/say", {"text": " "})
        assert (status, body) == (400, {"error": "text: must not be empty"})
        status, body = sup.api("POST", f"/api/runs/{run_id}/say", {})
        assert (status, body) == (400, {"error": "text: required"})
        status, body = sup.api("POST", "/api/runs", {"prompt": "x", "chat": "yes"})
        assert (status, body) == (400, {"error": "chat: must be a boolean, not str"})
        assert ctl(sup.url, "suspend", run_id).returncode == 0
        sup.wait_status(run_id, "suspended")
        refused = ctl(sup.url, "say", run_id, "too late")
        assert refused.returncode == 1
        assert "is not waiting for input" in refused.stderr
    assert [r["messages"][-1] for r in api.requests] == [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "and then?"},
        {"role": "user", "content": "more"},
    ]
    assert len(api.requests[2]["messages"]) == 5  # the whole conversation before it
    records = FileStore(tmp_path / "state").load(run_id)
    assert isinstance(records[0], Meta) and records[0].interactive
    assert [r.message["content"] for r in records if isinstance(r, User)] == ["and then?", "more"]

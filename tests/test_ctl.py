"""`fisk-sm ctl` against a real `fisk-sm supervise` (a subprocess on loopback).

The runs call a tool tagged `ai:confirm`, so each parks in `awaiting_approval` until `ctl
approve` answers; the tool's side-effect file and the fake Messages API's requests show what
really happened. Every command is the real `python -m fisk_sm.cli ctl` in a subprocess, and
every failure is checked for its exit code and its one line: cannot connect (69), token refused
(77), unknown run or wrong state (1), bad arguments (2). Hostile model text (CSI and OSC
sequences in a run's name, prompt and answer) never reaches the output as a control sequence.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crashkit import Lines
from ctlkit import CLI, DEADLINE, Supervisor, ctl

from fisk_sm.cli.ctl_client import read_events
from fisk_sm.cli.ctl_format import event_line, runs_table, show_run
from fisk_sm.testing import FakeMessagesAPI, Reply, first_user_text, turn_of

#: A terminal-rewriting payload: retitle (OSC), recolour and clear the screen (CSI), a C1 CSI.
HOSTILE = "\x1b]0;pwned\x07\x1b[31m\x1b[2Jred\x9b1mX"
CONTROL = ("\x1b", "\x07", "\x9b")


def deploy_then(answer: str, target: str = "prod") -> list[Reply]:
    """The model calls the gated `deploy` once, then answers."""
    return [Reply.tool_use("deploy", {"target": target}), Reply.text(answer)]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def sup(api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with Supervisor(tmp_path_factory.mktemp("ctl"), api) as supervisor:
        yield supervisor
    assert supervisor.process is not None and supervisor.process.returncode == 0


def parked(sup: Supervisor, run_id: str) -> dict[str, Any]:
    """Wait until the run waits for an approval; its pending Approval."""
    run = sup.wait_status(run_id, "parked")
    assert run["state"] == "awaiting_approval"
    assert run["approval"] is not None
    return dict(run["approval"])


def submit(sup: Supervisor, prompt: str, *extra: str) -> str:
    done = ctl(sup.url, "submit", prompt, *extra)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert run_id and "\n" not in run_id
    return run_id


def test_submit_ls_show_approve_once_completes_the_run(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    prompt = "deploy to prod, once"
    api.add_conversation(prompt, *deploy_then("deployed, all done"))
    run_id = submit(sup, prompt, "--name", "first deploy")
    approval = parked(sup, run_id)
    assert approval["tool"] == "deploy" and approval["input"] == {"target": "prod"}
    assert sup.effects_lines() == []  # parked: the tool has not run

    listed = ctl(sup.url, "ls")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(run_id))
    assert row.split()[1:3] == ["first", "deploy"] or "first deploy" in row
    assert "parked" in row and "awaiting_approval" in row and "deploy" in row.split()[-1]
    assert listed.stdout.splitlines()[0].split() == [
        "RUN", "NAME", "STATUS", "STATE", "ITER", "TOKENS", "AGE", "APPROVAL",
    ]  # fmt: skip

    pending = ctl(sup.url, "approvals")
    assert pending.returncode == 0, pending.stderr
    assert any(
        line.startswith(run_id) and approval["tool_use_id"] in line and '{"target":"prod"}' in line
        for line in pending.stdout.splitlines()
    ), pending.stdout

    shown = ctl(sup.url, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"run        {run_id}" in shown.stdout
    assert "state      awaiting_approval" in shown.stdout
    assert f"deploy ({approval['tool_use_id']}, tag ai:confirm)" in shown.stdout
    assert "assistant tool_use deploy" in shown.stdout
    assert "path       suspend_check > call" in shown.stdout

    answered = ctl(sup.url, "approve", run_id, approval["tool_use_id"], "once")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout == f"{run_id}: answered once ({approval['tool_use_id']})\n"
    run = sup.wait_status(run_id, "completed")
    assert run["answer"] == "deployed, all done"
    assert sup.effects_lines().count("prod") >= 1
    # The model got the tool's real result.
    result = api.requests_for(prompt)[-1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and "deployed to prod" in json.dumps(result)

    shown = ctl(sup.url, "show", run_id)
    assert "status     completed" in shown.stdout
    assert "answer     deployed, all done" in shown.stdout
    assert "user tool_result" in shown.stdout and "deployed to prod" in shown.stdout

    again = ctl(sup.url, "approve", run_id, approval["tool_use_id"], "once")
    assert again.returncode == 1, (again.returncode, again.stderr)
    assert again.stderr.startswith("fisk-sm ctl: the supervisor answered 40")
    assert len(again.stderr.splitlines()) == 1


def test_deny_gives_the_model_the_denial_and_runs_nothing(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    prompt = "deploy to staging, but you will be denied"
    api.add_conversation(prompt, *deploy_then("fine, not deployed", target="staging"))
    run_id = submit(sup, prompt)
    approval = parked(sup, run_id)
    done = ctl(sup.url, "approve", run_id, approval["tool_use_id"], "deny")
    assert done.returncode == 0, done.stderr
    assert sup.wait_status(run_id, "completed")["answer"] == "fine, not deployed"
    assert "staging" not in sup.effects_lines()
    result = api.requests_for(prompt)[-1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and not result.get("is_error")
    denial = json.loads(result["content"] if isinstance(result["content"], str) else
                        result["content"][0]["text"])  # fmt: skip
    assert denial["allowed"] is False and denial["reason"]


def test_suspend_resume_abort_and_wrong_state(sup: Supervisor, api: FakeMessagesAPI) -> None:
    prompt = "deploy to qa, to be suspended"
    api.add_conversation(prompt, *deploy_then("never", target="qa"))
    run_id = submit(sup, prompt)
    approval = parked(sup, run_id)

    suspended = ctl(sup.url, "suspend", run_id)
    assert suspended.returncode == 0, suspended.stderr
    assert suspended.stdout.startswith(f"{run_id}: suspend requested; status ")
    run = sup.wait_status(run_id, "suspended")
    assert run["approval"] is not None  # a suspend never answers the approval

    resumed = ctl(sup.url, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert parked(sup, run_id)["tool_use_id"] == approval["tool_use_id"]

    aborted = ctl(sup.url, "abort", run_id)
    assert aborted.returncode == 0, aborted.stderr
    sup.wait_status(run_id, "aborted")
    assert "qa" not in sup.effects_lines()

    wrong = ctl(sup.url, "resume", run_id)  # an aborted run cannot be resumed
    assert wrong.returncode == 1, (wrong.returncode, wrong.stderr)
    assert wrong.stderr.startswith("fisk-sm ctl: the supervisor answered 409: ")
    assert len(wrong.stderr.splitlines()) == 1


def test_events_follow_shows_each_step_and_json_is_the_servers(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    prompt = "deploy to dev, watched"
    api.add_conversation(prompt, *deploy_then("watched and done", target="dev"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    follow = subprocess.Popen(
        [*CLI, "ctl", "events", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "FISK_SM_URL": sup.url},  # found through $FISK_SM_URL
    )
    raw = subprocess.Popen(
        [*CLI, "ctl", "--url", sup.url, "--json", "events", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert follow.stdout is not None and raw.stdout is not None
        lines, objects = Lines(follow.stdout), Lines(raw.stdout)
        for reader in (follow, raw):  # subscribed: no event of the run can be missed
            assert reader.stderr is not None
            Lines(reader.stderr).wait_for(f"following the events of {sup.url}", DEADLINE)
        run_id = submit(sup, prompt)
        approval = parked(sup, run_id)
        asked = lines.wait_for(f"{run_id} ApprovalAsked", DEADLINE)
        assert "tool=deploy" in asked and f"tool_use_id={approval['tool_use_id']}" in asked
        assert ctl(sup.url, "approve", run_id, approval["tool_use_id"], "once").returncode == 0
        granted = lines.wait_for(f"{run_id} ApprovalGranted", DEADLINE)
        assert "answer=once" in granted
        lines.wait_for(f"{run_id} ToolFinished", DEADLINE)
        ended = lines.wait_for(f"{run_id} RunEnded", DEADLINE)
        assert "state=completed" in ended
        assert ended[:8].count(":") == 2 and ended[8] == " "  # HH:MM:SS first
        objects.wait_for('"RunEnded"', DEADLINE)
    finally:
        follow.terminate()
        raw.terminate()
        follow.wait(DEADLINE)
        raw.wait(DEADLINE)
    parsed = [json.loads(line) for line in objects.text().splitlines()]
    mine = [p for p in parsed if p.get("run_id") == run_id]
    kinds = [p.get("type") for p in mine]
    for kind in ("ApprovalAsked", "ApprovalGranted", "ToolCalled", "ToolFinished", "RunEnded"):
        assert kind in kinds, kinds
    assert kinds.index("ApprovalAsked") < kinds.index("ApprovalGranted") < kinds.index("RunEnded")

    listed = ctl(sup.url, "--json", "ls")
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)["runs"]
    assert run_id in [r["run_id"] for r in runs]
    shown = json.loads(ctl(sup.url, "show", run_id, "--json").stdout)  # --json after it too
    served = sup.run(run_id)
    assert shown.keys() == served.keys() and shown.pop("age_seconds") <= served.pop("age_seconds")
    assert shown == served


def test_events_without_follow_stop_when_the_run_stops(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    prompt = "deploy to edge, held at the first call"
    release = threading.Event()

    def held(body: dict[str, Any]) -> Reply:  # the first call waits until the test says
        assert first_user_text(body) == prompt
        if turn_of(body) == 0:
            release.wait(DEADLINE)
            return Reply.tool_use("deploy", {"target": "edge"})
        return Reply.text("edge done")

    api.responder = held
    try:
        run_id = submit(sup, prompt)
        assert sup.wait_status(run_id, "running")["state"] == "call"
        watch = subprocess.Popen(
            [*CLI, "ctl", "--url", sup.url, "events", "--run", run_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert watch.stdout is not None and watch.stderr is not None
        lines = Lines(watch.stdout)
        Lines(watch.stderr).wait_for("until 1 run(s) stop", DEADLINE)
        release.set()
        assert watch.wait(DEADLINE) == 0  # it stops by itself once the run parks
        shown = lines.text().splitlines()
        assert all(f" {run_id} " in line for line in shown), shown
        kinds = [line.split()[2] for line in shown]
        assert kinds[-1] == "RunParked" and "ApprovalAsked" in kinds, shown
        assert any("StateEntered state=awaiting_approval" in line for line in shown), shown
        # A run that is already stopped: nothing to wait for.
        idle = ctl(sup.url, "events", "--run", run_id)
        assert idle.returncode == 0 and idle.stdout == "", idle
        approval = parked(sup, run_id)
        assert ctl(sup.url, "approve", run_id, approval["tool_use_id"], "once").returncode == 0
        assert sup.wait_status(run_id, "completed")["answer"] == "edge done"
    finally:
        release.set()
        api.responder = None


def test_hostile_text_never_reaches_the_output_as_control_sequences(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    prompt = f"deploy {HOSTILE} please"
    api.add_conversation(prompt, Reply.text(f"answer {HOSTILE} end"))
    run_id = submit(sup, prompt, "--name", f"name{HOSTILE}")
    sup.wait_status(run_id, "completed")
    for args in (["ls"], ["show", run_id]):
        done = ctl(sup.url, *args)
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in CONTROL), repr(done.stdout)
        assert "name]0;pwned" not in done.stdout
    shown = ctl(sup.url, "show", run_id).stdout
    assert "answer     answer redX end" in shown
    assert "namered" in ctl(sup.url, "ls").stdout
    # --json is the server's JSON, byte for byte when stdout is not a terminal.
    raw = ctl(sup.url, "--json", "show", run_id).stdout
    assert json.loads(raw)["answer"] == f"answer {HOSTILE} end"


def test_error_exit_codes(sup: Supervisor, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = ctl(dead, "ls")
    assert down.returncode == 69, down
    assert down.stderr.startswith(f"fisk-sm ctl: cannot connect to the supervisor at {dead}: ")
    assert "refused" in down.stderr
    assert len(down.stderr.splitlines()) == 1 and "Traceback" not in down.stderr
    # $FISK_SM_URL when there is no --url
    assert ctl(None, "ls", FISK_SM_URL=dead).returncode == 69
    assert ctl(None, "ls", FISK_SM_URL=sup.url).returncode == 0

    missing = ctl(sup.url, "show", "no-such-run")
    assert missing.returncode == 1, missing
    assert missing.stderr.startswith("fisk-sm ctl: the supervisor answered 404: ")
    assert ctl(sup.url, "approve", "no-such-run", "toolu_x", "once").returncode == 1

    for args in (
        ["approve", "r", "t", "maybe"],  # not an answer
        ["suspend", "../../api/runs"],  # not a run id: it would step out of /api/runs/
        ["approve", "r", "../../../openapi.json", "once"],
        ["events", "--run", "a/b"],
        ["show"],  # no run
        [],  # no command
        ["frobnicate"],
        ["--url", "ftp://127.0.0.1/", "ls"],
        ["--url", "http://127.0.0.1:99999", "ls"],
        ["--token", "a b\r\nX-Evil: 1", "ls"],
    ):
        bad = ctl(sup.url if "--url" not in args else None, *args)
        assert bad.returncode == 2, (args, bad)
        assert "Traceback" not in bad.stderr and bad.stderr.strip(), (args, bad.stderr)


def test_token_refused_is_77(api: FakeMessagesAPI, tmp_path: Path) -> None:
    with Supervisor(tmp_path, api, token="s3cret-token") as sup:
        assert ctl(sup.url, "ls").returncode == 77
        wrong = ctl(sup.url, "--token", "nope", "ls")
        assert wrong.returncode == 77, wrong
        assert wrong.stderr.startswith("fisk-sm ctl: the supervisor answered 401")
        assert len(wrong.stderr.splitlines()) == 1
        assert ctl(sup.url, "--token", "s3cret-token", "ls").returncode == 0
        assert ctl(sup.url, "ls", FISK_SM_TOKEN="s3cret-token").returncode == 0
        assert ctl(sup.url, "events", "--follow", FISK_SM_TOKEN="wrong").returncode == 77


def test_events_follow_says_when_the_supervisor_goes_away(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    sup = Supervisor(tmp_path, api).start()
    follow = subprocess.Popen(
        [*CLI, "ctl", "--url", sup.url, "events", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stderr is not None
    said = Lines(follow.stderr)
    said.wait_for("following the events of", DEADLINE)
    assert sup.stop() == 0
    assert follow.wait(DEADLINE) == 69
    assert f"fisk-sm ctl: the supervisor at {sup.url} closed the event stream" in said.text()


def test_help_explains_every_command() -> None:
    done = ctl(None, "--help")
    assert done.returncode == 0
    for word in ("submit", "ls", "show", "suspend", "resume", "abort", "approve", "approvals",
                 "events", "--follow", "$FISK_SM_URL", "69", "77"):  # fmt: skip
        assert word in done.stdout, word
    for command in ("submit", "show", "approve", "events"):
        sub = ctl(None, command, "--help")
        assert sub.returncode == 0 and "--json" in sub.stdout and "--url" in sub.stdout


# The pure parts, without a server.


def test_sse_parser_joins_data_lines_and_skips_comments() -> None:
    stream = [
        b": keep-alive\n",
        b"event: RunUpdated\n",
        b'data: {"a":\n',
        b"data: 1}\r\n",
        b"\n",
        b"data: plain\n",
        b"\n",
        b"event: Tail\n",
        b"data: unterminated\n",
    ]
    assert list(read_events(stream)) == [("RunUpdated", '{"a":\n1}'), ("message", "plain"),
                                  ("Tail", "unterminated")]  # fmt: skip


def test_formatters_strip_control_sequences_from_every_field() -> None:
    evil: dict[str, Any] = {
        "run_id": f"r{HOSTILE}",
        "name": HOSTILE,
        "status": HOSTILE,
        "state": HOSTILE,
        "iteration": 1,
        "tokens": {"total": HOSTILE},
        "approval": {
            "tool": HOSTILE,
            "tool_use_id": HOSTILE,
            "input": {"k": HOSTILE},
            "tag": HOSTILE,
        },
        "outcome": HOSTILE,
        "answer": HOSTILE,
        "path": [HOSTILE],
        "transcript": [{"role": HOSTILE, "kind": HOSTILE, "text": HOSTILE, "name": HOSTILE}],
    }
    for text in (
        runs_table([evil]),
        show_run(evil),
        event_line("RunUpdated", evil),
        event_line("ToolCalled", {**evil, "type": HOSTILE, HOSTILE: HOSTILE}),
    ):
        assert not any(c in text for c in CONTROL), repr(text)
        assert "redX" in text

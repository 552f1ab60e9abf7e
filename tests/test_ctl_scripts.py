"""`fisk-sm ctl` for scripts: `wait`, `approve --all` and `end`, against a real `fisk-sm
supervise` on loopback (tests/ctlkit.py) and the real `python -m fisk_sm.cli ctl`.

The agent has two gated tools, `deploy` and `wipe`, each appending a line to the effects file
when it really runs, so what an answer did is read from that file; a run's end is read from
its journal's terminal record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crashkit import Lines
from ctlkit import CLI, DEADLINE, Supervisor, ctl, http, wait_until

from fisk_sm.cli import ctl_scripts
from fisk_sm.cli.ctl import _run_path
from fisk_sm.cli.ctl_client import Client
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import Terminal
from fisk_sm.testing import FakeMessagesAPI, Reply

WIPE = '''

def wipe(target: str) -> str:
    """Wipe a target."""
    with EFFECTS.open("a") as f:
        f.write("wipe:" + target + "\\n")
    return "wiped " + target
'''


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def sup(api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path_factory.mktemp("scripts"), api)
    with (supervisor.root / "console_tools.py").open("a") as f:
        f.write(WIPE)
    supervisor.agent.write_text(
        supervisor.agent.read_text() + "  - {python: 'console_tools:wipe', tags: ['ai:confirm']}\n"
    )
    with supervisor:
        yield supervisor
    assert supervisor.process is not None and supervisor.process.returncode == 0


def submit(
    sup: Supervisor, api: FakeMessagesAPI, prompt: str, *replies: Reply, chat: bool = False
) -> str:
    api.add_conversation(prompt, *replies)
    done = ctl(sup.url, "submit", prompt, *(["--chat"] if chat else []))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def calls(tool: str, target: str, answer: str) -> tuple[Reply, Reply]:
    """The model calls gated `tool` once, then answers."""
    return Reply.tool_use(tool, {"target": target}), Reply.text(answer)


def terminal(sup: Supervisor, run_id: str) -> Terminal:
    """The run's last record, which must say how it ended."""
    last = FileStore(sup.state).load(run_id)[-1]
    assert isinstance(last, Terminal), last
    return last


def lines(text: str) -> list[str]:
    return text.splitlines()


# -- ctl wait -------------------------------------------------------------------------------


def test_wait_follows_the_stream_until_every_run_completed(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    quick = submit(sup, api, "answer at once", Reply.text("done"))
    parked = submit(sup, api, "deploy w1", *calls("deploy", "w1", "deployed w1"))
    sup.wait_status(parked, "parked")
    waiter = subprocess.Popen(
        [*CLI, "ctl", "--url", sup.url, "wait", quick, parked, quick],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    out = Lines(waiter.stdout)
    # Printed once its status was read, which is after subscribing: from here on the parked
    # run's completion can only reach `wait` through the event stream.
    out.wait_for(f"{quick} completed", DEADLINE)
    assert waiter.poll() is None  # still waiting for the parked one
    answer = ctl(sup.url, "approve", parked, sup.run(parked)["approval"]["tool_use_id"], "once")
    assert answer.returncode == 0, answer
    assert waiter.wait(DEADLINE) == 0, waiter.stderr.read() if waiter.stderr else ""
    out.wait_for(f"{parked} completed", DEADLINE)
    assert lines(out.text()) == [f"{quick} completed", f"{parked} completed"]  # each once
    assert terminal(sup, parked).reason == "completed"


def test_wait_exits_3_when_a_run_fails_and_124_on_timeout(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    ok = submit(sup, api, "fine", Reply.text("fine"))
    bad = submit(sup, api, "breaks", Reply.error(400, "bad request"))
    done = ctl(sup.url, "wait", ok, bad)
    assert done.returncode == 3, done
    assert sorted(lines(done.stdout)) == sorted([f"{ok} completed", f"{bad} failed"])
    assert terminal(sup, bad).reason == "failed"

    parked = submit(sup, api, "deploy t1", *calls("deploy", "t1", "deployed t1"))
    sup.wait_status(parked, "parked")
    timed = ctl(sup.url, "wait", ok, parked, "--timeout", "0.5")
    assert timed.returncode == 124, timed
    assert timed.stdout == f"{ok} completed\n"
    assert timed.stderr.startswith("fisk-sm ctl: timed out after 0.5s; still waiting for ")
    assert parked in timed.stderr and ok not in timed.stderr
    assert ctl(sup.url, "suspend", parked).returncode == 0
    suspended = ctl(sup.url, "wait", parked)
    assert (suspended.returncode, suspended.stdout) == (3, f"{parked} suspended\n")
    assert ctl(sup.url, "abort", parked).returncode == 0
    aborted = ctl(sup.url, "wait", parked)
    assert (aborted.returncode, aborted.stdout) == (3, f"{parked} aborted\n")


def test_wait_until_parked(sup: Supervisor, api: FakeMessagesAPI) -> None:
    first = submit(sup, api, "deploy p1", *calls("deploy", "p1", "deployed p1"))
    second = submit(sup, api, "wipe p2", *calls("wipe", "p2", "wiped p2"))
    done = ctl(sup.url, "wait", "--until", "parked", first, second)
    assert done.returncode == 0, done
    assert sorted(lines(done.stdout)) == sorted([f"{first} parked", f"{second} parked"])
    assert {sup.run(r)["status"] for r in (first, second)} == {"parked"}
    # a run that ends without parking did not get there
    plain = submit(sup, api, "no tools here", Reply.text("plain"))
    missed = ctl(sup.url, "wait", "--until", "parked", plain, "--json")
    assert missed.returncode == 3, missed
    assert json.loads(missed.stdout) == {"run_id": plain, "status": "completed"}
    for run_id in (first, second):
        assert ctl(sup.url, "abort", run_id).returncode == 0


def test_wait_names_an_unknown_run_and_exits_1(sup: Supervisor, api: FakeMessagesAPI) -> None:
    known = submit(sup, api, "known one", Reply.text("known"))
    done = ctl(sup.url, "wait", "20990101T000000-00000000", known)
    assert done.returncode == 1, done
    assert done.stdout == f"{known} completed\n"  # the others are still waited for
    (said,) = lines(done.stderr)
    assert said.startswith("fisk-sm ctl: 20990101T000000-00000000: the supervisor answered 404")


def test_wait_bad_usage_is_2(sup: Supervisor) -> None:
    for args in (
        ["wait"],
        ["wait", "r", "--until", "soon"],
        ["wait", "r", "--timeout", "-1"],
        ["wait", "r", "--timeout", "x"],
        ["wait", "../runs"],
        ["approve", "--all"],
        ["approve", "--all", "r", "t", "once"],
        ["approve", "--all", "maybe"],
        ["approve", "r", "t", "once", "--tool", "deploy"],
        ["approve", "--all", "--run", "a/b", "once"],
        ["end"],
    ):
        bad = ctl(sup.url, *args)
        assert bad.returncode == 2, (args, bad)
        assert "Traceback" not in bad.stderr and bad.stderr.strip(), (args, bad.stderr)


def test_no_supervisor_is_69_and_a_refused_token_77(api: FakeMessagesAPI, tmp_path: Path) -> None:
    done = ctl("http://127.0.0.1:9", "wait", "20990101T000000-00000000")
    assert done.returncode == 69, done
    assert len(lines(done.stderr)) == 1
    with Supervisor(tmp_path, api, token="s3cret-token") as sup:
        run_id = "20990101T000000-00000000"
        for args in (["wait", run_id], ["approve", "--all", "once"], ["end", run_id]):
            refused = ctl(sup.url, "--token", "nope", *args)
            assert refused.returncode == 77, (args, refused)
            assert refused.stderr.startswith("fisk-sm ctl: the supervisor answered 401")
        allowed = ctl(sup.url, "wait", run_id, FISK_SM_TOKEN="s3cret-token")
        assert allowed.returncode == 1, allowed  # through, to the unknown run


# -- ctl approve --all ----------------------------------------------------------------------


def test_approve_all_answers_what_matches(sup: Supervisor, api: FakeMessagesAPI) -> None:
    before = list(sup.effects_lines())
    d1 = submit(sup, api, "deploy a1", *calls("deploy", "a1", "deployed a1"))
    d2 = submit(sup, api, "deploy a2", *calls("deploy", "a2", "deployed a2"))
    w3 = submit(sup, api, "wipe a3", *calls("wipe", "a3", "not wiped a3"))
    w4 = submit(sup, api, "wipe a4", *calls("wipe", "a4", "wiped a4"))
    runs = (d1, d2, w3, w4)
    assert ctl(sup.url, "wait", "--until", "parked", *runs).returncode == 0
    ids = {r: sup.run(r)["approval"]["tool_use_id"] for r in runs}

    denied = ctl(sup.url, "approve", "--all", "--tool", "wipe", "--run", w3, "deny")
    assert denied.returncode == 0, denied
    assert denied.stdout == f"{w3} {ids[w3]} wipe deny\n"
    once = ctl(sup.url, "approve", "--all", "--tool", "deploy", "once")
    assert once.returncode == 0, once
    assert sorted(lines(once.stdout)) == sorted(
        [f"{d1} {ids[d1]} deploy once", f"{d2} {ids[d2]} deploy once"]
    )
    none = ctl(sup.url, "approve", "--all", "--tool", "deploy", "once")
    assert (none.returncode, none.stdout) == (1, "")
    assert none.stderr == "fisk-sm ctl: no pending approval matches\n"
    rest = ctl(sup.url, "approve", "--all", "--json", "always")
    assert rest.returncode == 0, rest
    assert [json.loads(line) for line in lines(rest.stdout)] == [
        {"run_id": w4, "tool_use_id": ids[w4], "tool": "wipe", "answer": "always"}
    ]
    assert ctl(sup.url, "wait", *runs).returncode == 0
    assert sorted(sup.effects_lines()[len(before) :]) == ["a1", "a2", "wipe:a4"]
    assert all(terminal(sup, r).reason == "completed" for r in runs)


def test_approve_all_goes_on_past_one_answered_meanwhile(
    sup: Supervisor, api: FakeMessagesAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    before = list(sup.effects_lines())
    first = submit(sup, api, "deploy r1", *calls("deploy", "r1", "deployed r1"))
    second = submit(sup, api, "deploy r2", *calls("deploy", "r2", "deployed r2"))
    assert ctl(sup.url, "wait", "--until", "parked", first, second).returncode == 0
    taken = sup.run(first)["approval"]["tool_use_id"]

    class Raced(Client):
        """Another operator answers `first` between the listing and the answers."""

        def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
            listing = super().call(method, path, body)
            if path == "/api/approvals":
                status, _ = http("POST", f"{self.url}/api/runs/{first}/approvals/{taken}",
                                 {"answer": "deny"})  # fmt: skip
                assert status == 200
            return listing

    args = argparse.Namespace(only_tools=None, only_runs=[first, second], json=False)
    code = ctl_scripts.approve_all(Raced(sup.url, None), args, _run_path, "once")
    out, err = capsys.readouterr()
    assert code == 1
    assert [line.split()[0] for line in lines(out)] == [second]
    (said,) = lines(err)
    # 409 (already answered) or, once its run moved on, 404 (no such pending approval)
    assert re.match(f"fisk-sm ctl: {first} {taken}: the supervisor answered (409|404): ", said)
    assert ctl(sup.url, "wait", first, second).returncode == 0
    assert sup.effects_lines()[len(before) :] == ["r2"]  # r1 was denied by the other


# -- ctl end ----------------------------------------------------------------------------------


def test_end_ends_a_chat_as_completed(sup: Supervisor, api: FakeMessagesAPI) -> None:
    chat = submit(sup, api, "let us chat", Reply.text("hello there"), chat=True)
    sup.wait_status(chat, "waiting")
    ended = ctl(sup.url, "end", chat)
    assert ended.returncode == 0, ended
    assert ended.stdout.startswith(f"{chat}: end requested; status ")
    assert ctl(sup.url, "wait", chat).stdout == f"{chat} completed\n"
    assert terminal(sup, chat).reason == "completed"
    assert sup.run(chat)["answer"] == "hello there"
    again = ctl(sup.url, "end", chat)
    assert again.returncode == 1 and "has ended" in again.stderr


def test_end_mid_turn_waits_for_the_next_prompt(sup: Supervisor, api: FakeMessagesAPI) -> None:
    before = list(sup.effects_lines())
    chat = submit(sup, api, "chat and deploy", *calls("deploy", "m1", "deployed m1"), chat=True)
    approval = sup.wait_status(chat, "parked")["approval"]
    status, body = sup.api("POST", f"/api/runs/{chat}/end", {})
    assert status == 202 and body["run_id"] == chat and body["status"] == "parked"
    assert ctl(sup.url, "approve", chat, approval["tool_use_id"], "once").returncode == 0
    assert ctl(sup.url, "wait", chat).returncode == 0
    assert sup.effects_lines()[len(before) :] == ["m1"]  # the turn finished first
    assert terminal(sup, chat).reason == "completed"
    assert sup.run(chat)["answer"] == "deployed m1"


def test_end_refuses_what_is_not_a_running_chat(sup: Supervisor, api: FakeMessagesAPI) -> None:
    one_shot = submit(sup, api, "one shot deploy", *calls("deploy", "o1", "deployed o1"))
    sup.wait_status(one_shot, "parked")
    status, body = sup.api("POST", f"/api/runs/{one_shot}/end", {})
    assert status == 409 and "is not a chat" in body["error"]
    refused = ctl(sup.url, "end", one_shot)
    assert refused.returncode == 1
    assert refused.stderr.startswith("fisk-sm ctl: the supervisor answered 409: ")
    assert sup.run(one_shot)["status"] == "parked"  # untouched
    assert ctl(sup.url, "abort", one_shot).returncode == 0
    status, body = sup.api("POST", f"/api/runs/{one_shot}/end", {})
    assert status == 409 and "has ended" in body["error"]
    status, body = sup.api("POST", "/api/runs/20990101T000000-00000000/end", {})
    assert status == 404
    chat = submit(sup, api, "chat to suspend", Reply.text("hi"), chat=True)
    sup.wait_status(chat, "waiting")
    assert ctl(sup.url, "suspend", chat).returncode == 0
    sup.wait_status(chat, "suspended")
    status, body = sup.api("POST", f"/api/runs/{chat}/end", {})
    assert status == 409 and "resume it first" in body["error"]


# -- help ---------------------------------------------------------------------------------------


def test_help_lists_the_script_commands() -> None:
    done = ctl(None, "--help")
    assert done.returncode == 0
    for word in ("wait RUN...", "--until", "approve --all", "end RUN", "124"):
        assert word in done.stdout, word
    waited = ctl(None, "wait", "--help")
    assert waited.returncode == 0
    table = waited.stdout.split("exit codes:\n", 1)[1]
    for code in ("0", "3", "124", "1", "2"):
        assert f"\n  {code} " in "\n" + table, code
    assert "69 no supervisor" in table and "77 the token" in table


# -- a dropped stream -----------------------------------------------------------------------


class Proxy:
    """A loopback TCP proxy whose connections a test can cut: each is noted with the request
    line it began with."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.upstream = ("", 0)
        self.lock = threading.Lock()
        self.connections: list[tuple[str, socket.socket, socket.socket]] = []
        #: The request headers of each connection, lower-cased names.
        self.headers: list[dict[str, str]] = []

    def start(self, upstream_url: str) -> Proxy:
        host, _, port = upstream_url.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        first = client.recv(65536)
        line, *fields = first.split(b"\r\n\r\n")[0].decode().split("\r\n")
        with self.lock:
            self.connections.append((line, client, upstream))
            self.headers.append(
                {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
            )
        upstream.sendall(first)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def requests(self) -> list[str]:
        with self.lock:
            return [line for line, _, _ in self.connections]

    def cut(self, prefix: str) -> int:
        """Cut every connection whose request line starts with `prefix`; how many."""
        with self.lock:
            found = [c for c in self.connections if c[0].startswith(prefix)]
        for _, client, upstream in found:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        return len(found)

    def close(self) -> None:
        self.listener.close()
        self.cut("")


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:  # cut
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def test_wait_reconnects_after_the_last_event_when_the_stream_drops(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    proxy = Proxy()
    allow = ("--allow-host", f"127.0.0.1:{proxy.port}")
    with Supervisor(tmp_path, api, args=allow) as sup:
        proxy.start(sup.url)
        first = submit(sup, api, "deploy c1", *calls("deploy", "c1", "deployed c1"))
        second = submit(sup, api, "deploy c2", *calls("deploy", "c2", "deployed c2"))
        ids = {r: sup.wait_status(r, "parked")["approval"]["tool_use_id"] for r in (first, second)}
        waiter = subprocess.Popen(
            [*CLI, "ctl", "--url", proxy.url, "wait", first, second],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stdout is not None and waiter.stderr is not None
        out = Lines(waiter.stdout)
        wait_until(lambda: "GET /api/runs/" + second in " ".join(proxy.requests()), "the reads")
        assert ctl(sup.url, "approve", first, ids[first], "once").returncode == 0
        out.wait_for(f"{first} completed", DEADLINE)  # through the stream, ids and all
        assert proxy.cut("GET /api/events") == 1
        assert ctl(sup.url, "approve", second, ids[second], "once").returncode == 0
        assert waiter.wait(DEADLINE) == 0, waiter.stderr.read()
        assert lines(out.text()) == [f"{first} completed", f"{second} completed"]
    proxy.close()
    streams = [
        (line, headers)
        for line, headers in zip(proxy.requests(), proxy.headers, strict=True)
        if line.startswith("GET /api/events")
    ]
    assert [line for line, _ in streams] == ["GET /api/events HTTP/1.1"] * 2
    assert "last-event-id" not in streams[0][1]
    # the second began after the last event the first one brought
    assert re.fullmatch(r"[0-9a-f]+-[0-9]+", streams[1][1]["last-event-id"]), streams

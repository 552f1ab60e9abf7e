"""Resumable events: `GET /api/events` numbers every event (`id: <boot>-<seq>`), keeps the last
N, and a reader that reconnects with `Last-Event-ID` gets what it missed, or `EventsGap`.

A real `fisk-sm supervise` (a subprocess; tests/ctlkit.py) is reached through a loopback TCP
proxy that the test cuts (the connections are reset, and the proxy refuses new ones until the
test releases it), while more events are published. The readers, `fisk_sm.client` and the real
`fisk-sm ctl events --follow`, must come back with the last id they read and have missed
nothing and repeated nothing: their events are compared with a reader that was never cut, and
their ids with the hub's sequence, which has no hole (one sequence for every run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crashkit import Lines
from ctlkit import CLI, DEADLINE, Supervisor, wait_until

from fisk_sm.client import AsyncClient, Client, EventsGap, StreamEvent
from fisk_sm.testing import FakeMessagesAPI, Reply


class Proxy:
    """A loopback TCP proxy to `port` (set `target` before the first connection; the proxy's
    address is a Host the supervisor must be told to answer: `--allow-host`): `cut()` resets
    every connection through it and refuses new ones until `release()`."""

    def __init__(self, port: int = 0) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.held = threading.Event()
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.held.is_set():
                _reset(client)  # no other thread has it: a reset, at once
                continue
            upstream = socket.create_connection(self.target)
            pair = (client, upstream)
            ends = [2]  # the second pump to end closes the pair: no close under a reader
            with self.lock:
                self.pairs.append(pair)
                self.accepted += 1
            for a, b in (pair, pair[::-1]):
                threading.Thread(target=self._pump, args=(a, b, pair, ends), daemon=True).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        pair: tuple[socket.socket, socket.socket],
        ends: list[int],
    ) -> None:
        with contextlib.suppress(OSError):  # cut
            while data := src.recv(65536):
                dst.sendall(data)
        _shut(pair)
        with self.lock:
            ends[0] -= 1
            last = ends[0] == 0
        if last:
            for s in pair:
                s.close()

    def cut(self) -> None:
        """Kill every connection now, in the middle of whatever it was sending, and refuse new
        ones until `release`."""
        self.held.set()
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            _shut(pair)  # wakes both pumps, which close the pair

    def release(self) -> None:
        """Let connections through again."""
        self.held.clear()

    def close(self) -> None:
        """Stop listening and cut what is open."""
        self.listener.close()
        self.cut()


def _shut(pair: tuple[socket.socket, socket.socket]) -> None:
    """End both connections of `pair` at once (waking any thread reading them)."""
    for s in pair:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def _reset(sock: socket.socket) -> None:
    """Close `sock` with a reset (no orderly end)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Tail:
    """The lines of a child's stream as they come (`Lines.text` waits for the end)."""

    def __init__(self, stream: Iterable[str]) -> None:
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def holding(self, text: str) -> str:
        """Wait for the first line holding `text`."""
        return wait_until(lambda: next((x for x in list(self.lines) if text in x), None), text)


def deploy(target: str) -> list[Reply]:
    return [Reply.tool_use("deploy", {"target": target}), Reply.text("done")]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture(scope="module")
def proxied(
    api: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Supervisor, Proxy]]:
    with proxied_supervisor(tmp_path_factory.mktemp("resume"), api) as both:
        yield both


@pytest.fixture
def sup(proxied: tuple[Supervisor, Proxy]) -> Supervisor:
    return proxied[0]


@pytest.fixture
def proxy(proxied: tuple[Supervisor, Proxy]) -> Iterator[Proxy]:
    yield proxied[1]
    proxied[1].release()


@contextlib.contextmanager
def proxied_supervisor(
    root: Path, api: FakeMessagesAPI, *args: str
) -> Iterator[tuple[Supervisor, Proxy]]:
    """A supervisor that also answers under the address of a proxy to it."""
    proxy = Proxy()
    allow = ("--allow-host", f"127.0.0.1:{proxy.port}")
    try:
        with Supervisor(root, api, args=(*allow, *args)) as supervisor:
            proxy.target = ("127.0.0.1", int(supervisor.url.rsplit(":", 1)[1]))
            yield supervisor, proxy
    finally:
        proxy.close()


def now_id(url: str) -> str:
    """The id of the supervisor's latest event: the id of the gap a made-up id gets."""
    with Client(url) as client:
        stream = client.events(last_event_id="0-0")
        gap = next(stream)
        stream.close()
    assert isinstance(gap, EventsGap) and gap.id
    return gap.id


def seq(event_id: str | None) -> int:
    assert event_id is not None
    return int(event_id.split("-")[1])


class Reader(threading.Thread):
    """Reads `events(last_event_id=after)` at `url` (sync or async client) until it has read
    a RunParked of `stop_at`'s run, into `events`."""

    def __init__(self, url: str, after: str, stop_at: str, use_async: bool = False) -> None:
        super().__init__(daemon=True)
        self.url, self.after, self.use_async = url, after, use_async
        self.stop_at = stop_at
        self.events: list[StreamEvent] = []
        self.error: BaseException | None = None

    def done(self, event: StreamEvent) -> bool:
        self.events.append(event)
        return event.name == "RunParked" and event.data.get("name") == self.stop_at

    def run(self) -> None:
        try:
            if self.use_async:
                asyncio.run(self._async())
                return
            with Client(self.url, retries=50, backoff=0.05) as client:
                for event in client.events(last_event_id=self.after):
                    if self.done(event):
                        return
        except BaseException as exc:  # handed to the test's thread, which fails with it
            self.error = exc

    async def _async(self) -> None:
        async with AsyncClient(self.url, retries=50, backoff=0.05) as client:
            stream = client.events(last_event_id=self.after)
            async for event in stream:
                if self.done(event):
                    break
            await stream.aclose()


def submit_and_park(sup: Supervisor, api: FakeMessagesAPI, name: str) -> str:
    api.add_conversation(f"resume: {name}", *deploy(name))
    run_id = sup.submit(f"resume: {name}", name=name)
    sup.wait_status(run_id, "parked")
    return run_id


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_client_reconnects_after_a_killed_connection_and_misses_nothing(
    sup: Supervisor, api: FakeMessagesAPI, proxy: Proxy, use_async: bool
) -> None:
    tag = "async" if use_async else "sync"
    start = now_id(sup.url)
    direct = Reader(sup.url, start, f"{tag}-b")  # never cut: what the hub published
    cut = Reader(proxy.url, start, f"{tag}-b", use_async)
    direct.start()
    cut.start()
    submit_and_park(sup, api, f"{tag}-a")
    wait_until(
        lambda: cut.error or any(e.data.get("name") == f"{tag}-a" for e in cut.events),
        "the first run",
    )
    assert cut.error is None, cut.error
    accepted = proxy.accepted
    proxy.cut()  # mid-stream: reset, and no way back in until the next run has parked
    submit_and_park(sup, api, f"{tag}-b")
    proxy.release()
    for reader in (direct, cut):
        reader.join(DEADLINE)
        assert not reader.is_alive() and reader.error is None, reader.error
    assert proxy.accepted > accepted  # it did reconnect
    assert [(e.id, e.name, e.data) for e in cut.events] == [
        (e.id, e.name, e.data) for e in direct.events
    ]
    seqs = [seq(e.id) for e in cut.events]
    assert seqs == list(range(seq(start) + 1, seq(start) + 1 + len(seqs)))  # no hole, no repeat
    assert {e.data.get("name") for e in cut.events if e.name == "RunParked"} == {
        f"{tag}-a",
        f"{tag}-b",
    }


def raw_events(url: str, count: int, headers: dict[str, str] | None = None) -> list[list[str]]:
    """The first `count` events of the stream at `url`, each as its raw lines."""
    request = urllib.request.Request(
        url, headers={"Accept": "text/event-stream", **(headers or {})}
    )
    events: list[list[str]] = []
    current: list[str] = []
    with urllib.request.urlopen(request, timeout=DEADLINE) as response:
        for raw in response:
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                continue
            if line:
                current.append(line)
            elif current:
                events.append(current)
                current = []
                if len(events) == count:
                    break
    return events


def status_of(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:
            return response.status, None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_every_event_has_an_id_and_a_resume_replays_after_it(
    sup: Supervisor, api: FakeMessagesAPI
) -> None:
    start = now_id(sup.url)
    submit_and_park(sup, api, "raw")
    events = raw_events(f"{sup.url}/api/events", 3, {"Last-Event-ID": start})
    boot, first = start.split("-")[0], seq(start) + 1
    assert [e[0] for e in events] == [f"id: {boot}-{first + i}" for i in range(3)]
    assert events[0][1] == "event: RunSubmitted"
    again = raw_events(f"{sup.url}/api/events?last_event_id={boot}-{first}", 2)
    assert again == events[1:]  # the query parameter, for clients that cannot set the header


def test_a_resume_beyond_the_buffer_or_of_another_boot_gets_a_gap(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    with Supervisor(tmp_path, api, args=("--event-buffer", "3")) as small:
        start = now_id(small.url)
        submit_and_park(small, api, "overflow")  # more than 3 events
        latest = now_id(small.url)
        assert seq(latest) - seq(start) > 3
        (gap,) = raw_events(f"{small.url}/api/events", 1, {"Last-Event-ID": start})
        assert gap[:2] == [f"id: {latest}", "event: EventsGap"]
        data = json.loads(gap[2].removeprefix("data: "))
        assert data["type"] == "EventsGap" and data["last_event_id"] == start
        assert "no longer held" in data["reason"]
        reader = Reader(small.url, start, "after the gap")  # the gap, then live events
        reader.start()
        wait_until(lambda: reader.events, "the gap")
        run_id = submit_and_park(small, api, "after the gap")
        reader.join(DEADLINE)
        assert reader.error is None and isinstance(reader.events[0], EventsGap)
        assert reader.events[1].id == f"{latest.split('-')[0]}-{seq(latest) + 1}"
        assert reader.events[1].run_id == run_id
        with Client(small.url) as client:
            stream = client.events(last_event_id=start)
            first = next(stream)
            stream.close()
        assert isinstance(first, EventsGap) and first.lost_events
        assert first.last_event_id == start and "no longer held" in first.reason
        held = now_id(small.url)  # within the buffer: no gap
        with Client(small.url) as client:
            stream = client.events(last_event_id=f"{held.split('-')[0]}-{seq(held) - 2}")
            replay = [next(stream), next(stream)]
            stream.close()
        assert [seq(e.id) for e in replay] == [seq(held) - 1, seq(held)]
        assert not any(e.lost_events for e in replay)


def test_a_malformed_last_event_id_is_a_400_naming_it(sup: Supervisor) -> None:
    status, body = status_of(f"{sup.url}/api/events", {"Last-Event-ID": "yesterday"})
    assert status == 400 and body["error"].startswith("Last-Event-ID: ")
    status, body = status_of(f"{sup.url}/api/events?last_event_id=1-x", {})
    assert status == 400 and body["error"].startswith("last_event_id: ")
    status, body = status_of(f"{sup.url}/api/events?last_event_id=zz-1", {})
    assert status == 400 and "\n" not in body["error"]


def test_the_openapi_document_describes_resuming(sup: Supervisor) -> None:
    with Client(sup.url) as client:
        document = client.openapi()
    params = {p["name"]: p for p in document["paths"]["/api/events"]["get"]["parameters"]}
    assert params["Last-Event-ID"]["in"] == "header"
    assert params["last_event_id"]["in"] == "query"
    assert "EventsGap" in document["components"]["schemas"]


def test_ctl_events_follow_reconnects_with_the_last_id_it_printed(
    sup: Supervisor, api: FakeMessagesAPI, proxy: Proxy
) -> None:
    start = now_id(sup.url)
    direct = Reader(sup.url, start, "ctl-b")
    direct.start()
    follow = subprocess.Popen(
        [*CLI, "ctl", "--url", proxy.url, "--json", "events", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None and follow.stderr is not None
        out, said = Tail(follow.stdout), Lines(follow.stderr)
        said.wait_for("following the events of", DEADLINE)
        submit_and_park(sup, api, "ctl-a")
        out.holding('"name": "ctl-a"')
        proxy.cut()
        note = said.wait_for("reconnecting after event", DEADLINE)
        before = len(out.lines)  # printed before the cut (none while it is out)
        api.add_conversation("resume: ctl-b", *deploy("ctl-b"))
        sup.submit("resume: ctl-b", name="ctl-b")  # its first events come while ctl is out
        proxy.release()
        direct.join(DEADLINE)
        assert direct.error is None
        wait_until(
            lambda: follow.poll() is not None or len(out.lines) >= len(direct.events),
            "ctl to print them all",
        )
        assert follow.poll() is None, said.text()
    finally:
        follow.terminate()
        follow.wait(DEADLINE)
    printed = [json.loads(line) for line in out.lines]
    # none missed, none twice (a later event may follow what the direct reader waited for)
    assert printed[: len(direct.events)] == [dict(e.data) for e in direct.events]
    assert f"reconnecting after event {direct.events[before - 1].id} " in note
    assert len(note.splitlines()) == 1


def test_ctl_events_follow_says_what_to_reload_after_a_gap(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    with proxied_supervisor(tmp_path, api, "--event-buffer", "2") as (small, proxy):
        follow = subprocess.Popen(
            [*CLI, "ctl", "--url", proxy.url, "events", "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert follow.stdout is not None and follow.stderr is not None
            out, said = Tail(follow.stdout), Lines(follow.stderr)
            said.wait_for("following the events of", DEADLINE)
            submit_and_park(small, api, "gap-a")
            out.holding("RunParked")
            proxy.cut()
            said.wait_for("reconnecting after event", DEADLINE)
            submit_and_park(small, api, "gap-b")  # more than 2 events while it is away
            proxy.release()
            out.holding("EventsGap")
            note = said.wait_for("events were lost", DEADLINE)
        finally:
            follow.terminate()
            follow.wait(DEADLINE)
    assert "no longer held" in note
    assert "reload the runs and approvals: fisk-sm ctl ls; fisk-sm ctl approvals" in note


def test_a_negative_event_buffer_is_refused_in_one_line(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\n")
    done = subprocess.run(
        [*CLI, "supervise", "-c", str(agent), "--event-buffer", "-1"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fisk-sm: --event-buffer: must be at least 0, not -1"
    ]

"""Several supervisors on one NATS server: throughput of 1 against 3, and the journal's append rate.

Part 1. N runs (default 300), each two `note` tool turns then an answer, every model reply after
`--latency` s (default 50 ms) from the fake Messages API (in this process). The runs are
submitted through the control API of real `fisk-sm supervise --nats` processes (each with
`--concurrency C`), first with one supervisor, then with three; a run counts as done when its
`completed` terminal record reaches the session stream (a core NATS subscription on the
stream's subjects sees every record as it is stored). Printed: runs/s of each and the ratio.

Part 2. The durable append rate of a session journal: R concurrent sessions appending M
records each, against the JetStream store (acknowledged by the server) and the file store
(fsynced, group commit), in this process, on the same machine. nats-server's file store
acknowledges once the record is written to its file and fsyncs every `sync_interval` (2 min by
default): the JetStream figure is measured against a server with `sync_interval: always` too,
the like-for-like comparison with the file store's fsync per commit.

    .venv/bin/python bench/distributed.py [--runs N] [--latency S] [--concurrency C]
        [--sessions R] [--records M] [--smallest]

`--smallest` (for the smoke test) is `--runs 6 --latency 0.001 --sessions 2 --records 5`.
No assertions: figures and ratios only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # concurrency

import clusterkit
import natskit
from concurrency import served_in_child

from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.jetstream import JetStreamStore
from fisk_sm.journal.records import Meta, User
from fisk_sm.testing import FakeMessagesAPI

TURNS = 2


@contextmanager
def nats_server(root: Path, *, sync_always: bool = False) -> Iterator[str]:
    """A loopback nats-server with JetStream under `root`; its URL."""
    store = root / "js"
    store.mkdir(parents=True, exist_ok=True)
    port = natskit.free_port()
    conf = root / "nats.conf"
    sync = "\n  sync_interval: always" if sync_always else ""
    conf.write_text(f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{store}"{sync}\n}}\n')
    log = (root / "nats.log").open("ab")
    proc = subprocess.Popen([natskit.server_binary(), "-c", str(conf)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 15
        while not natskit._accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not start: {root / 'nats.log'}")
            time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


async def _count_completed(url: str, total: int, started: asyncio.Event) -> float:
    """Seconds until `total` completed terminal records have been stored."""
    import nats

    nc = await nats.connect(url)
    done = asyncio.Event()
    seen = 0

    async def on_record(msg: object) -> None:
        nonlocal seen
        if b'"reason":"completed"' in getattr(msg, "data", b"").replace(b" ", b""):
            seen += 1
            if seen >= total:
                done.set()

    await nc.subscribe(f"{clusterkit.PREFIX}.>", cb=on_record)
    await nc.flush()
    started.set()
    begin = time.monotonic()
    await done.wait()
    elapsed = time.monotonic() - begin
    await nc.close()
    return elapsed


def serve(prompts: list[str], latency: float, conn: Connection) -> None:
    """The child process: the fake API for `prompts`, until told to stop."""
    scripts = {p: clusterkit.script(p, TURNS, delay=latency) for p in prompts}
    with FakeMessagesAPI(conversations=scripts) as api:
        conn.send(api.base_url)
        conn.recv()


@contextmanager
def fake_api(prompts: list[str], latency: float) -> Iterator[str]:
    """The fake API in a child process (its request threads off this process's GIL)."""
    with served_in_child(serve, prompts, latency) as base_url:
        yield base_url


def trial(root: Path, supervisors: int, runs: int, latency: float, concurrency: int) -> float:
    """Runs/s of `runs` runs on `supervisors` supervisors (each run: TURNS tools, an answer)."""
    prompts = [f"b{supervisors}-{i:04d}" for i in range(runs)]
    with nats_server(root) as url, fake_api(prompts, latency) as base_url:
        clusterkit.make_stream(url)
        clusterkit.write_agent(root, base_url)
        members = [
            clusterkit.Member(root, f"bench-{i}", url, concurrency=concurrency, ttl=10, heartbeat=2)
            for i in range(supervisors)
        ]
        try:
            for member in members:
                member.start()
            loop = asyncio.new_event_loop()
            started = asyncio.Event()
            counter = loop.create_task(_count_completed(url, runs, started))
            loop.run_until_complete(started.wait())
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda ip: members[ip[0] % supervisors].submit(ip[1]),
                              enumerate(prompts)))  # fmt: skip
            elapsed = loop.run_until_complete(counter)
            loop.close()
        finally:
            for member in members:
                member.stop()
    return runs / elapsed


async def appends_jetstream(url: str, sessions: int, records: int) -> float:
    """Durable records/s: `sessions` journals appending `records` each, concurrently."""
    store = await JetStreamStore.connect(url, stream=clusterkit.STREAM, prefix=clusterkit.PREFIX)
    try:
        return await _appends(store, sessions, records, "js")
    finally:
        await store.close()


async def _appends(
    store: JetStreamStore | FileStore, sessions: int, records: int, tag: str
) -> float:
    journals = [
        await store.create_async(Meta.new(f"{tag}-{i}", {}, "bench")) for i in range(sessions)
    ]
    text = "x" * 200

    async def one(journal: object) -> None:
        for seq in range(2, records + 2):
            await journal.append(User(seq, {"role": "user", "content": text}))  # type: ignore[attr-defined]

    begin = time.monotonic()
    await asyncio.gather(*(one(j) for j in journals))
    elapsed = time.monotonic() - begin
    for journal in journals:
        await journal.close()
    return sessions * records / elapsed


def appends(root: Path, sessions: int, records: int) -> tuple[float, float, float]:
    """(file store, JetStream default sync, JetStream sync always) records/s."""
    store = FileStore(root / "files")
    store.ensure_directory()
    file_rate = asyncio.run(_appends(store, sessions, records, "file"))
    rates = []
    for sync_always in (False, True):
        where = root / ("js-always" if sync_always else "js-default")
        with nats_server(where, sync_always=sync_always) as url:
            clusterkit.make_stream(url)
            rates.append(asyncio.run(appends_jetstream(url, sessions, records)))
    return file_rate, rates[0], rates[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--smallest", action="store_true", help="a seconds-long smoke run")
    args = parser.parse_args()
    if args.smallest:
        args.runs, args.latency, args.sessions, args.records = 6, 0.001, 2, 5
    root = Path(tempfile.mkdtemp(prefix="fisk-sm-bench-distributed-"))
    try:
        print(f"{args.runs} runs x ({TURNS} tool turns + answer), {args.latency * 1000:g} ms"
              f" per model reply, --concurrency {args.concurrency} per supervisor")  # fmt: skip
        one = trial(root / "one", 1, args.runs, args.latency, args.concurrency)
        print(f"  1 supervisor : {one:8.1f} runs/s")
        three = trial(root / "three", 3, args.runs, args.latency, args.concurrency)
        print(f"  3 supervisors: {three:8.1f} runs/s")
        ideal = args.concurrency / ((TURNS + 1) * args.latency)
        print(f"  (latency-bound ideal per supervisor: {ideal:.0f} runs/s;"
              f" {os.cpu_count()} CPUs for all the processes)")  # fmt: skip
        print(f"  throughput ratio 3/1: {three / one:.2f}x")
        files, js, js_always = appends(root / "appends", args.sessions, args.records)
        print(f"durable appends, {args.sessions} sessions x {args.records} records, concurrent")
        print(f"  file store (fsync, group commit)    : {files:9.0f} records/s")
        print(f"  JetStream (default sync, ack)       : {js:9.0f} records/s"
              f"  ratio to file {js / files:.2f}x")  # fmt: skip
        print(f"  JetStream (sync_interval: always)   : {js_always:9.0f} records/s"
              f"  ratio to file {js_always / files:.2f}x")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

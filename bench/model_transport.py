"""CPU per model call on each HTTP transport of the SDK, side by side in one run.

N callers (default 100) on one event loop each make M calls in turn (default 10) through
fisk-sm's `AnthropicModel.create`, the call a run makes (the SDK's `client.post`, its raw body
read and checked as a run reads it: `fisk_sm.model.transport`; bench/model_call.py measures
that against `messages.create` through the whole engine), against a loopback fake Messages
API that answers each call after `--latency` (default 20 ms) with a tool call. The fake runs
in a child process, so its CPU is not counted. The figure is this process's CPU time
(`time.process_time`, every thread) over the N × M calls, per call. Every transport warms up
with one round; then the rounds are interleaved `--repeats` times (default 3): each row gives
the median and the best round, the median wall time of a round, and the ratio of its median to
the SDK's default transport's.

The transports:

* httpx2 (SDK default): `anthropic.AsyncAnthropic()`, the baseline;
* httpx2, pool tuned: `DefaultAsyncHttpxClient` with room to keep every caller's connection
  alive, for a minute, and no environment lookups (`trust_env=False`);
* aiohttp: `anthropic.DefaultAioHttpClient()` (`anthropic[aiohttp]`);
* aiohttp, no SDK spans: the same with `open_telemetry=False`. Not a transport: what the SDK's
  own OpenTelemetry call span costs a call when nothing records it;
* fisk-sm: the client a model takes (`fisk_sm.model.clients`, built by
  `fisk_sm.model.transport`), the adopted transport as the engine uses it.

Two fakes (`--server`, default both): `close` is `fisk_sm.testing.FakeMessagesAPI`, which
closes the connection after each reply (so each call also connects, as in bench/concurrency.py
and bench/supervisor.py); `keep-alive` is a minimal asyncio HTTP/1.1 server here that keeps
connections open, as the real API does, so the pools reuse them.

    .venv/bin/python bench/model_transport.py [--callers N] [--calls M] [--latency S]
                                              [--repeats R] [--server close|keep-alive|both]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # concurrency

import anthropic
import httpx2
from concurrency import config, fake_api, script, served_in_child

from fisk_sm.model.anthropic import AnthropicModel, ModelRequest, build_request
from fisk_sm.model.blocks import Message

TICK = {
    "name": "tick",
    "description": "Count one.",
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}
#: The keep-alive fake's one reply: what FakeMessagesAPI answers for `Reply.tool_use("tick", ...)`.
REPLY = json.dumps(
    {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "bench",
        "content": [{"type": "tool_use", "id": "toolu_01", "name": "tick", "input": {"n": 1}}],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
).encode()
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nrequest-id: req_01\r\n"

#: A transport: the client it makes for a base URL, or None for the model's own (fisk-sm).
Make = Callable[[str, int], "anthropic.AsyncAnthropic | None"]


def tuned(base_url: str, callers: int) -> anthropic.AsyncAnthropic:
    limits = httpx2.Limits(
        max_connections=None, max_keepalive_connections=callers, keepalive_expiry=60
    )
    http = anthropic.DefaultAsyncHttpxClient(limits=limits, trust_env=False)
    return anthropic.AsyncAnthropic(api_key="bench", base_url=base_url, http_client=http)


TRANSPORTS: dict[str, Make] = {
    "httpx2 (SDK default)": lambda url, n: anthropic.AsyncAnthropic(api_key="bench", base_url=url),
    "httpx2, pool tuned": tuned,
    "aiohttp": lambda url, n: anthropic.AsyncAnthropic(
        api_key="bench", base_url=url, http_client=anthropic.DefaultAioHttpClient()
    ),
    "aiohttp, no SDK spans": lambda url, n: anthropic.AsyncAnthropic(
        api_key="bench",
        base_url=url,
        http_client=anthropic.DefaultAioHttpClient(),
        open_telemetry=False,
    ),
    "fisk-sm": lambda url, n: None,
}
BASELINE = "httpx2 (SDK default)"


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Serve one connection, kept alive: each request answered with REPLY after `delay`."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            await asyncio.sleep(delay)
            writer.write(HEAD + b"content-length: %d\r\n\r\n" % len(REPLY) + REPLY)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_kept_alive(delay: float, conn: Connection) -> None:
    """The child process: the keep-alive fake, until told to stop."""

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: answer(r, w, delay), "127.0.0.1", 0, backlog=1024
        )
        conn.send(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        await asyncio.to_thread(conn.recv)
        server.close()

    asyncio.run(main())


@contextmanager
def kept_alive(delay: float) -> Iterator[str]:
    with served_in_child(serve_kept_alive, delay) as base_url:
        yield base_url


async def rounds(args: argparse.Namespace, base_url: str) -> dict[str, list[tuple[float, float]]]:
    """Each transport's rounds: (CPU seconds per call, wall seconds)."""
    llm = config(base_url, args.calls).llm
    system = ({"type": "text", "text": "You count."},)
    request: ModelRequest = build_request(llm, system, (TICK,), [Message("user", "count")])
    models: dict[str, AnthropicModel] = {}
    own: list[anthropic.AsyncAnthropic] = []
    for name, make in TRANSPORTS.items():
        model = models[name] = AnthropicModel(llm)  # on the engine's shared client
        client = make(base_url, args.callers)
        if client is not None:  # on this transport's instead, with the model's options
            own.append(client)
            model.client = client.with_options(timeout=llm.budget.call_timeout, max_retries=2)

    async def caller(model: AnthropicModel) -> int:
        done = 0
        for _ in range(args.calls):
            reply = await model.create(request)
            done += reply["stop_reason"] == "tool_use"
        return done

    async def one_round(model: AnthropicModel) -> tuple[float, float]:
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        done = sum(await asyncio.gather(*(caller(model) for _ in range(args.callers))))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert done == args.callers * args.calls, f"{done} calls answered"
        return cpu / done, wall

    for model in models.values():
        await one_round(model)  # warm-up: connections, first-call work
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, model in models.items():
            found[name].append(await one_round(model))
    for model in models.values():
        await model.aclose()
    for client in own:
        await client.close()
    return found


def table(found: dict[str, list[tuple[float, float]]]) -> None:
    base = statistics.median(cpu for cpu, _ in found[BASELINE])
    print(f"   {'transport':<24}{'CPU per call':>14}{'best':>9}{'wall/round':>12}  vs default")
    for name, trials in found.items():
        median = statistics.median(cpu for cpu, _ in trials)
        best = min(cpu for cpu, _ in trials)
        wall = statistics.median(w for _, w in trials)
        print(
            f"   {name:<24}{median * 1e3:>11.3f} ms{best * 1e3:>9.3f}{wall:>10.2f} s"
            f"  {median / base:>9.2f}×"
        )


async def main(args: argparse.Namespace) -> None:
    import aiohttp

    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; anthropic", end=" ")
    print(f"{anthropic.__version__}, httpx2 {httpx2.__version__}, aiohttp {aiohttp.__version__}")
    print(f"{args.callers} callers × {args.calls} calls a round, {args.latency * 1e3:g} ms", end="")
    print(f" per reply, {args.repeats} rounds each; fake API in a child process")
    servers = ("close", "keep-alive") if args.server == "both" else (args.server,)
    for server in servers:
        if server == "close":
            per_round = args.callers * args.calls
            replies = script(per_round, (args.repeats + 1) * len(TRANSPORTS), args.latency)
            serving = fake_api(replies, in_process=False)
            what = "FakeMessagesAPI, a connection per call"
        else:
            serving, what = kept_alive(args.latency), "connections kept alive"
        with serving as base_url:
            print(f"\nfake: {server} ({what}); CPU per call")
            table(await rounds(args, base_url))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--callers", type=int, default=100, help="concurrent callers (100)")
    parser.add_argument("--calls", type=int, default=10, help="calls per caller a round (10)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per reply (0.02)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per transport (3)")
    parser.add_argument("--server", choices=("close", "keep-alive", "both"), default="both")
    asyncio.run(main(parser.parse_args()))

"""Remote tools over NATS request/reply, against a real loopback nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import nats
import pytest
from conftest import make_run
from nats.aio.client import Client
from nats.aio.msg import Msg

from fisk_sm import Tool, tool
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools import ToolBox
from fisk_sm.tools.base import ToolError
from fisk_sm.tools.remote import (
    RemoteError,
    RemoteSpec,
    ToolHost,
    import_remote_tools,
    serve_tools,
    settle,
)

Serve = Callable[[str, Sequence[Tool], str], Awaitable[ToolHost]]
Answer = Callable[[str, Callable[[Msg], bytes | None]], Awaitable[None]]

OPS = RemoteSpec("ops", "tools.ops")
DB = RemoteSpec("db", "tools.db")


@pytest.fixture
async def host_nc(nats_url: str) -> AsyncIterator[Client]:
    """The tool hosts' connection (a different client, as in real use)."""
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def serve(host_nc: Client) -> AsyncIterator[Serve]:
    """Start tool hosts with `await serve(subject, tools, agent)`; all stop at teardown."""
    hosts: list[ToolHost] = []

    async def start(subject: str, tools: Sequence[Tool], agent: str) -> ToolHost:
        host = await serve_tools(host_nc, subject, tools, agent=agent)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        await host.stop()


@pytest.fixture
async def answer(host_nc: Client) -> AsyncIterator[Answer]:
    """A hand-written responder: `await answer(subject, reply_of)`; None sends no reply."""
    subs = []

    async def start(subject: str, reply_of: Callable[[Msg], bytes | None]) -> None:
        async def cb(msg: Msg) -> None:
            payload = reply_of(msg)
            if payload is not None:
                await host_nc.publish(msg.reply, payload)

        subs.append(await host_nc.subscribe(subject, cb=cb))
        await settle(host_nc)

    yield start
    for sub in subs:
        await sub.unsubscribe()


def named(name: str, description: str = "", **props: str) -> Tool:
    """A tool that echoes its input, under any name."""

    def echo(**arguments: Any) -> dict[str, Any]:
        return {"tool": name, **arguments}

    schema = {"type": "object", "properties": {p: {"type": t} for p, t in props.items()}}
    return Tool(name, description or f"the {name} tool", schema, echo)


@tool
def uptime(host: str) -> dict[str, Any]:
    """Show how long a host has been up.

    Args:
        host: the machine to ask
    """
    return {"command": f"uptime {host}", "exit_code": 0, "output": f"{host}: up 3 days"}


@tool
async def disk(path: str) -> str:
    """Report free space; fails as the harness would."""
    raise ToolError(f"cannot stat {path}: permission denied")


def listing(*tools: dict[str, Any], agent: str = "raw") -> bytes:
    return json.dumps({"tools": list(tools), "agent": agent}).encode()


RAW_TOOL = {"name": "probe", "description": "a raw tool", "input_schema": {"type": "object"}}


async def test_a_served_tool_is_imported_and_called_through_nats(nc: Client, serve: Serve) -> None:
    await serve("tools.ops", [uptime, disk], "opsbot")
    imported = await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    assert [t.name for t in imported] == ["uptime", "disk"]
    remote = imported[0]
    assert remote.kind == "remote"
    assert remote.description == "Show how long a host has been up. (remote: opsbot)"
    assert remote.input_schema == uptime.input_schema
    assert await remote.fn(host="web1") == {
        "command": "uptime web1",
        "exit_code": 0,
        "output": "web1: up 3 days",
    }
    outcome = await ToolBox.of(imported).invoke("uptime", {"host": "db2"})
    assert not outcome.is_error
    assert json.loads(outcome.content)["output"] == "db2: up 3 days"


async def test_a_host_error_reply_is_an_is_error_result_naming_tool_and_host(
    nc: Client, serve: Serve
) -> None:
    await serve("tools.ops", [uptime, disk], "opsbot")
    box = ToolBox.of(await import_remote_tools(nc, [OPS], taken=(), timeout=5))
    failed = await box.invoke("disk", {"path": "/srv"})
    assert failed.is_error
    assert failed.content == (
        "remote tool 'disk' on host 'ops' (tools.ops) failed: cannot stat /srv: permission denied"
    )
    # The host checks the input too: a missing parameter is the host's is_error reply.
    missing = await box.invoke("uptime", {})
    assert missing.is_error
    assert "'uptime' was called without required parameter(s): host" in missing.content


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b'{"error": "nope"}', "remote tool 'probe' on host 'ops' (tools.ops) failed: nope"),
        (b"<html>", "remote tool 'probe' on host 'ops' (tools.ops) sent a malformed reply: not"),
        (b'{"answer": 1}', 'malformed reply: expected "result" or "error"'),
        (b"[1, 2]", 'malformed reply: expected "result" or "error"'),
    ],
)
async def test_error_and_malformed_call_replies_are_tool_errors(
    nc: Client, answer: Answer, reply: bytes, expected: str
) -> None:
    await answer("tools.ops.list", lambda _: listing(RAW_TOOL))
    await answer("tools.ops.call.probe", lambda _: reply)
    (probe,) = await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    with pytest.raises(ToolError) as caught:
        await probe.fn()
    assert expected in str(caught.value)


async def test_the_call_carries_the_json_input_and_returns_the_result_as_is(
    nc: Client, answer: Answer
) -> None:
    seen: list[Any] = []

    def reply(msg: Msg) -> bytes:
        seen.append((msg.subject, json.loads(msg.data)))
        return b'{"result": "plain text"}'

    await answer("tools.ops.list", lambda _: listing(RAW_TOOL))
    await answer("tools.ops.call.probe", reply)
    (probe,) = await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    assert await probe.fn(target="é", n=2) == "plain text"
    assert seen == [("tools.ops.call.probe", {"target": "é", "n": 2})]


async def test_a_call_that_gets_no_reply_in_time_is_a_tool_error(
    nc: Client, answer: Answer
) -> None:
    await answer("tools.ops.list", lambda _: listing(RAW_TOOL))
    await answer("tools.ops.call.probe", lambda _: None)
    (probe,) = await import_remote_tools(nc, [OPS], taken=(), timeout=0.3)
    outcome = await ToolBox.of([probe]).invoke("probe", {})
    assert outcome.is_error
    assert outcome.content == (
        "remote tool 'probe' on host 'ops' (tools.ops) did not answer: no reply within 0.3s"
    )


async def test_a_slow_served_tool_times_out_and_does_not_hold_up_other_calls(
    nc: Client, serve: Serve
) -> None:
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait until released."""
        await release.wait()
        return "late"

    await serve("tools.ops", [slow, uptime], "opsbot")
    box = ToolBox.of(await import_remote_tools(nc, [OPS], taken=(), timeout=0.5))
    slow_call = asyncio.ensure_future(box.invoke("slow", {}))
    fast = await box.invoke("uptime", {"host": "web1"})
    assert not fast.is_error  # answered while `slow` still runs on the host
    timed_out = await slow_call
    assert timed_out.is_error
    assert "'slow' on host 'ops' (tools.ops) did not answer: no reply within 0.5s" in (
        timed_out.content
    )


async def test_a_stopped_host_leaves_calls_without_responders(nc: Client, serve: Serve) -> None:
    host = await serve("tools.ops", [uptime], "opsbot")
    (remote,) = await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    await host.stop()
    with pytest.raises(ToolError, match=r"'uptime' on host 'ops' .* no responders"):
        await remote.fn(host="web1")
    with pytest.raises(RemoteError, match="did not answer: no responders"):
        await import_remote_tools(nc, [OPS], taken=(), timeout=5)


async def test_an_absent_host_is_a_remote_error_naming_the_alias(nc: Client, serve: Serve) -> None:
    await serve("tools.ops", [uptime], "opsbot")
    with pytest.raises(RemoteError) as caught:
        await import_remote_tools(nc, [OPS, DB], taken=(), timeout=5)
    assert str(caught.value) == ("remote tool host 'db' (tools.db) did not answer: no responders")


async def test_a_silent_host_is_a_remote_error(nc: Client, answer: Answer) -> None:
    await answer("tools.ops.list", lambda _: None)
    with pytest.raises(RemoteError) as caught:
        await import_remote_tools(nc, [OPS], taken=(), timeout=0.3)
    assert str(caught.value) == (
        "remote tool host 'ops' (tools.ops) did not answer: no reply within 0.3s"
    )


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (b"not json", "not JSON"),
        (b'{"tools": 3}', 'expected an object with a "tools" list'),
        (listing({**RAW_TOOL, "name": "a.b"}), "bad tool name 'a.b'"),
        (listing({**RAW_TOOL, "input_schema": None}), "needs a string description"),
        (listing(RAW_TOOL, RAW_TOOL), "tool 'probe' is listed twice"),
        (listing(RAW_TOOL, agent=""), '"agent" must be a non-empty string'),
    ],
)
async def test_a_malformed_tool_list_is_a_remote_error(
    nc: Client, answer: Answer, reply: bytes, why: str
) -> None:
    await answer("tools.ops.list", lambda _: reply)
    with pytest.raises(RemoteError) as caught:
        await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    message = str(caught.value)
    assert message.startswith("remote tool host 'ops' (tools.ops) sent a malformed tool list: ")
    assert why in message


async def test_names_are_bare_unless_taken_locally_or_offered_twice(
    nc: Client, serve: Serve
) -> None:
    await serve("tools.ops", [named("uptime"), named("restart"), named("status")], "opsbot")
    await serve("tools.db", [named("status"), named("query")], "dbbot")
    imported = await import_remote_tools(nc, [OPS, DB], taken={"restart"}, timeout=5)
    assert [t.name for t in imported] == [
        "uptime",
        "ops_restart",
        "ops_status",
        "db_status",
        "query",
    ]
    by_name = {t.name: t for t in imported}
    assert by_name["db_status"].description == "the status tool (remote: dbbot)"
    # A renamed tool still calls its bare name on its own host.
    assert await by_name["ops_status"].fn() == {"tool": "status"}
    assert await by_name["db_status"].fn() == {"tool": "status"}
    assert await by_name["ops_restart"].fn() == {"tool": "restart"}
    assert {t.kind for t in imported} == {"remote"}


async def test_a_collision_that_remains_after_prefixing_is_a_remote_error(
    nc: Client, serve: Serve
) -> None:
    await serve("tools.ops", [named("x")], "opsbot")
    await serve("tools.db", [named("x"), named("ops_x")], "dbbot")
    with pytest.raises(RemoteError) as caught:
        await import_remote_tools(nc, [OPS, DB], taken=(), timeout=5)
    assert str(caught.value) == (
        "tool 'ops_x' of remote tool host 'db' (tools.db) would be named 'ops_x',"
        " like tool 'x' of remote tool host 'ops' (tools.ops)"
    )


async def test_a_prefixed_name_taken_by_a_local_tool_is_a_remote_error(
    nc: Client, serve: Serve
) -> None:
    await serve("tools.ops", [named("x")], "opsbot")
    with pytest.raises(RemoteError, match="would be named 'ops_x', which a local tool has"):
        await import_remote_tools(nc, [OPS], taken={"x", "ops_x"}, timeout=5)


async def test_a_prefixed_name_over_64_characters_is_a_remote_error(
    nc: Client, serve: Serve
) -> None:
    await serve("tools.ops", [named("t" * 64)], "opsbot")
    with pytest.raises(RemoteError, match="longer than 64 characters"):
        await import_remote_tools(nc, [OPS], taken={"t" * 64}, timeout=5)


async def test_aliases_must_be_distinct(nc: Client) -> None:
    with pytest.raises(RemoteError, match="alias 'ops' is used more than once"):
        await import_remote_tools(nc, [OPS, RemoteSpec("ops", "other")], taken=(), timeout=5)


@pytest.mark.parametrize(
    ("alias", "subject"),
    [("o ps", "tools.ops"), ("", "tools.ops"), ("ops", "tools.*"), ("ops", "tools.>"),
     ("ops", "tools..ops"), ("ops", ""), ("ops", "tools ops")],
)  # fmt: skip
def test_a_spec_needs_a_plain_alias_and_a_subject_without_wildcards(
    alias: str, subject: str
) -> None:
    with pytest.raises(ValueError, match=r"remote tool (alias|subject)"):
        RemoteSpec(alias, subject)


def test_specs_are_frozen_values() -> None:
    assert RemoteSpec("ops", "a.b-c_d") == RemoteSpec("ops", "a.b-c_d")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        OPS.alias = "x"  # type: ignore[misc]


async def test_a_model_calls_a_remote_tool_in_a_run(
    nc: Client, serve: Serve, api: FakeMessagesAPI
) -> None:
    await serve("tools.ops", [uptime], "opsbot")
    imported = await import_remote_tools(nc, [OPS], taken=(), timeout=5)
    api.add(Reply.tool_use("uptime", {"host": "web1"}, id="toolu_r"), Reply.text("up 3 days"))
    run, _, _ = make_run(api, imported)
    while not run.finished:
        await run.step()
    assert run.answer() == "up 3 days"
    (sent,) = [t for t in api.requests[0]["tools"] if t["name"] == "uptime"]
    assert sent["description"].endswith("(remote: opsbot)")
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_r"
    assert not result.get("is_error")
    assert json.loads(result["content"])["output"] == "web1: up 3 days"


def test_fisk_sm_run_imports_remote_tools_and_counts_them(nats_url: str, tmp_path: Path) -> None:
    """Scenario 5 through the CLI: a remote tool runs on its host and is traced as remote."""
    import subprocess

    from fisk_sm.journal.filestore import FileStore
    from fisk_sm.journal.fold import fold

    async def host_and_run() -> subprocess.CompletedProcess[str]:
        nc = await nats.connect(nats_url)

        @tool
        def uptime(host: str) -> dict[str, object]:
            """How long a host has been up."""
            return {"command": f"uptime {host}", "exit_code": 0, "output": "up 3 days"}

        host = await serve_tools(nc, "tools.ops", [uptime], agent="ops-box")
        agent = tmp_path / "agent.yaml"
        agent.write_text(
            "llm: {model: m}\n"
            f"nats: {{url: '{nats_url}'}}\n"
            "remote_tools: [{alias: ops, subject: tools.ops}]\n"
        )
        with FakeMessagesAPI(
            [Reply.tool_use("uptime", {"host": "db1"}), Reply.text("3 days")]
        ) as api:
            env = {**os.environ, "ANTHROPIC_API_KEY": "x", "ANTHROPIC_BASE_URL": api.base_url}
            command = [sys.executable, "-m", "fisk_sm.cli", "run", "-c", str(agent)]
            command += ["--checkpoint", "--name", "r1", "--state-dir", str(tmp_path / "s"), "go"]
            done = await asyncio.to_thread(
                subprocess.run, command, capture_output=True, text=True, env=env, timeout=60
            )
            tools_offered = [t["name"] for t in api.requests[0]["tools"]]
            fed = api.requests[1]["messages"][-1]["content"][0]
        await host.stop()
        await nc.close()
        assert tools_offered == ["uptime"]
        assert json.loads(fed["content"])["output"] == "up 3 days"
        return done

    done = asyncio.run(host_and_run())
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3 days\n"
    assert '-> uptime {"host": "db1"} (remote: ops-box)' in done.stderr
    snap = fold(FileStore(tmp_path / "s").load("r1"))
    assert snap.tool_kinds == {"remote": 1} and snap.tool_calls == 1


def test_an_unreachable_nats_server_is_one_line_exit_2(tmp_path: Path) -> None:
    import subprocess

    agent = tmp_path / "agent.yaml"
    agent.write_text(
        "llm: {model: m}\nnats: {url: 'nats://127.0.0.1:1'}\n"
        "remote_tools: [{alias: ops, subject: tools.ops}]\n"
    )
    command = [sys.executable, "-m", "fisk_sm.cli", "run", "-c", str(agent), "go"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot reach the NATS server at nats://127.0.0.1:1" in done.stderr
    assert len(done.stderr.splitlines()) == 1

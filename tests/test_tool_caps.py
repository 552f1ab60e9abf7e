"""Every tool kind's output is capped on its way out of dispatch: text keeps its head and tail
around a marker saying how much was left out (64 KiB by default, `max_output` per tool); an
image is never cut, and one over `max_image` (5 MiB of base64 by default) makes the result an
is_error naming the limit. Python tools and an MCP server (tests/mcp_server_demo.py --big) are
run end to end into a file journal; memory through the dispatch; remote through nats-server."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from test_mcp import DEMO, DOT_PNG, config_for

from fisk_sm import parse_config
from fisk_sm.config.agent import AgentConfig, ConfigError, load_config
from fisk_sm.config.exec import parse_exec_tool
from fisk_sm.journal.filestore import FileStore
from fisk_sm.journal.records import ToolResult
from fisk_sm.loop.harness import Harness, NoModel, RunOptions
from fisk_sm.loop.sessions import start_session
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import Content, Tool, ToolBox, tool
from fisk_sm.tools.exec import exec_tool
from fisk_sm.tools.memory import MemoryStore
from fisk_sm.tools.memory_tools import memory_tools
from fisk_sm.tools.remote import RemoteSpec, connect_remote_tools, import_remote_tools

BIG = 50_000_000
IMAGE = 20_000_000
KIB64 = 65536
#: Far above a capped result's journal line, far below an uncapped one's.
SMALL_LINE = 200_000


def big_text(size: int) -> str:
    """What the demo server's `big_text` returns: `HEAD<`, dots, `>TAIL`."""
    return "HEAD<" + "." * (size - 10) + ">TAIL"


def marker(cut: int, total: int) -> str:
    return f"\n...[output truncated: {cut} of {total} bytes left out]...\n"


def image_block(data: bytes) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": encoded},
    }


def image_refusal(name: str, size: int) -> str:
    """The is_error content for an image of `size` bytes, base64-encoded."""
    encoded = 4 * ((size + 2) // 3)
    return (
        f"tool {name!r} returned an image of {encoded} bytes (base64),"
        " over the limit of 5242880 bytes (max_image)"
    )


async def journaled(
    config: AgentConfig, api: FakeMessagesAPI, tmp_path: Path, tools: list[Tool], *turns: Reply
) -> tuple[list[ToolResult], list[bytes]]:
    """Run a session to its end in a file journal: its tool results and its raw lines."""
    api.add_conversation("go", *turns)
    store = FileStore(tmp_path / "runs")
    run = await start_session(config, "go", store, RunOptions(tools=tools), run_id="caps")
    async with run:
        assert await run.run() == "completed"
    records = [r for r in store.load("caps") if isinstance(r, ToolResult)]
    return records, store.path("caps").read_bytes().splitlines()


def test_cap_text_keeps_head_and_tail_and_says_how_much_was_left_out() -> None:
    from fisk_sm.tools.output import cap_text  # new with the caps: only this test fails on import

    text = "a" * 100 + "b" * 100
    assert cap_text(text, 100) == ("a" * 50 + marker(100, 200) + "b" * 50, True)
    assert cap_text(text, 200) == (text, False)
    # Bytes of UTF-8 are counted; a character split at a cut becomes U+FFFD.
    capped, cut = cap_text("é" * 100, 51)
    assert cut and capped.startswith("é" * 12 + "\ufffd") and capped.endswith("é" * 13)
    assert marker(149, 200) in capped


async def test_a_50mb_python_result_is_journaled_capped(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    @tool
    def huge() -> str:
        """Fifty megabytes of text."""
        return big_text(BIG)

    config = config_for(api)
    turns = (Reply.tool_use("huge", {}, id="t1"), Reply.text("done"))
    [record], lines = await journaled(config, api, tmp_path, [huge], *turns)
    content = record.result["content"]
    assert not record.is_error
    assert content == "HEAD<" + "." * (KIB64 // 2 - 5) + marker(BIG - KIB64, BIG) + (
        "." * (KIB64 // 2 - 5) + ">TAIL"
    )
    assert max(map(len, lines)) < SMALL_LINE
    [fed] = api.requests_for("go")[1]["messages"][-1]["content"]
    assert fed["content"] == content


async def test_a_python_tool_image_over_the_limit_is_an_error_and_a_small_one_passes(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    @tool
    def photo(big: bool) -> Content:
        """A picture, big or small."""
        return Content("a picture", (image_block(bytes(IMAGE) if big else DOT_PNG),))

    config = config_for(api)
    turns = (
        Reply.tool_use("photo", {"big": True}, id="t1"),
        Reply.tool_use("photo", {"big": False}, id="t2"),
        Reply.text("done"),
    )
    big, small = (await journaled(config, api, tmp_path, [photo], *turns))[0]
    assert big.is_error and big.result["content"] == image_refusal("photo", IMAGE)
    assert not small.is_error
    assert small.result["content"] == [image_block(DOT_PNG)]  # an image is never cut


async def test_a_50mb_mcp_text_is_capped_and_a_20mb_mcp_image_refused(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    server = {"alias": "demo", "command": [sys.executable, str(DEMO), "--big"], "confirm": False}
    config = config_for(api, server)
    turns = (
        Reply.tool_use("big_text", {"size": BIG}, id="t1"),
        Reply.tool_use("big_image", {"size": IMAGE}, id="t2"),
        Reply.tool_use("dot", {}, id="t3"),
        Reply.text("done"),
    )
    text, image, dot = (await journaled(config, api, tmp_path, [], *turns))[0]
    assert not text.is_error
    assert text.result["content"].startswith("HEAD<" + "." * 100)
    assert text.result["content"].endswith("." * 100 + ">TAIL")
    assert marker(BIG - KIB64, BIG) in text.result["content"]
    assert image.is_error and image.result["content"] == image_refusal("big_image", IMAGE)
    assert not dot.is_error and dot.result["content"][-1] == image_block(DOT_PNG)
    lines = store_lines(tmp_path)
    assert max(map(len, lines)) < SMALL_LINE


def store_lines(tmp_path: Path) -> list[bytes]:
    return FileStore(tmp_path / "runs").path("caps").read_bytes().splitlines()


async def test_limits_from_agent_yaml_and_the_decorator(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    (tmp_path / "capped_tools.py").write_text(
        "from fisk_sm import tool\n\n"
        "@tool(max_output=300)\n"
        "def decorated() -> str:\n"
        '    """Chatty."""\n'
        "    return 'x' * 1000\n\n"
        "def plain() -> str:\n"
        '    """Chatty too."""\n'
        "    return 'y' * 1000\n"
    )
    server = f"{{alias: demo, command: ['{sys.executable}', '{DEMO}', '--big'], confirm: false"
    (tmp_path / "agent.yaml").write_text(
        f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
        "tools:\n"
        "  - {python: 'capped_tools:decorated'}\n"
        "  - {python: 'capped_tools:plain', max_output: 100, timeout: 2s}\n"
        f"mcp_servers:\n  - {server}, max_output: 200, max_image: 50}}\n"
    )
    harness = Harness.build(load_config(tmp_path / "agent.yaml"), RunOptions(model=NoModel()))
    try:
        await harness.start_mcp_servers()
        box = harness.tools
        assert box.tools["plain"].timeout == 2.0
        outcomes = {
            name: await box.invoke(name, arguments)
            for name, arguments in [
                ("decorated", {}),
                ("plain", {}),
                ("big_text", {"size": 1000}),
                ("dot", {}),
            ]
        }
    finally:
        await harness.aclose()
    assert outcomes["decorated"].content == "x" * 150 + marker(700, 1000) + "x" * 150
    assert outcomes["plain"].content == "y" * 50 + marker(900, 1000) + "y" * 50
    assert outcomes["big_text"].content == (
        "HEAD<" + "." * 95 + marker(800, 1000) + "." * 95 + ">TAIL"
    )
    dot = outcomes["dot"]
    assert dot.is_error and "over the limit of 50 bytes (max_image)" in dot.content


BYTES = "must be a positive number of bytes"
DURATION = "must be a positive duration such as '30s'"


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"tools": [{"python": "m:f", "max_output": 0}]}, "tools[0].max_output", BYTES),
        ({"tools": [{"python": "m:f", "max_image": "big"}]}, "tools[0].max_image", "expected"),
        ({"tools": [{"python": "m:f", "timeout": "0s"}]}, "tools[0].timeout", DURATION),
        (
            {"mcp_servers": [{"alias": "a", "command": ["x"], "max_output": -1}]},
            "mcp_servers[0].max_output",
            BYTES,
        ),
        (
            {"remote_tools": [{"alias": "a", "subject": "s", "timeout": "soon"}]},
            "remote_tools[0].timeout",
            DURATION,
        ),
        (
            {"remote_tools": [{"alias": "a", "subject": "s", "max_output": 1.5}]},
            "remote_tools[0].max_output",
            "expected an integer",
        ),
    ],
)
def test_a_bad_limit_names_its_field(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"llm": {"model": "m"}, **data}, source="agent.yaml", env={})
    assert caught.value.field == field
    assert caught.value.problem.startswith(problem)
    assert "\n" not in str(caught.value)


async def test_memory_text_is_capped_through_the_dispatch(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memory")
    for i in range(600):  # about 340 KB of listing
        assert store.create(f"note{i:03d}", "d" * 500, "content")
    box = ToolBox.of(memory_tools(store))
    outcome = await box.invoke("memory_list", {})
    limit = box.tools["memory_list"].max_output
    assert limit is not None and not outcome.is_error
    assert outcome.content.startswith('{"memories": [{"key": "note000"')
    assert outcome.content.endswith('"key": "note599", "description": "' + "d" * 500 + '"}]}')
    assert "...[output truncated: " in outcome.content
    assert len(outcome.content.encode()) < limit + 100
    # A whole memory of the largest size is read whole.
    assert store.create("big", "largest", "z" * 65536)
    read = await box.invoke("memory_read", {"key": "big"})
    assert json.loads(read.content)["content"] == "z" * 65536


async def answer_with(nc: Client, subject: str, reply: bytes | None) -> None:
    async def respond(msg: Msg) -> None:
        if reply is not None:
            await msg.respond(reply)

    await nc.subscribe(subject, cb=respond)
    await nc.flush()


LISTING = json.dumps(
    {"tools": [{"name": n, "input_schema": {"type": "object"}} for n in ("big", "mute")]}
).encode()


async def test_remote_text_is_capped(nc: Client) -> None:
    await answer_with(nc, "tools.ops.list", LISTING)
    # 600 KB: under nats-server's 1 MB payload limit, ten times the cap.
    await answer_with(nc, "tools.ops.call.big", json.dumps({"result": big_text(600_000)}).encode())
    imported = await import_remote_tools(nc, [RemoteSpec("ops", "tools.ops")], taken=(), timeout=5)
    outcome = await ToolBox.of(imported).invoke("big", {})
    assert not outcome.is_error
    assert outcome.content == "HEAD<" + "." * (KIB64 // 2 - 5) + marker(
        600_000 - KIB64, 600_000
    ) + ("." * (KIB64 // 2 - 5) + ">TAIL")


async def test_a_remote_hosts_limits_come_from_agent_yaml(nc: Client, nats_url: str) -> None:
    await answer_with(nc, "tools.ops.list", LISTING)
    await answer_with(nc, "tools.ops.call.big", json.dumps({"result": big_text(5000)}).encode())
    await answer_with(nc, "tools.ops.call.mute", None)
    host = {"alias": "ops", "subject": "tools.ops", "timeout": "300ms", "max_output": 1000}
    config = parse_config(
        {"llm": {"model": "m"}, "nats": {"url": nats_url}, "remote_tools": [host]}, env={}
    )
    tools, close = await connect_remote_tools(config, ())
    try:
        box = ToolBox.of(tools)
        big, mute = await box.invoke("big", {}), await box.invoke("mute", {})
    finally:
        await close()
    assert big.content == "HEAD<" + "." * 495 + marker(4000, 5000) + "." * 495 + ">TAIL"
    assert mute.is_error and mute.content.endswith("did not answer: no reply within 0.3s")


async def test_an_exec_result_is_capped_at_the_source_and_stays_whole_json(tmp_path: Path) -> None:
    # 200 KiB of line breaks: the 64 KiB kept are 128 KiB once escaped in the JSON result.
    spec = parse_exec_tool(
        {"name": "breaks", "command": [sys.executable, "-c", "print('\\n' * 204799)"]},
        index=0,
        source="agent.yaml",
    )
    outcome = await ToolBox.of([exec_tool(spec, work_dir=tmp_path)]).invoke("breaks", {})
    result = json.loads(outcome.content)
    assert result["output"] == "\n" * 32768 + marker(204800 - KIB64, 204800) + "\n" * 32768
    assert result["truncated"] is True and result["exit_code"] == 0

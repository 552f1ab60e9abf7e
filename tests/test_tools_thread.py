"""A synchronous Python tool runs in a worker thread: the event loop stays free meanwhile.

Signals, timeouts and the other runs of a supervisor are all served by the loop, so a blocking
tool must not hold it. The tool below blocks until a task on the loop lets it go, and that task
lets it go only after seeing the loop run while the tool is inside. Run on the loop thread, the
tool would wait for a task that cannot run: it gives up after GUARD seconds (a guard against a
hang, not a time limit on the test) and the run records that it was never released.
"""

from __future__ import annotations

import asyncio
import threading

from fisk_sm import MemoryJournal, Run, parse_config, tool
from fisk_sm.loop.harness import RunOptions
from fisk_sm.testing import FakeMessagesAPI, Reply

GUARD = 30.0
TICKS = 20


async def test_the_loop_keeps_running_while_a_blocking_tool_works(api: FakeMessagesAPI) -> None:
    loop = asyncio.get_running_loop()
    inside, release = asyncio.Event(), threading.Event()
    tool_thread: list[threading.Thread] = []

    def block(label: str) -> str:
        """Block until the event loop releases the tool."""
        tool_thread.append(threading.current_thread())
        loop.call_soon_threadsafe(inside.set)
        return "released" if release.wait(GUARD) else "never released"

    ticks = 0

    async def watch() -> None:
        nonlocal ticks
        await inside.wait()
        for _ in range(TICKS):  # the loop runs while the tool blocks
            await asyncio.sleep(0)
            ticks += 1
        release.set()

    llm = {"model": "claude-test", "base_url": api.base_url, "no_prompt_cache": True}
    config = parse_config({"llm": llm}, env={})
    api.add(Reply.tool_use("block", {"label": "x"}, id="toolu_x"), Reply.text("done"))
    journal = MemoryJournal()
    options = RunOptions(tools=[tool(block)], journal=journal)
    run = Run.create(config, "go", options)
    watcher = asyncio.create_task(watch())
    try:
        assert await run.run() == "completed"
    finally:
        release.set()
        watcher.cancel()
        await run.aclose()
    result = api.requests[1]["messages"][-1]["content"][0]
    assert result["content"] == "released", result
    assert ticks == TICKS
    assert tool_thread and tool_thread[0] is not threading.main_thread()

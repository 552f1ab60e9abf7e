"""The full-screen UI, measured against a bare Textual app in the same run: (1) a streamed
answer at 500 tokens/s, (2) the Operate screen with 1,000 runs at 50 events/s.

(1) **Streaming.** Tokens (`--token-chars` characters each) are handed to the app at `--tps`
a second for `--seconds`, from a task on the app's own event loop, as the model's stream
hands them over (`AnthropicModel(on_text=...)`):

* **tui**: `fisk_sm.tui.app.RunApp` (every pane there), each token given to its sink's
  `on_text`, which posts a `TextStreamed` message that `can_replace` a pending one: the app
  takes in as much text per message as has come.
* **bare**: a Textual app with one `Static`, each token posted as its own message whose handler
  appends it and updates the `Static` with the text so far: one repaint request per token.

The **backlog at the end** is the time from the last token handed over until the first frame
Textual composes (`App._display` with an update; headless, nothing is written) after the pane
holds the whole text. Also: the lag during the stream (every 100 ms, the time since the oldest
token not yet on screen), the messages handled and the tokens/s achieved.

(2) **Operate**: see bench/tui_operate.py (its `operate_figure`, printed here).

    .venv/bin/python bench/tui.py [--tps 500] [--seconds 10] [--runs 1000] [--rate 50] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from textual.app import App, ComposeResult  # noqa: E402
from textual.message import Message  # noqa: E402
from textual.widgets import Static  # noqa: E402
from tui_operate import operate_figure, print_figure, watch_frames  # noqa: E402

from fisk_sm.config.agent import Budget  # noqa: E402
from fisk_sm.loop.run import Run, loop_machine  # noqa: E402
from fisk_sm.tui.app import RunApp, Wiring  # noqa: E402
from fisk_sm.tui.transcript import Transcript  # noqa: E402

SIZE = (150, 44)


class Stream:
    """The tokens handed over, stamped, and what the screen showed of them, frame by frame."""

    def __init__(self, tps: float, seconds: float, chars: int) -> None:
        self.tps, self.count, self.chars = tps, max(1, int(tps * seconds)), chars
        self.sent: list[float] = []  # when token i was handed over
        self.shown = 0  # tokens on screen at the last frame
        self.lags: list[float] = []
        self.done: asyncio.Event | None = None
        self.end: float | None = None

    def token(self, i: int) -> str:
        return f"w{i % 1000:03d}"[: self.chars - 1].ljust(self.chars - 1, "x") + " "

    async def feed(self, hand: Any) -> None:
        start = time.perf_counter()
        for i in range(self.count):
            delay = start + i / self.tps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.sent.append(time.perf_counter())
            hand(self.token(i))

    def frame(self, chars_on_screen: int) -> None:
        now = time.perf_counter()
        self.shown = chars_on_screen // self.chars
        if self.shown < len(self.sent):
            self.lags.append(now - self.sent[self.shown])
        elif self.shown == self.count and self.end is None:
            self.end = now
            assert self.done is not None
            self.done.set()

    def figures(self, messages: int) -> dict[str, float]:
        last = self.sent[-1]
        took = last - self.sent[0] if self.count > 1 else 1.0
        return {
            "backlog_ms": ((self.end or last) - last) * 1e3,
            "lag_median_ms": statistics.median(self.lags) * 1e3 if self.lags else 0.0,
            "lag_max_ms": max(self.lags) * 1e3 if self.lags else 0.0,
            "tps": (self.count - 1) / took if self.count > 1 else 0.0,
            "messages": messages,
        }


async def _never(wiring: Wiring, prompt: str | None) -> Run:
    await asyncio.Event().wait()  # the bench hands the text over itself: no run
    raise AssertionError


async def _tui(stream: Stream) -> dict[str, float]:
    app = RunApp(_never, loop_machine().table, Budget(), "stream, please")
    handled = 0
    stream.done = asyncio.Event()

    def hook(message: Message) -> None:
        nonlocal handled
        handled += type(message).__name__ == "TextStreamed"

    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await pilot.pause()
        transcript = app.query_one(Transcript)

        def on_frame() -> None:
            entry = transcript.streaming
            stream.frame(0 if entry is None else sum(len(p) for p in entry.pieces))

        watch_frames(app, on_frame)
        await stream.feed(app.sink.on_text)
        await asyncio.wait_for(stream.done.wait(), 60)
        app.exit()
    return stream.figures(handled)


class Token(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class BareApp(App[None]):
    """One Static, each token its own message and update."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.handled = 0

    def compose(self) -> ComposeResult:
        yield Static(id="text", markup=False)

    def on_token(self, message: Token) -> None:
        self.handled += 1
        self.text.append(message.text)
        self.query_one(Static).update("".join(self.text))


async def _bare(stream: Stream) -> dict[str, float]:
    app = BareApp()
    stream.done = asyncio.Event()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        watch_frames(app, lambda: stream.frame(sum(len(t) for t in app.text)))
        await stream.feed(lambda text: app.post_message(Token(text)))
        await asyncio.wait_for(stream.done.wait(), 60)
        app.exit()
    return stream.figures(app.handled)


def stream_figure(tps: float, seconds: float, chars: int) -> dict[str, dict[str, float]]:
    """Both sides of the streaming figure, the bare app first."""
    bare = asyncio.run(_bare(Stream(tps, seconds, chars)))
    tui = asyncio.run(_tui(Stream(tps, seconds, chars)))
    return {"bare": bare, "tui": tui}


def print_stream(found: dict[str, dict[str, float]], tps: float, seconds: float) -> None:
    print(f"(1) a streamed answer, {tps:g} tokens/s for {seconds:g} s (target: backlog < 100 ms)")
    print(f"  {'':6} {'backlog':>10} {'lag median':>11} {'lag max':>9} {'tokens/s':>9} {'msgs':>7}")
    for side in ("bare", "tui"):
        f = found[side]
        print(
            f"  {side:6} {f['backlog_ms']:8.1f}ms {f['lag_median_ms']:9.1f}ms"
            f" {f['lag_max_ms']:7.1f}ms {f['tps']:9.0f} {f['messages']:7.0f}"
        )
    bare, tui = found["bare"]["backlog_ms"], found["tui"]["backlog_ms"]
    print(f"  backlog at the end, tui/bare: {tui / bare if bare else float('nan'):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tps", type=float, default=500, help="tokens a second")
    parser.add_argument("--seconds", type=float, default=10, help="how long each stream lasts")
    parser.add_argument("--token-chars", type=int, default=5, help="characters a token")
    parser.add_argument("--runs", type=int, default=1000, help="Operate: the runs listed")
    parser.add_argument("--rate", type=float, default=50, help="Operate: events a second")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds of runtime")
    parser.add_argument("--stream-only", action="store_true", help="figure (1) alone")
    parser.add_argument("--operate-only", action="store_true", help="figure (2) alone")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.runs = 0.5, 50
    if not args.operate_only:
        found = stream_figure(args.tps, args.seconds, args.token_chars)
        print_stream(found, args.tps, args.seconds)
        print()
    if args.stream_only:
        return 0
    print("(2) Operate")
    found_operate = operate_figure(args.runs, args.rate, args.seconds)
    print_figure(found_operate, args.runs, args.rate, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Typed messages: frozen attrs records over json.loads dicts, or msgspec.Struct, measured.

A realistic conversation (a prompt, then `--turns` assistant turns, each with a thinking block
and its signature, text and one or two tool_use blocks, each answered by a user message of
tool_result blocks; the thinking blocks carry an unknown key, and one turn holds a block of a
type fisk-sm does not know) is decoded from its JSON bytes into typed messages and encoded back,
both ways:

* attrs: `json.loads`, then `fisk_sm.model.blocks.message_of` per message (each block keeps its
  JSON object); encode is `json.dumps` of `Message.to_json()`;
* msgspec: `msgspec.json.decode(..., type=list[Message])` into tagged `msgspec.Struct`s, encode
  with `msgspec.json.encode`.

It prints µs per conversation for each, their ratios, and whether each round trip gave back
the same JSON (same keys, same order, same values): the rule the choice must meet, since a
thinking block's signature covers what the model sent. msgspec drops unknown keys and cannot
hold an unknown block type in a tagged union, so it fails it unless each block also keeps its
raw JSON, which gives its speed back.

Run: `.venv/bin/python bench/messages.py [--turns 50] [--repeats 7]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec

from fisk_sm.model.blocks import message_of


class MText(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class MToolUse(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class MToolResult(msgspec.Struct, tag="tool_result", tag_field="type", omit_defaults=True):
    tool_use_id: str
    content: str | list[dict[str, Any]]
    is_error: bool = False


class MThinking(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str


MBlock = MText | MToolUse | MToolResult | MThinking


class MMessage(msgspec.Struct):
    role: str
    content: str | list[MBlock]


def conversation(turns: int, *, unknown_keys: bool = True, unknown_type: bool = True) -> Any:
    """A prompt, then `turns` tool turns (thinking, text, tool_use) and their results."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Survey the repository."}]
    for n in range(turns):
        thinking: dict[str, Any] = {
            "type": "thinking",
            "thinking": f"Step {n}: I should look at the files. " * 8,
            "signature": "EqQBCkgIARABGAIiQL" + "x" * 300,
        }
        if unknown_keys:
            thinking["citations_v9"] = None  # an unknown key the API may add
        blocks: list[dict[str, Any]] = [
            thinking,
            {"type": "text", "text": f"Looking at part {n} of the tree."},
            {"type": "tool_use", "id": f"toolu_{n:04d}a", "name": "read", "input": {"p": f"{n}"}},
        ]
        if n % 3 == 0:
            blocks.append(
                {"type": "tool_use", "id": f"toolu_{n:04d}b", "name": "grep", "input": {"q": "def"}}
            )
        if unknown_type and n == turns // 2:
            blocks.insert(1, {"type": "future_block", "payload": {"k": [1, 2]}, "z": "last"})
        messages.append({"role": "assistant", "content": blocks})
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "line\n" * 40}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    return messages


def attrs_decode(data: bytes) -> Any:
    """JSON bytes to attrs records (each block keeps its parsed object)."""
    return [message_of(m) for m in json.loads(data)]


def attrs_encode(messages: Any) -> bytes:
    """attrs records to JSON bytes."""
    return json.dumps([m.to_json() for m in messages], ensure_ascii=False).encode()


_DECODER = msgspec.json.Decoder(list[MMessage])
_ENCODER = msgspec.json.Encoder()
WAYS: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = {
    "attrs": (attrs_decode, attrs_encode),
    "msgspec": (_DECODER.decode, _ENCODER.encode),
}


def _time(fn: Callable[[Any], Any], arg: Any, repeats: int, number: int) -> float:
    """The median µs per call over `repeats` runs of `number` calls."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn(arg)
        runs.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(runs)


def _same(data: bytes, out: bytes) -> bool:
    """Same JSON: keys, their order and values (compared as ordered pairs)."""

    def pairs(text: bytes) -> Any:
        return json.loads(text, object_pairs_hook=lambda p: p)

    return bool(pairs(data) == pairs(out))


def _exact(way: str, data: bytes) -> str:
    """Whether `way` gives back the same JSON for `data` ("no (why)" if it refuses it)."""
    decode, encode = WAYS[way]
    try:
        return "yes" if _same(data, encode(decode(data))) else "no"
    except msgspec.ValidationError as exc:
        return f"no ({str(exc).split(' - ')[0]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=50)
    args = parser.parse_args()
    known = json.dumps(conversation(args.turns, unknown_keys=False, unknown_type=False)).encode()
    keys = json.dumps(conversation(args.turns, unknown_type=False)).encode()
    both = json.dumps(conversation(args.turns)).encode()
    print(
        f"conversation: {args.turns} turns, {len(known)} bytes; µs, median of {args.repeats} runs"
    )
    print(f"{'contender':9} {'decode':>8} {'encode':>8} {'round trip':>10}  same JSON back?")
    figures: dict[str, tuple[float, float]] = {}
    for way, (decode, encode) in WAYS.items():
        decoded = decode(known)
        figures[way] = (
            _time(decode, known, args.repeats, args.number),
            _time(encode, decoded, args.repeats, args.number),
        )
        d, e = figures[way]
        print(
            f"{way:9} {d:8.1f} {e:8.1f} {d + e:10.1f}  known keys: {_exact(way, known)};"
            f" unknown keys: {_exact(way, keys)}; unknown type: {_exact(way, both)}"
        )
    (ad, ae), (md, me) = figures["attrs"], figures["msgspec"]
    print(
        f"attrs / msgspec: decode {ad / md:.2f}x, encode {ae / me:.2f}x,"
        f" round trip {(ad + ae) / (md + me):.2f}x"
    )


if __name__ == "__main__":
    main()

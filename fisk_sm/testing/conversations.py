"""Per-conversation scripts for the fake Messages API: many runs, and resumes, on one server.

A request belongs to the conversation named by its first user message: that message's text
when its content is a string, else the text of its first text block (:func:`first_user_text`).
Its *turn* is the number of assistant messages already in ``messages`` (:func:`turn_of`): the
first request of a run is turn 0, the request after the first tool result is turn 1, and so on.
Turn k is answered by the k-th scripted reply of its conversation, whatever the order in which
requests of different conversations arrive.

That makes resume deterministic without re-scripting: a run suspended while its call was in
flight (the call cancelled, never journaled) asks for the same turn again when it resumes, and
gets the same reply, tool_use ids and all. The SDK's retries also ask again: a turn scripted as
a sequence of replies answers its attempts in order, and its last reply answers every attempt
after that, so ``(Reply.error(529), Reply.text("ok"))`` is an overload that a retry gets past.

A request for an unknown conversation, or for a turn beyond its script, is answered with a 500
naming the conversation and the turn (and ``x-should-retry: false``, so it fails at once); it is
recorded like any other request.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fisk_sm.testing.script import Reply

__all__ = ["Turn", "first_user_text", "tool_turns", "turn_of"]

#: One scripted turn: a reply for every attempt, or one per attempt (the last one repeats).
Turn = Reply | Sequence[Reply]


def first_user_text(body: Mapping[str, Any]) -> str | None:
    """The conversation key of a request body: its first user message's text, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") == "text":
                    text = block.get("text")
                    return text if isinstance(text, str) else None
            return None
    return None


def turn_of(body: Mapping[str, Any]) -> int:
    """The request's position in its conversation: how many assistant turns it already holds."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def tool_turns(
    turns: int = 2,
    *,
    tool: str = "echo",
    input: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
    answer: str = "done",
    delay: float = 0.0,
) -> list[Reply]:
    """The common conversation: ``turns`` calls of ``tool``, then the text ``answer``.

    ``input`` is each call's arguments (a mapping, or a function of the turn number; default
    ``{}``); every reply waits ``delay`` seconds. Use it as a conversation's script, e.g.
    ``FakeMessagesAPI(conversations={p: tool_turns(2, answer=p.upper()) for p in prompts})``.
    """
    if turns < 0:
        raise ValueError(f"turns must be >= 0, not {turns}")

    def args(i: int) -> Mapping[str, Any]:
        return input(i) if callable(input) else (input or {})

    calls = [Reply.tool_use(tool, args(i), delay=delay) for i in range(turns)]
    return [*calls, Reply.text(answer, delay=delay)]


def _attempts(turn: Turn, where: str) -> tuple[Reply, ...]:
    replies = (turn,) if isinstance(turn, Reply) else tuple(turn)
    if not replies or not all(isinstance(r, Reply) for r in replies):
        raise TypeError(f"{where}: expected a Reply or a non-empty sequence of Replies")
    return replies


def _shown(key: str | None) -> str:
    if key is None:
        return "(no user text)"
    return repr(key if len(key) <= 60 else key[:57] + "...")


class Conversations:
    """The keyed scripts of one fake server and the requests each conversation received.

    Thread-safe: the server's handler threads choose replies through it concurrently.
    """

    def __init__(self, scripts: Mapping[str, Sequence[Turn]] | None = None) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[tuple[Reply, ...]]] = {}
        self._attempts: Counter[tuple[str, int]] = Counter()
        self._requests: dict[str | None, list[dict[str, Any]]] = {}
        for key, turns in (scripts or {}).items():
            self.add(key, *turns)

    def add(self, key: str, *turns: Turn) -> None:
        """Append turns to the script of conversation ``key`` (creating it)."""
        if not isinstance(key, str):
            raise TypeError(f"a conversation key is the first user message's text, not {key!r}")
        parsed = [
            _attempts(t, f"conversation {_shown(key)}: turn {i}") for i, t in enumerate(turns)
        ]
        with self._lock:
            self._scripts.setdefault(key, []).extend(parsed)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._scripts)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._scripts

    def record(self, key: str | None, body: dict[str, Any]) -> None:
        """Log ``body`` under its conversation (any key, scripted or not)."""
        with self._lock:
            self._requests.setdefault(key, []).append(body)

    def requests_for(self, key: str | None) -> list[dict[str, Any]]:
        """A copy of the request bodies of conversation ``key``, in arrival order."""
        with self._lock:
            return list(self._requests.get(key, ()))

    def answer(self, key: str | None, turn: int) -> Reply | str:
        """The reply for this attempt at ``turn`` of ``key``, or why there is none."""
        with self._lock:
            script = None if key is None else self._scripts.get(key)
            if key is None or script is None:
                return f"fake API: no conversation scripted for first user message {_shown(key)}"
            if turn >= len(script):
                return (
                    f"fake API: conversation {_shown(key)} has {len(script)} scripted turns,"
                    f" none for turn {turn}"
                )
            attempt = self._attempts[key, turn]
            self._attempts[key, turn] += 1
            replies = script[turn]
            return replies[min(attempt, len(replies) - 1)]

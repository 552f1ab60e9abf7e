"""A text/event-stream parser, fed one line at a time (standard library only: `ctl` uses it)."""

from __future__ import annotations

__all__ = ["SseParser", "data_fields"]

#: A parsed event: (its `id:` or None, its name, its data lines joined).
Parsed = tuple["str | None", str, str]


class SseParser:
    """Turns the lines of an event stream into events: `feed` each line (a trailing newline is
    ignored) and take the event it completes; `end` gives what an unterminated last one had."""

    def __init__(self) -> None:
        self.name = ""
        self.id: str | None = None
        self.data: list[str] = []

    def feed(self, line: str | bytes) -> Parsed | None:
        """Take one line; the event it ends (a blank line after data), or None."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.rstrip("\r\n")
        if not line:
            return self.end()
        if line.startswith(":"):
            return None  # a comment: the server's keep-alive
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self.name = value
        elif field == "data":
            self.data.append(value)
        elif field == "id" and "\0" not in value:
            self.id = value
        return None

    def end(self) -> Parsed | None:
        """The event gathered so far (if it has data), and start afresh."""
        found = (self.id, self.name or "message", "\n".join(self.data)) if self.data else None
        self.name, self.id, self.data = "", None, []
        return found


def data_fields(data: str) -> dict[str, object]:
    """An event's data as a JSON object: `{"data": ...}` around what is not one."""
    import json  # where first used: `ctl --help` loads this module

    try:
        fields = json.loads(data)
    except ValueError:
        return {"data": data}
    return fields if isinstance(fields, dict) else {"data": fields}

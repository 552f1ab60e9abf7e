"""`fisk-sm ctl`: the command-line client of a supervisor's control API.

It speaks the JSON-over-HTTP API of `fisk-sm supervise` with the standard library alone
(`urllib.request`; the event stream is read line by line), so the client needs nothing the
package does not already ship. It finds the supervisor with `--url`, else `$FISK_SM_URL`, else the
URL `fisk-sm supervise` wrote to `supervisor.url` in the default sessions directory
($XDG_STATE_HOME/fisk-sm/runs), else http://127.0.0.1:8765.

Exit codes: 0 ok, 1 the server said no (404 unknown run or approval, 409 wrong state, or any other
error it answered with), 2 bad input (arguments, or a body the server refused with 400),
69 (EX_UNAVAILABLE) no supervisor answered at the URL, 77 (EX_NOPERM) the token was refused.
Human output passes every server string through the sanitizer; `--json` prints the server's JSON
(one object per line for events), byte-exact unless stdout is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from fisk_sm.cli.ctl_format import (
    approvals_table,
    event_line,
    run_line,
    runs_table,
    show_run,
)
from fisk_sm.journal.filestore import default_directory
from fisk_sm.operator.sanitize import for_terminal, sanitize, say

__all__ = [
    "DEFAULT_URL",
    "EXIT_NOPERM",
    "EXIT_UNAVAILABLE",
    "CtlError",
    "add_ctl_parser",
    "cmd_ctl",
    "default_url",
]

DEFAULT_URL = "http://127.0.0.1:8765"
#: No supervisor answered (sysexits.h EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: The supervisor refused the token (sysexits.h EX_NOPERM).
EXIT_NOPERM = 77
#: How long a request (not the event stream) may wait for its answer.
TIMEOUT = 30.0
ANSWERS = ("once", "always", "deny")


class CtlError(Exception):
    """What ends `ctl` early: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def default_url(env: dict[str, str] | None = None) -> str:
    """`$FISK_SM_URL`, else the URL in the default sessions directory's `supervisor.url`
    (`$XDG_STATE_HOME/fisk-sm/runs`), else 127.0.0.1:8765."""
    env = dict(os.environ) if env is None else env
    if env.get("FISK_SM_URL"):
        return env["FISK_SM_URL"]
    try:  # where `supervise` writes it with the default sessions directory
        written = (default_directory(env) / "supervisor.url").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        written = ""
    return written.strip() or DEFAULT_URL


def _checked_url(url: str) -> str:
    """`url` without a trailing slash, or a CtlError (exit 2) naming --url."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CtlError(f"--url: not an http(s) URL: {sanitize(url, 200)}", 2)
    try:
        parts.port  # noqa: B018 - the property validates the port
    except ValueError:
        raise CtlError(f"--url: bad port in {sanitize(url, 200)}", 2) from None
    return url.rstrip("/")


def _checked_token(token: str) -> str:
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in token):
        raise CtlError("--token: only printable ASCII without spaces is allowed", 2)
    return token


class Client:
    """The control API at `url`, with `token` (if any) as a bearer token."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = _checked_url(url)
        self.token = _checked_token(token) if token else None

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise _refusal(e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CtlError(
                f"cannot connect to the supervisor at {self.url}: {reason}", EXIT_UNAVAILABLE
            ) from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        """The body of the server's (2xx) answer to `method path`."""
        with self._open(self._request(method, path, body), TIMEOUT) as response:
            try:
                return bytes(response.read())
            except OSError as e:  # a timeout too
                raise CtlError(f"{self.url}: the answer broke off: {e}", EXIT_UNAVAILABLE) from None

    def stream(self, path: str) -> Any:
        """The open response of the event stream at `path` (once subscribed, before any event):
        read it with `_sse`."""
        request = self._request("GET", path, None)
        request.add_header("Accept", "text/event-stream")
        return self._open(request, None)


def _refusal(error: urllib.error.HTTPError) -> CtlError:
    """The server's `{"error": ...}` as one line, with the exit code its status means."""
    try:
        message = str(json.loads(error.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        message = str(error.reason)
    status = error.code
    code = {400: 2, 401: EXIT_NOPERM, 403: EXIT_NOPERM}.get(status, 1)
    return CtlError(f"the supervisor answered {status}: {sanitize(message, 300)}", code)


def _sse(lines: Any) -> Iterator[tuple[str, str]]:
    """Parse a text/event-stream: each event's name (default "message") and joined data lines."""
    name, data = "", list[str]()
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name or "message", "\n".join(data)
            name, data = "", list[str]()
        elif line.startswith(":"):
            continue  # a comment: the server's keep-alive
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    if data:
        yield name or "message", "\n".join(data)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise CtlError(
            "the server's answer is not JSON: is that a fisk-sm supervisor?", 1
        ) from None


def _run_path(run_id: str, *rest: str) -> str:
    if not run_id:
        raise CtlError("RUN: empty run id", 2)
    return "/".join(["/api/runs", *(urllib.parse.quote(p, safe="") for p in (run_id, *rest))])


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _print_json(body: bytes) -> None:
    """The server's JSON as it came (stripped of controls only on a terminal)."""
    _out(for_terminal(body.decode("utf-8", "replace").strip(), sys.stdout))


def _run_command(client: Client, args: argparse.Namespace) -> int:
    """Every command but `events`: one request, one answer."""
    command = args.ctl_command
    if command == "submit":
        body: dict[str, Any] = {"prompt": args.prompt}
        if args.name is not None:
            body["name"] = args.name
        if args.config is not None:
            body["config"] = args.config
        raw = client.call("POST", "/api/runs", body)
    elif command == "ls":
        raw = client.call("GET", "/api/runs")
    elif command == "show":
        raw = client.call("GET", _run_path(args.run))
    elif command in ("suspend", "resume", "abort"):
        raw = client.call("POST", _run_path(args.run, command))
    elif command == "approve":
        path = _run_path(args.run, "approvals", args.tool_use_id)
        raw = client.call("POST", path, {"answer": args.answer})
    else:  # approvals
        raw = client.call("GET", "/api/approvals")
    if args.json:
        _print_json(raw)
        return 0
    value = _json(raw)
    if not isinstance(value, dict):
        raise CtlError("the server's answer is not a JSON object", 1)
    if command == "submit":
        _out(sanitize(str(value.get("run_id", ""))))
    elif command == "ls":
        _out(runs_table(value.get("runs") or []))
    elif command == "show":
        _out(show_run(value))
    elif command == "approvals":
        _out(approvals_table(value.get("approvals") or []))
    else:
        verb = f"answered {args.answer}" if command == "approve" else f"{command} requested"
        _out(run_line(value, verb))
    return 0


#: The statuses of a run that is still going on its own (the others wait for an operator, or ended).
ACTIVE = ("queued", "running")
#: The supervisor's events whose data is the run's `Run` JSON.
RUN_EVENTS = ("RunSubmitted", "RunParked", "RunUpdated")


def _stopped(name: str, fields: dict[str, Any]) -> bool:
    """Whether the event says its run stopped: it parked, was suspended or ended."""
    if name == "RunEnded":
        return True
    return name in RUN_EVENTS and fields.get("status") not in ACTIVE


def _events(client: Client, args: argparse.Namespace) -> int:
    """`ctl events`: one line per event. With --follow, until interrupted; without, until
    every run that was queued or running (or RUN, with --run) has stopped."""
    query = "?" + urllib.parse.urlencode({"run": args.run}) if args.run else ""
    with client.stream("/api/events" + query) as response:
        waiting: set[str] | None = None
        if args.follow:  # subscribed: from here on no event is missed
            say(f"fisk-sm ctl: following the events of {client.url} (interrupt to stop)")
        else:  # subscribed before listing: no run can stop unseen in between
            if args.run:
                runs = [_json(client.call("GET", _run_path(args.run)))]
            else:
                listing = _json(client.call("GET", "/api/runs"))
                runs = listing.get("runs") or [] if isinstance(listing, dict) else []
            runs = [r for r in runs if isinstance(r, dict)]
            waiting = {str(r.get("run_id")) for r in runs if r.get("status") in ACTIVE}
            if not waiting:
                return 0
            say(f"fisk-sm ctl: the events of {client.url} until {len(waiting)} run(s) stop")
        for name, data in _sse(response):
            try:
                fields = json.loads(data)
            except ValueError:
                fields = {"data": data}
            if not isinstance(fields, dict):
                fields = {"data": fields}
            if args.json:
                _out(for_terminal(" ".join(data.splitlines()), sys.stdout))
            else:
                _out(event_line(name, fields))
            if waiting is not None and _stopped(name, fields):
                waiting.discard(str(fields.get("run_id")))
                if not waiting:
                    return 0
    raise CtlError(f"the supervisor at {client.url} closed the event stream", EXIT_UNAVAILABLE)


def cmd_ctl(args: argparse.Namespace) -> int:
    """`fisk-sm ctl COMMAND`: one line on stderr and an exit code for any failure."""
    try:
        client = Client(args.url or default_url(), args.token or os.environ.get("FISK_SM_TOKEN"))
        if args.ctl_command == "events":
            return _events(client, args)
        return _run_command(client, args)
    except CtlError as e:
        say(f"fisk-sm ctl: {e}")
        return e.code
    except BrokenPipeError:  # `ctl events --follow | head`: the reader has had enough
        # Python would report the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


HELP = """\
commands:
  submit PROMPT [--name N] [--config F]   start a run; prints its run id
  ls                                      the runs, newest first (state, progress, approval)
  show RUN                                one run: counters, path, pending approval, transcript
  suspend RUN | resume RUN | abort RUN    control a run
  approvals                               the approvals waiting for an answer
  approve RUN TOOL_USE_ID once|always|deny
                                          answer one
  events [--follow] [--run RUN]           the event stream, one line per event, until
                                          the runs stop (or for ever, --follow)

exit codes: 0 ok, 1 the server said no (unknown run, wrong state), 2 bad input,
69 cannot connect to the supervisor, 77 the token was refused.
"""


def add_ctl_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `ctl` and its commands to the `fisk-sm` subparsers."""
    # The global options work before or after the command (`ctl --json ls`, `ctl ls --json`):
    # the copy on each command defaults to SUPPRESS so it never overwrites the first.
    ctl: argparse.ArgumentParser = subparsers.add_parser(
        "ctl",
        help="control a running supervisor (submit, ls, show, approve, events, ...)",
        description="The command-line client of `fisk-sm supervise`'s control API. It finds the"
        " supervisor with --url, else $FISK_SM_URL, else the URL `supervise` wrote to"
        " supervisor.url in the default sessions directory ($XDG_STATE_HOME/fisk-sm/runs), else "
        + DEFAULT_URL
        + ".",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(ctl, None)
    shared = argparse.ArgumentParser(add_help=False)
    _global_options(shared, argparse.SUPPRESS)
    sub = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(
            name, parents=[shared], help=help, description=description
        )
        return parser

    submit = command("submit", "start a run", "Submit PROMPT as a new run; prints its run id.")
    submit.add_argument("prompt", metavar="PROMPT", help="the user's first message")
    submit.add_argument("--name", help="a name to show for the run")
    submit.add_argument("--config", metavar="F", help="the agent.yaml, on the supervisor's side")
    command(
        "ls",
        "list the runs",
        "The runs, newest first: status, state, iteration, tokens,"
        " age and the tool of a pending approval.",
    )
    for name, short, what in (
        (
            "show",
            "show one run",
            "Show RUN: status, state, counters, the states it went"
            " through, a pending approval, and the transcript's tail.",
        ),
        (
            "suspend",
            "suspend a run",
            "Suspend RUN: a model call in flight is cancelled (it is"
            " asked again on resume), a tool in flight finishes; an approval stays pending.",
        ),
        (
            "resume",
            "resume a suspended run",
            "Resume RUN, suspended by an operator or by a"
            " shutdown; a pending approval is asked again.",
        ),
        ("abort", "abort a run", "Abort RUN: it ends for good and cannot be resumed."),
    ):
        command(name, short, what).add_argument("run", metavar="RUN", help="the run id")
    command("approvals", "list pending approvals", "The tool calls waiting for an operator.")
    approve = command(
        "approve",
        "answer a pending approval",
        "Answer the approval of tool call TOOL_USE_ID of RUN: once (run it), always (run it and"
        " every later call of that tool in the run), deny (the model gets the denial result).",
    )
    approve.add_argument("run", metavar="RUN", help="the run id")
    approve.add_argument("tool_use_id", metavar="TOOL_USE_ID", help="the pending tool call's id")
    approve.add_argument("answer", choices=ANSWERS, help="once, always or deny")
    events = command(
        "events",
        "print the event stream",
        "Print the supervisor's events as they happen, one line each: `HH:MM:SS RUN EventType"
        " key=value...` (--json: the server's JSON object, one a line). With --follow it waits"
        " for more until interrupted; without, it stops once every run that was queued or"
        " running (or RUN, with --run) has stopped: parked for an approval, suspended or ended.",
    )
    events.add_argument("--follow", "-f", action="store_true", help="keep waiting for events")
    events.add_argument("--run", metavar="RUN", help="only this run's events")
    ctl.set_defaults(func=cmd_ctl)
    return ctl


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    kw: dict[str, Any] = {} if default is None else {"default": default}
    parser.add_argument("--url", help="the supervisor's URL ($FISK_SM_URL)", **kw)
    parser.add_argument("--token", help="bearer token ($FISK_SM_TOKEN)", **kw)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the server's JSON instead of text",
        **({"default": False} if default is None else kw),
    )

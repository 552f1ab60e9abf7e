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
import os
import re
import sys

from fisk_sm.cli.ctl_client import (
    DEFAULT_URL,
    EXIT_NOPERM,
    EXIT_UNAVAILABLE,
    Client,
    CtlError,
    EventFeed,
    parse_json,
)
from fisk_sm.cli.ctl_format import (
    approvals_table,
    event_line,
    run_line,
    runs_table,
    show_run,
)
from fisk_sm.cli.ctl_scripts import add_script_commands, run_script_command
from fisk_sm.cli.helpformat import HelpFormatter, RawDescriptionHelpFormatter
from fisk_sm.client.locate import default_token, default_url
from fisk_sm.client.sse import data_fields
from fisk_sm.journal.ids import run_id_problem
from fisk_sm.operator.sanitize import for_terminal, sanitize, say

# `ctl --help` needs neither json nor urllib.parse (each imported where it is used) nor typing.
#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "DEFAULT_URL",
    "EXIT_NOPERM",
    "EXIT_UNAVAILABLE",
    "CtlError",
    "add_ctl_parser",
    "cmd_ctl",
    "default_url",
]

#: A tool_use id as the API gives them (`toolu_...`, or the desk's `call-N`).
_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")


def _run_path(run_id: str, *rest: str) -> str:
    """`/api/runs/RUN/...`; a RUN or TOOL_USE_ID that could step out of it is bad input."""
    problem = run_id_problem(run_id)
    if problem is not None:
        raise CtlError(f"RUN: {sanitize(problem, 200)}", 2)
    if rest[1:2] and not _TOOL_USE_ID.fullmatch(rest[1]):
        raise CtlError(f"TOOL_USE_ID: not a tool_use id: {sanitize(rest[1], 80)!r}", 2)
    import urllib.parse

    return "/".join(["/api/runs", *(urllib.parse.quote(p, safe="") for p in (run_id, *rest))])


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _printparse_json(body: bytes) -> None:
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
        if args.chat:
            body["chat"] = True
        raw = client.call("POST", "/api/runs", body)
    elif command == "ls":
        raw = client.call("GET", "/api/runs")
    elif command == "show":
        raw = client.call("GET", _run_path(args.run))
    elif command in ("suspend", "resume", "abort", "end"):
        raw = client.call("POST", _run_path(args.run, command))
    elif command == "say":
        raw = client.call("POST", _run_path(args.run, "say"), {"text": args.text})
    elif command == "approve":
        path = _run_path(args.run, "approvals", args.tool_use_id)
        raw = client.call("POST", path, {"answer": args.answer})
    else:  # approvals
        raw = client.call("GET", "/api/approvals")
    if args.json:
        _printparse_json(raw)
        return 0
    value = parse_json(raw)
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
        if command == "approve":  # the run takes the answer after this reply: no status yet
            _out(f"{sanitize(args.run)}: answered {args.answer} ({sanitize(args.tool_use_id)})")
        elif command == "say":  # likewise the follow-up
            _out(f"{sanitize(args.run)}: follow-up posted")
        else:
            _out(run_line(value, f"{command} requested"))
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


def _waiting(client: Client, args: argparse.Namespace) -> set[str]:
    """The runs (RUN, with --run) that are queued or running now."""
    if args.run:
        runs = [parse_json(client.call("GET", _run_path(args.run)))]
    else:
        listing = parse_json(client.call("GET", "/api/runs"))
        runs = listing.get("runs") or [] if isinstance(listing, dict) else []
    return {str(r.get("run_id")) for r in runs if isinstance(r, dict) and r.get("status") in ACTIVE}


def _events(client: Client, args: argparse.Namespace) -> int:
    """`ctl events`: one line per event. With --follow, until interrupted; without, until
    every run that was queued or running (or RUN, with --run) has stopped. A dropped stream is
    opened again after the last event printed (`EventFeed`); on a gap (events lost) a note says
    what to reload, and without --follow the runs waited for are read again."""
    import urllib.parse

    if args.run:
        _run_path(args.run)  # the same check as every other RUN
    query = "?" + urllib.parse.urlencode({"run": args.run}) if args.run else ""
    feed = EventFeed(client, "/api/events" + query)
    feed.open()  # subscribed: from here on no event is missed
    waiting: set[str] | None = None
    if args.follow:
        say(f"fisk-sm ctl: following the events of {client.url} (interrupt to stop)")
    else:  # subscribed before listing: no run can stop unseen in between
        waiting = _waiting(client, args)
        if not waiting:
            feed.close()
            return 0
        say(f"fisk-sm ctl: the events of {client.url} until {len(waiting)} run(s) stop")
    for _, name, data in feed:
        fields = data_fields(data)
        if args.json:
            _out(for_terminal(" ".join(data.splitlines()), sys.stdout))
        else:
            _out(event_line(name, fields))
        if name in ("EventsGap", "EventsDropped"):
            say(
                f"fisk-sm ctl: events were lost ({sanitize(str(fields.get('reason') or name))});"
                " reload the runs and approvals: fisk-sm ctl ls; fisk-sm ctl approvals"
            )
            if waiting is not None:  # a run may have stopped unseen: ask again
                waiting &= _waiting(client, args)
        elif waiting is not None and _stopped(name, fields):
            waiting.discard(str(fields.get("run_id")))
        if waiting is not None and not waiting:
            return 0
    raise AssertionError("unreachable: the feed gives up with a CtlError")


def cmd_ctl(args: argparse.Namespace) -> int:
    """`fisk-sm ctl COMMAND`: one line on stderr and an exit code for any failure."""
    try:
        client = Client(args.url or default_url(), args.token or default_token())
        if args.ctl_command == "events":
            return _events(client, args)
        code = run_script_command(client, args, _run_path)  # wait, approve (--all)
        return _run_command(client, args) if code is None else code
    except CtlError as e:
        say(f"fisk-sm ctl: {e}")
        return e.code
    except BrokenPipeError:  # `ctl events --follow | head`: the reader has had enough
        # Python would report the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


HELP = """\
commands:
  submit PROMPT [--name N] [--config F] [--chat]
                                          start a run (a chat waits for follow-ups); prints its id
  say RUN TEXT                            post a follow-up to a chat waiting for input
  ls                                      the runs, newest first (state, progress, approval)
  show RUN                                one run: counters, path, pending approval, transcript
  suspend RUN | resume RUN | abort RUN    control a run
  approvals                               the approvals waiting for an answer
  approve RUN TOOL_USE_ID once|always|deny
                                          answer one
  approve --all [--tool T] [--run RUN] once|always|deny
                                          answer every pending approval that matches
  wait RUN... [--until done|parked] [--timeout S]
                                          wait until the runs are done (or parked)
  end RUN                                 end a chat as completed (at its next prompt)
  events [--follow] [--run RUN]           the event stream, one line per event, until
                                          the runs stop (or for ever, --follow)

exit codes: 0 ok, 1 the server said no (unknown run, wrong state), 2 bad input,
69 cannot connect to the supervisor, 77 the token was refused; `wait` also: 3 a run did not
get there (ended otherwise), 124 the timeout passed (see `ctl wait --help`).
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
        formatter_class=RawDescriptionHelpFormatter,  # sized without importing shutil
    )
    _global_options(ctl, None)
    # Every parser here uses the formatters of `helpformat`: argparse makes one to check each
    # argument it adds, and its own would import shutil.
    shared = argparse.ArgumentParser(add_help=False, formatter_class=HelpFormatter)
    _global_options(shared, argparse.SUPPRESS)
    sub = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(
            name,
            parents=[shared],
            help=help,
            description=description,
            formatter_class=HelpFormatter,
        )
        return parser

    submit = command("submit", "start a run", "Submit PROMPT as a new run; prints its run id.")
    submit.add_argument("prompt", metavar="PROMPT", help="the user's first message")
    submit.add_argument("--name", help="a name to show for the run")
    submit.add_argument("--config", metavar="F", help="the agent.yaml, on the supervisor's side")
    submit.add_argument(
        "--chat", action="store_true", help="a chat: after each answer it waits for `ctl say`"
    )
    say = command(
        "say",
        "post a follow-up to a chat",
        "Post TEXT as the next prompt of chat run RUN, which waits for input (awaiting_input).",
    )
    say.add_argument("run", metavar="RUN", help="the run id")
    say.add_argument("text", metavar="TEXT", help="the follow-up prompt")
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
    add_script_commands(command)  # approve (one, or --all), wait, end
    events = command(
        "events",
        "print the event stream",
        "Print the supervisor's events as they happen, one line each: `HH:MM:SS RUN EventType"
        " key=value...` (--json: the server's JSON object, one a line). With --follow it waits"
        " for more until interrupted; without, it stops once every run that was queued or"
        " running (or RUN, with --run) has stopped: parked for an approval, suspended or ended."
        " A dropped stream is opened again after the last event printed (a note on stderr;"
        " exit 69 after 8 failures in a row); if events were lost meanwhile it prints"
        " EventsGap and a note to reload (ctl ls, ctl approvals).",
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

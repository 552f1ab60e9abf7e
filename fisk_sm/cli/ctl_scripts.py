"""`fisk-sm ctl` for scripts: `wait` for runs, `approve --all` that match, and `end` a chat.

`ctl wait RUN...` subscribes to the supervisor's event stream before it reads each run's
status, so no change between the two is missed, then reads the stream (no polling) until
every run named reached what it waits for: `done` (it ended or was suspended) or `parked` (it
waits for an approval). A dropped stream is opened again with the id of the last event seen
(`Last-Event-ID`: the server replays what was missed, or says there is a gap); either way the
statuses of the runs still waited for are read again once subscribed, so a supervisor that
cannot replay loses nothing either. The stream is read by a thread, so that `--timeout` is
kept to the second whatever the server sends (or does not).

`ctl approve --all ANSWER` lists the pending approvals and answers each that matches `--tool`
and `--run`; one the server no longer has (answered meanwhile, 404/409) is said on stderr and
the others still answered.
"""

from __future__ import annotations

import argparse
import sys

from fisk_sm.cli.ctl_client import EXIT_UNAVAILABLE, Client, CtlError, parse_json, read_sse
from fisk_sm.cli.helpformat import RawDescriptionHelpFormatter
from fisk_sm.operator.sanitize import for_terminal, sanitize, say

# `ctl --help` imports this module: json, queue, threading, time and typing are imported where
# they are used.
#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import queue
    from collections.abc import Callable
    from typing import Any

    #: `ctl`'s checked `/api/runs/RUN/...` path builder (bad input: a CtlError, exit 2).
    RunPath = Callable[..., str]
    #: An event of the stream: its id (None without one), name and data.
    Event = tuple[str | None, str, str]

__all__ = [
    "ANSWERS",
    "DONE",
    "EXIT_NOT_REACHED",
    "EXIT_TIMEOUT",
    "add_script_commands",
    "approve_all",
    "run_script_command",
    "wait",
]

ANSWERS = ("once", "always", "deny")
#: The statuses of a run that ended or was suspended: what `ctl wait` (`--until done`) waits for.
DONE = frozenset(
    {"completed", "failed", "budget_exhausted", "iterations_exhausted", "aborted", "suspended"}
)
#: `ctl wait`: a run ended without reaching what was waited for (done: not completed).
EXIT_NOT_REACHED = 3
#: `ctl wait`: the timeout passed first (as timeout(1) says it).
EXIT_TIMEOUT = 124
#: The supervisor's events whose data is the run's `Run` JSON (with its `status`).
RUN_EVENTS = ("RunSubmitted", "RunParked", "RunUpdated")
#: Events after which what happened before is unknown: the statuses are read again.
RELOAD = ("EventsGap", "EventsDropped")
#: Pauses between attempts to open a dropped event stream again (then: no supervisor, 69).
RECONNECT = (0.1, 0.2, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0)

WAIT_HELP = """\
exit codes:
  0    every run reached it (--until done: every run completed)
  3    --until done: a run ended otherwise (failed, budget_exhausted, iterations_exhausted,
       aborted) or was suspended; --until parked: a run ended or was suspended unparked
  124  --timeout passed first (stderr names the runs still waited for)
  1    a run named is unknown (said before waiting for the others)
  2    bad usage; 69 no supervisor answered; 77 the token was refused
"""


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# -- ctl wait -------------------------------------------------------------------------------


class _Goal:
    """The runs still waited for, and what became of the others."""

    def __init__(self, runs: list[str], until: str, json: bool) -> None:
        self.pending = dict.fromkeys(runs)  # ordered: stderr names them as given
        self.until, self.json = until, json
        self.missed: list[str] = []  # reached an end that is not the goal

    def note(self, run_id: str, status: object) -> None:
        """Take `status` as the run's current one; print the run once it is there."""
        if run_id not in self.pending or not isinstance(status, str):
            return
        if self.until == "parked":
            reached, stopped = status == "parked", status in DONE
        else:
            reached, stopped = status == "completed", status in DONE
        if not (reached or stopped):
            return
        del self.pending[run_id]
        if not reached:
            self.missed.append(run_id)
        if self.json:
            import json

            _out(json.dumps({"run_id": run_id, "status": status}))
        else:
            _out(f"{sanitize(run_id)} {sanitize(status)}")


def _pump(response: Any, into: queue.SimpleQueue[Event | None]) -> None:
    """Move the stream's events to `into`, then None when it ends (closed, or broken off)."""
    try:
        for event in read_sse(response):
            into.put(event)
    except (OSError, ValueError):  # the connection broke off: the waiter reconnects
        pass
    finally:
        into.put(None)


def _subscribe(client: Client, last_id: str, again: bool, deadline: float | None) -> Any:
    """The event stream, after `last_id` if there is one (the server replays what came after
    it); opened `again` (a dropped stream), retried a while if the supervisor does not answer."""
    import time

    for pause in (*RECONNECT, None):
        try:
            return client.stream("/api/events", last_id or None)  # as `Last-Event-ID`
        except CtlError as e:
            if e.code != EXIT_UNAVAILABLE or pause is None or not again:
                raise
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)  # a restarting supervisor: give it a moment
    raise AssertionError("unreachable")  # pragma: no cover


def _status(client: Client, run_path: RunPath, run_id: str) -> Any:
    """The run's current status, from its `Run`."""
    run = parse_json(client.call("GET", run_path(run_id)))
    return run.get("status") if isinstance(run, dict) else None


def wait(client: Client, args: argparse.Namespace, run_path: RunPath) -> int:
    """`ctl wait RUN... [--until parked|done] [--timeout S]`: see `WAIT_HELP`."""
    import json
    import queue
    import threading
    import time

    runs = list(dict.fromkeys(args.runs))
    for run_id in runs:
        run_path(run_id)  # every RUN checked before anything is asked
    if args.timeout is not None and not args.timeout > 0:
        raise CtlError("--timeout: must be a number of seconds above 0", 2)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    goal = _Goal(runs, args.until, args.json)
    unknown = False
    last_id, first = "", True
    while True:
        response = _subscribe(client, last_id, not first, deadline)
        events: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        threading.Thread(target=_pump, args=(response, events), daemon=True).start()
        # Subscribed: a change from here on is in the stream, whatever these reads find.
        for run_id in list(goal.pending):
            try:
                goal.note(run_id, _status(client, run_path, run_id))
            except CtlError as e:
                if not first or e.code != 1:
                    raise
                say(f"fisk-sm ctl: {sanitize(run_id)}: {e}")  # 404: not a run of this supervisor
                del goal.pending[run_id]
                unknown = True
        first = False
        while goal.pending:
            remaining = None if deadline is None else deadline - time.monotonic()
            try:
                if remaining is not None and remaining <= 0:
                    raise queue.Empty
                item = events.get(timeout=remaining)
            except queue.Empty:
                still = ", ".join(sanitize(r) for r in goal.pending)
                say(f"fisk-sm ctl: timed out after {args.timeout:g}s; still waiting for {still}")
                return EXIT_TIMEOUT
            if item is None:
                break  # the stream dropped: subscribe again after the last event seen
            event_id, name, data = item
            last_id = event_id or last_id
            if name in RELOAD:
                for run_id in list(goal.pending):
                    goal.note(run_id, _status(client, run_path, run_id))
            elif name in RUN_EVENTS:
                try:
                    fields = json.loads(data)
                except ValueError:
                    continue
                if isinstance(fields, dict):
                    goal.note(str(fields.get("run_id")), fields.get("status"))
        else:
            # The stream is left open: closing it would wait for the reader thread's read
            # (until the next keep-alive), and the process ends now anyway.
            if unknown:
                return 1
            return EXIT_NOT_REACHED if goal.missed else 0


# -- ctl approve --all ----------------------------------------------------------------------


def approve_all(client: Client, args: argparse.Namespace, run_path: RunPath, answer: str) -> int:
    """Answer every pending approval that matches `--tool` and `--run` with `answer`."""
    tools, runs = set(args.only_tools or ()), set(args.only_runs or ())
    for run_id in runs:
        run_path(run_id)
    listing = parse_json(client.call("GET", "/api/approvals"))
    found = listing.get("approvals") if isinstance(listing, dict) else None
    matching = [
        a
        for a in found or []
        if isinstance(a, dict)
        and (not tools or a.get("tool") in tools)
        and (not runs or a.get("run_id") in runs)
    ]
    if not matching:
        raise CtlError("no pending approval matches", 1)
    answered, missed = 0, 0
    for approval in matching:
        run_id, tool_use_id = str(approval.get("run_id")), str(approval.get("tool_use_id"))
        tool = str(approval.get("tool"))
        try:
            path = run_path(run_id, "approvals", tool_use_id)
            client.call("POST", path, {"answer": answer})
        except CtlError as e:
            if e.code not in (1, 2):  # no supervisor, or no token: the others fail alike
                raise
            say(f"fisk-sm ctl: {sanitize(run_id)} {sanitize(tool_use_id)}: {e}")
            missed += 1
            continue
        answered += 1
        if args.json:
            import json

            shown = {"run_id": run_id, "tool_use_id": tool_use_id, "tool": tool, "answer": answer}
            _out(for_terminal(json.dumps(shown), sys.stdout))
        else:
            _out(" ".join(sanitize(s, 200) for s in (run_id, tool_use_id, tool, answer)))
    return 0 if answered and not missed else 1


def run_script_command(client: Client, args: argparse.Namespace, run_path: RunPath) -> int | None:
    """Run `wait` or `approve --all`; None for any other command (an `approve` of one
    approval has its words checked and named as `ctl` reads them: run, tool_use_id, answer)."""
    if args.ctl_command == "wait":
        return wait(client, args, run_path)
    if args.ctl_command != "approve":
        return None
    words = list(args.words)
    want = 1 if args.all else 3
    if len(words) != want:
        form = "--all ANSWER" if args.all else "RUN TOOL_USE_ID ANSWER (or --all ANSWER)"
        raise CtlError(f"approve: takes {form}, not {len(words)} word(s)", 2)
    if words[-1] not in ANSWERS:
        raise CtlError(f"ANSWER: must be once, always or deny, not {sanitize(words[-1], 40)!r}", 2)
    if args.all:
        return approve_all(client, args, run_path, words[-1])
    if args.only_tools or args.only_runs:
        raise CtlError("approve: --tool and --run go with --all", 2)
    args.run, args.tool_use_id, args.answer = words
    return None


# -- the parsers ------------------------------------------------------------------------------


def add_script_commands(command: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    """Add `approve` (one, or --all), `wait` and `end` with `ctl`'s `command` factory."""
    approve = command(
        "approve",
        "answer a pending approval (or all that match)",
        "Answer the approval of tool call TOOL_USE_ID of RUN: once (run it), always (run it and"
        " every later call of that tool in the run), deny (the model gets the denial result)."
        " With --all, answer every pending approval that matches --tool and --run, one line"
        " each (RUN TOOL_USE_ID TOOL ANSWER); exit 1 if none matched, or if one was answered"
        " meanwhile by someone else (said on stderr; the others are still answered).",
    )
    approve.usage = (
        "fisk-sm ctl approve RUN TOOL_USE_ID once|always|deny\n"
        "       fisk-sm ctl approve --all [--tool T] [--run RUN] once|always|deny"
    )
    approve.add_argument(
        "words", nargs="+", metavar="WORD", help="RUN TOOL_USE_ID ANSWER, or with --all: ANSWER"
    )
    approve.add_argument("--all", action="store_true", help="every pending approval that matches")
    approve.add_argument(
        "--tool", dest="only_tools", action="append", metavar="T", help="only calls of tool T"
    )
    approve.add_argument(
        "--run", dest="only_runs", action="append", metavar="RUN", help="only RUN's approvals"
    )
    waiter = command(
        "wait",
        "wait until runs are done (or parked)",
        # shown as it is (the exit codes' table): the lines are cut here
        "Wait until every RUN is done (ended or suspended) or, with --until parked, waits\n"
        "for an approval; print `RUN STATUS` as each gets there. It follows the event stream\n"
        "(no polling), and reconnects if the stream drops. A chat waiting for its next prompt\n"
        "is not done: end it with `ctl end RUN`.",
    )
    waiter.epilog = WAIT_HELP
    waiter.formatter_class = RawDescriptionHelpFormatter  # the table of exit codes as it is
    waiter.add_argument("runs", nargs="+", metavar="RUN", help="the run ids")
    waiter.add_argument(
        "--until", choices=("done", "parked"), default="done", help="done (default) or parked"
    )
    waiter.add_argument(
        "--timeout", type=float, metavar="S", help="give up after S seconds (exit 124)"
    )
    end = command(
        "end",
        "end a chat as completed",
        "End chat run RUN as completed: at its prompt now, or, mid-turn, at its next prompt"
        " (the turn finishes first). A run that is not a chat, or has ended, is refused.",
    )
    end.add_argument("run", metavar="RUN", help="the chat's run id")

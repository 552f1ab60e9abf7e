"""`fisk-sm tui`: the full-screen UI's command line (its parser, its modes, its openers).

Importing this module imports neither Textual nor the loop: `fisk-sm tui --help` and a missing
`fisk-sm[tui]` extra are answered without them (the extra's absence in one line, exit 2).

Modes: a run (`-c agent.yaml [PROMPT]`, `--checkpoint`, `--resume ID`), `--chat`, `--step`, and
Operate (`--url URL`, else $FISK_SM_URL or the URL `supervise` wrote, with `--token` or
$FISK_SM_TOKEN as `fisk-sm ctl` takes them).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fisk_sm.config.agent import AgentConfig
    from fisk_sm.loop.run import Run
    from fisk_sm.tui.app import LoopApp, Wiring

__all__ = ["EXIT_NO_EXTRA", "add_tui_parser", "cmd_tui"]

EXIT_NO_EXTRA = 2
KEYS = """keys:
  every mode   q quit (a journaled run is suspended first) · Ctrl-C suspend · Enter on a
               message unfolds it · dialogs: o once, a always, n deny (approvals), y/n
  --chat       type a prompt and Enter · /reset a new session · /exit
  --step       s step · n next boundary · c continue to a breakpoint · e explain ·
               space toggles the highlighted breakpoint · u suspend
  --url        / filter · s sort column, S reverse · a or Enter: the approval (o once,
               a always, n deny) · u suspend · r resume · x abort · R reload · q quit
"""


def add_tui_parser(sub: Any) -> None:
    """The `tui` command's parser."""
    tui = sub.add_parser(
        "tui",
        help="the full-screen UI: run, chat, step or operate in one terminal app",
        description="A full-screen terminal UI (needs fisk-sm[tui]): the machine with the"
        " current state lit, the transcript, the gauges and the event log, live. Without a"
        " mode flag it runs -c agent.yaml on PROMPT; --chat chats, --step steps (the debugger),"
        " --url operates a supervisor's runs.",
        epilog=KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tui.add_argument("-c", "--config", type=Path, help="the agent.yaml (every mode but --url)")
    mode = tui.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true", help="chat: follow-up prompts in a box")
    mode.add_argument("--step", action="store_true", help="step the run: the debugger's keys")
    mode.add_argument(
        "--url",
        help="operate the supervisor at URL (default: $FISK_SM_URL, else the URL supervise wrote)",
    )
    tui.add_argument("--token", help="with --url: the bearer token ($FISK_SM_TOKEN)")
    tui.add_argument("--operate", action="store_true", help="operate, at the default URL")
    tui.add_argument("--checkpoint", action="store_true", help="journal the run as a session")
    tui.add_argument("--name", metavar="ID", help="the session id (with --checkpoint)")
    tui.add_argument("--resume", metavar="ID", help="resume session ID (takes no prompt)")
    tui.add_argument(
        "--force", action="store_true", help="with --resume: continue though the config changed"
    )
    tui.add_argument("--state-dir", type=Path, help="the sessions directory")
    tui.add_argument("prompt", nargs="*", help="the prompt (a run, or a chat's first one)")


def _check(args: argparse.Namespace) -> None:
    from fisk_sm.cli.run import UsageError, check_flags

    operate = args.url is not None or args.operate
    if operate:
        for flag, value in (
            ("-c", args.config),
            ("--chat", args.chat),
            ("--step", args.step),
            ("--checkpoint", args.checkpoint),
            ("--resume", args.resume),
            ("a prompt", args.prompt),
        ):
            if value:
                raise UsageError(f"operating a supervisor takes no {flag}")
        return
    if args.token is not None:
        raise UsageError("--token needs --url (or --operate)")
    if args.config is None:
        raise UsageError("-c agent.yaml is needed (or --url to operate a supervisor)")
    args.replay, args.replay_tools, args.otel = None, None, False  # what `run` has and tui not
    check_flags(args)


def cmd_tui(args: argparse.Namespace) -> int:
    """`fisk-sm tui`."""
    _check(args)
    try:
        import textual  # noqa: F401 (the extra's presence)
    except ImportError:
        sys.stderr.write("fisk-sm: tui needs the tui extra: pip install 'fisk-sm[tui]'\n")
        return EXIT_NO_EXTRA
    import asyncio

    if args.url is not None or args.operate:
        from fisk_sm.tui.operate import operate

        return asyncio.run(operate(args.url, args.token))
    from fisk_sm.config.agent import load_config

    config = load_config(args.config)
    return asyncio.run(_local(args, config))


async def _local(args: argparse.Namespace, config: AgentConfig) -> int:
    """Build the local mode's app, run it, and say how the run ended."""
    from fisk_sm.cli.run import resume_hint
    from fisk_sm.operator.sanitize import for_terminal, say

    async with contextlib.AsyncExitStack() as stack:
        app = app_for(args, config, stack)
        code = await app.run_async()
    run = app.run_
    if run is not None and app.ended is not None:
        if app.ended == "completed" and not args.chat:
            sys.stdout.write(for_terminal(run.answer().rstrip("\n"), sys.stdout) + "\n")
        if app.journaled and app.ended == "suspended":
            hint = resume_hint(run, args)
            say(f"suspended; {hint.replace('fisk-sm run', 'fisk-sm tui', 1)}")
    return 130 if code is None else code  # no code: the app was killed (EXIT_ABORTED)


def app_for(
    args: argparse.Namespace, config: AgentConfig, stack: contextlib.AsyncExitStack
) -> LoopApp:
    """The app of the local mode `args` ask for, opening its runs within `stack`."""
    from fisk_sm.loop.run import loop_machine
    from fisk_sm.tui.app import RunApp

    table, budget = loop_machine().table, config.llm.budget
    journaled = bool(args.checkpoint or args.resume)
    prompt = " ".join(args.prompt).strip() or None
    if args.chat:
        from fisk_sm.tui.chat import ChatApp, chat_opener

        chat = chat_opener(args, config, stack)
        return ChatApp(chat, table, budget, prompt, journaled=journaled, resume=args.resume)

    async def opener(wiring: Wiring, _prompt: str | None) -> Run:
        from fisk_sm.cli.run import opened_run
        from fisk_sm.model.anthropic import AnthropicModel
        from fisk_sm.model.clients import warm_up

        await warm_up(config.llm)  # the SDK's import and client, off the loop
        model = AnthropicModel(config.llm, on_text=wiring.events.on_text)
        stack.push_async_callback(model.aclose)
        return await stack.enter_async_context(
            opened_run(args, config, wiring.events, wiring.prompter, model)
        )

    shown = None if args.resume else prompt or "assist the user"
    if args.step:
        from fisk_sm.tui.step import StepApp

        return StepApp(opener, table, budget, shown, journaled=journaled)
    return RunApp(opener, table, budget, shown, journaled=journaled)

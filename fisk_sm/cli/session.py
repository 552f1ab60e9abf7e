"""`fisk-sm session ...`: list, show, remove and fork the sessions of a store."""

from __future__ import annotations

import argparse
import json
import sys
import time

from fisk_sm.cli.lineui import transcript_lines
from fisk_sm.cli.run import store_for
from fisk_sm.config.agent import load_config
from fisk_sm.operator.sanitize import sanitize, say, strip_control

__all__ = ["cmd_session"]


def cmd_session(args: argparse.Namespace) -> int:
    """Dispatch `session ls|show|rm|fork`."""
    config = load_config(args.config) if args.config else None
    store = store_for(args.state_dir, config)
    out = sys.stdout
    if args.session_command == "ls":
        sessions = store.list()
        if args.json:
            rows = [
                {
                    "id": s.run_id,
                    "model": s.model,
                    "status": s.status,
                    "updated": s.updated,
                    "prompt": s.prompt,
                    "problem": s.problem,
                }
                for s in sessions
            ]
            out.write(json.dumps(rows, indent=2) + "\n")
            return 0
        out.write(f"{'ID':<32} {'MODEL':<24} {'STATUS':<20} {'UPDATED':<20} PROMPT\n")
        for s in sessions:
            updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.updated))
            if s.problem:  # a damaged session: say why in place of its prompt
                updated, prompt = "-", sanitize(s.problem, 200)
            else:
                prompt = sanitize(s.prompt, 50)
            cells = (sanitize(s.run_id, 200), sanitize(s.model, 24), s.status)
            out.write(f"{cells[0]:<32} {cells[1]:<24} {cells[2]:<20} {updated:<20} {prompt}\n")
        return 0
    if args.session_command == "show":
        snap = store.snapshot(args.id)
        u = snap.usage
        # Everything here was read from a journal: no control sequence reaches the terminal.
        out.write(
            strip_control(
                f"session:        {snap.run_id}\n"
                f"status:         {snap.status}{f' ({snap.outcome})' if snap.outcome else ''}\n"
                f"model:          {snap.fingerprint.get('model', '')}\n"
                f"created:        {snap.created}\n"
                f"iterations:     {snap.iteration}\n"
                f"resumes in:     {snap.state}\n"
                f"llm calls:      {snap.llm_calls}\n"
                f"tool calls:     {snap.tool_calls}\n"
                f"tokens:         in {u.input_tokens} out {u.output_tokens}"
                f" cache read {u.cache_read_tokens} cache create {u.cache_create_tokens}\n"
                f"records:        {snap.seq}\n"
                f"prompt:         {sanitize(snap.prompt, 2000)}\n"
            )
        )
        if args.transcript:
            out.write("transcript:\n")
            out.writelines(f"  {line}\n" for line in transcript_lines(snap.messages))
        return 0
    if args.session_command == "rm":
        store.delete(args.id)
        say(f"removed {args.id}")
        return 0
    store.fork(args.id, args.at, args.name)
    say(f"forked {args.id} at seq {args.at} as {args.name}")
    return 0

"""``harness show``: a session's transcript, from the daemon when it answers, else the
ledger."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harness import printable
from harness.commands.base import EXIT_OK, UsageError, from_daemon, reader, usage_on


def register(commands: Any) -> None:
    show = commands.add_parser("show", help="print a session's transcript")
    show.set_defaults(handler=_show)
    show.add_argument("session", help="the session id (ses_…)")
    show.add_argument("--json", action="store_true", help="print JSON")


def _show(args: argparse.Namespace) -> int:
    found = from_daemon(
        lambda client: usage_on(
            lambda: (
                client.session(args.session),
                client.messages(args.session),
                client.todos(args.session),
            ),
            404,
        )
    )
    if found is None:
        ledger = reader()
        stored = ledger.session(args.session)
        if stored is None:
            raise UsageError(f"no session {args.session}")
        found = (
            stored.model_dump(mode="json"),
            [m.model_dump(mode="json") for m in ledger.messages(stored.id)],
            [t.model_dump(mode="json") for t in ledger.todos(stored.id)],
        )
    session, transcript, todos = found
    if args.json:
        print(json.dumps({"session": session, "messages": transcript, "todos": todos}, indent=2))
        return EXIT_OK
    # Everything below came from the model, its tools or its files: shown, never obeyed.
    head = f"{session['id']}  {session['status']}  {session['model']}  {session['directory']}"
    print(printable(head, one_line=True))
    for entry in transcript:
        info = entry["info"]
        label = info["role"] if info["role"] == "user" else f"assistant (step {info.get('step')})"
        print(f"\n── {label}  {info['id']}")
        for part in entry["parts"]:
            _print_part(part)
        if info["role"] == "assistant" and info.get("error"):
            print(f"[error: {printable(str(info['error']))}]")
    if todos:
        from harness.commands.display import todo_lines

        print("\n── " + todo_lines(todos, indent="  "))
    return EXIT_OK


def _print_part(part: dict[str, Any]) -> None:
    if part["type"] == "text":
        print(printable(part["text"]))
    elif part["type"] == "tool":
        state = part["state"]
        detail = state.get("output") or state.get("error") or ""
        # json.dumps escapes every control character (ensure_ascii, its default).
        tool = printable(str(part["tool"]), one_line=True)
        print(f"[{tool} {state['status']}] {json.dumps(state.get('input', {}))}")
        if detail:
            print("  " + "\n  ".join(printable(line) for line in str(detail).splitlines()[:20]))
    elif part["type"] == "patch":
        changed = ", ".join(f"{f['path']} +{f['added']} -{f['removed']}" for f in part["files"])
        print(f"[patch] {printable(changed, one_line=True)}")
    elif part["type"] == "step-finish":
        tokens = sum(part.get("tokens", {}).values())
        reason = printable(str(part["reason"]), one_line=True)
        print(f"[finish: {reason}; {tokens} tokens; ${part.get('cost', 0.0):.4f}]")

"""``harness sessions``: list sessions, from the daemon when it answers, else the ledger."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from harness import printable
from harness.commands.base import EXIT_OK, from_daemon, reader


def register(commands: Any) -> None:
    sessions = commands.add_parser("sessions", help="list sessions")
    sessions.set_defaults(handler=_sessions)
    sessions.add_argument("--json", action="store_true", help="print JSON")


def _sessions(args: argparse.Namespace) -> int:
    sessions: list[dict[str, Any]] | None = from_daemon(lambda client: client.sessions())
    if sessions is None:
        sessions = [s.model_dump(mode="json") for s in reader().sessions()]
    if args.json:
        print(json.dumps(sessions, indent=2))
        return EXIT_OK
    print(f"{'ID':36} {'STATUS':6} {'MODEL':32} {'TOKENS':>8} {'COST':>8}  UPDATED  TITLE")
    for s in sessions:
        updated = time.strftime("%m-%d %H:%M", time.localtime(s["updated"]))
        tokens = sum(s.get("tokens", {}).values())
        line = (
            f"{s['id']:36} {s['status']:6} {s['model'][-32:]:32} {tokens:>8} "
            f"{s.get('cost', 0.0):>8.4f}  {updated}  {s.get('title', '')}"
        )
        print(printable(line, one_line=True))  # a title is the user's or the model's words
    return EXIT_OK

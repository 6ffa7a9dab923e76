"""``harness cancel``: cancel a session's running turn (needs the daemon)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.base import print_result, require_daemon


def register(commands: Any) -> None:
    cancel = commands.add_parser("cancel", help="cancel a session's running turn")
    cancel.set_defaults(handler=_cancel)
    cancel.add_argument("session", help="the session id (ses_…)")
    cancel.add_argument("--json", action="store_true", help="print JSON")


def _cancel(args: argparse.Namespace) -> int:
    cancelled = require_daemon().cancel(args.session)
    text = "cancelled the running turn" if cancelled else "nothing was running"
    return print_result(args.json, {"session_id": args.session, "cancelled": cancelled}, text)

"""``harness deny``: reject a pending permission ask (needs the daemon)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.base import print_result, require_daemon


def register(commands: Any) -> None:
    deny = commands.add_parser("deny", help="reject a pending permission ask")
    deny.set_defaults(handler=_deny)
    deny.add_argument("permission", help="the permission request id (per_…)")
    deny.add_argument("--message", help="feedback the model sees (the turn then continues)")
    deny.add_argument("--json", action="store_true", help="print JSON")


def _deny(args: argparse.Namespace) -> int:
    require_daemon().reply_permission(args.permission, "reject", args.message)
    return print_result(args.json, {"id": args.permission, "reply": "reject"}, "denied")

"""``harness approve``: allow a pending permission ask (needs the daemon)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.base import print_result, require_daemon


def register(commands: Any) -> None:
    approve = commands.add_parser("approve", help="allow a pending permission ask")
    approve.set_defaults(handler=_approve)
    approve.add_argument("permission", help="the permission request id (per_…)")
    approve.add_argument(
        "--always", action="store_true", help="also allow it from now on in this project"
    )
    approve.add_argument("--json", action="store_true", help="print JSON")


def _approve(args: argparse.Namespace) -> int:
    reply = "always" if args.always else "once"
    require_daemon().reply_permission(args.permission, reply)
    return print_result(args.json, {"id": args.permission, "reply": reply}, f"approved ({reply})")

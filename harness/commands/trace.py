"""``harness trace``: draw a session's tree (steps, tools, children) from the ledger."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harness.commands.base import EXIT_OK, UsageError, reader


def register(commands: Any) -> None:
    trace = commands.add_parser("trace", help="draw a session's tree: steps, tools, children")
    trace.set_defaults(handler=_trace)
    trace.add_argument("session", help="the session id (ses_…)")
    trace.add_argument("--json", action="store_true", help="print JSON")


def _trace(args: argparse.Namespace) -> int:
    """The session tree, read from the ledger (readers never wait for the daemon's writes)."""
    from harness import render_trace

    try:
        data = reader().trace(args.session)
    except LookupError as error:
        raise UsageError(str(error).strip("'\"")) from error
    print(json.dumps(data, indent=2) if args.json else render_trace(data))
    return EXIT_OK

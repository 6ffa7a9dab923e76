"""``harness diff``: what a session changed in its files, as a unified diff."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness import printable
from harness.commands.base import EXIT_OK, UsageError, from_daemon, reader, usage_on


def register(commands: Any) -> None:
    diff = commands.add_parser(
        "diff", help="show what a session changed in its files, as a unified diff"
    )
    diff.set_defaults(handler=_diff)
    diff.add_argument("session", help="the session id (ses_…)")
    diff.add_argument("--since", metavar="MESSAGE", help="only changes from this message on")
    diff.add_argument("--json", action="store_true", help="print JSON")


def _diff(args: argparse.Namespace) -> int:
    """The session's file changes: from the daemon when it answers, else the ledger."""
    answer = from_daemon(
        lambda client: usage_on(lambda: client.diff(args.session, args.since), 404, 422)
    )
    if answer is None:
        from harness import SnapshotError

        try:
            text, files = reader().diff(args.session, since_message=args.since)
        except SnapshotError as error:
            raise UsageError(str(error)) from error
        answer = {"session_id": args.session, "files": files, "diff": text}
    if args.json:
        print(json.dumps(answer, indent=2))
    elif answer["diff"]:
        # The files' contents are the model's: shown, never obeyed, on a terminal; piped
        # (``harness diff S > fix.patch``) the diff stays byte for byte what applies.
        shown = answer["diff"] if not sys.stdout.isatty() else printable(answer["diff"])
        sys.stdout.write(shown)
    else:
        print("no file changes", file=sys.stderr)
    return EXIT_OK

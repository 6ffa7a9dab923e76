"""``harness revert``: put a session's files back as they were before one of its
messages; through the daemon when it answers, else through an embedded harness."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from harness import printable
from harness.commands.base import EXIT_OK, UsageError, client, error_line

if TYPE_CHECKING:
    from harness import RevertResult


def register(commands: Any) -> None:
    revert = commands.add_parser(
        "revert", help="put the files back as they were before a message of a session"
    )
    revert.set_defaults(handler=_revert)
    revert.add_argument("session", help="the session id (ses_…)")
    revert.add_argument(
        "--to", required=True, metavar="MESSAGE", help="the message (msg_…) to go back before"
    )
    revert.add_argument("--json", action="store_true", help="print JSON")


def _revert(args: argparse.Namespace) -> int:
    from harness.client import ApiError

    daemon = client()
    if daemon is not None and daemon.alive():
        try:
            result = daemon.revert(args.session, args.to)
        except ApiError as error:
            if error.status in (404, 422):
                raise UsageError(error.message) from error
            return error_line(error.message)
    else:
        from harness import HarnessError, RevertConflict, SessionBusy, SnapshotError

        try:
            result = _revert_embedded(args.session, args.to).to_dict()
        except (RevertConflict, SessionBusy) as error:
            return error_line(str(error))
        except (SnapshotError, HarnessError) as error:
            raise UsageError(str(error)) from error
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    files = [f for f in result["files"] if f["action"] != "unchanged"]
    print(f"reverted {args.session} to before {args.to}: {len(files)} file(s) changed")
    for file in files:
        print(printable(f"  {file['action']:9} {file['shown']}", one_line=True))
    return EXIT_OK


def _revert_embedded(session_id: str, message_id: str) -> RevertResult:
    """The revert through the embedding API, on this process's harness."""
    import trio

    from harness import Config, open_harness

    config = Config.from_env()
    if not config.ledger_path.exists():
        raise UsageError(f"no ledger at {config.ledger_path} (set HARNESS_HOME?)")

    async def main() -> RevertResult:
        async with open_harness(config) as h:
            return await h.revert(session_id, message_id)

    return trio.run(main)

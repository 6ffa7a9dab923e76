"""What the commands share: exit codes, usage errors, the way to the daemon or the ledger."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from harness import Reader, Rule
    from harness.client import Client

# Exit codes (contract): 0 answered, 1 error, 2 usage, 3 stopped by a limit, 4 stopped by
# a denial, 130 cancelled.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_LIMIT, EXIT_DENIED, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130
EXIT_BY_REASON = {
    "answered": EXIT_OK,
    "error": EXIT_ERROR,
    "max_steps": EXIT_LIMIT,
    "doom_loop": EXIT_LIMIT,
    "budget": EXIT_LIMIT,
    "overflow": EXIT_LIMIT,
    "denied": EXIT_DENIED,
    "cancelled": EXIT_CANCELLED,
}

DURABILITY_HELP = (
    "normal (default): a commit survives a crash of the process; "
    "full: it also survives a power loss (an fsync per commit batch)"
)
LEDGER_HELP = (
    "a postgresql:// URL (no password: libpq reads PGPASSWORD or ~/.pgpass) shared by every "
    "daemon naming it (default $HARNESS_LEDGER, the config's ledger, else the SQLite file)"
)
SANDBOX_MODES = ("workspace-write", "read-only", "off")  # harness/tools/sandbox.py
SANDBOX_HELP = (
    "what commands run under: workspace-write (default: only the session directory and "
    "a private /tmp writable, no network), read-only, or off ($HARNESS_SANDBOX)"
)

T = TypeVar("T")


class UsageError(Exception):
    """Bad flags or arguments: exit 2 with the message."""


def add_rule_flags(parser: argparse.ArgumentParser) -> None:
    """``--yes``, ``--allow`` and ``--deny``: the same words on every command that runs turns."""
    parser.add_argument(
        "--yes", action="store_true", help="allow every permission that asks (never a deny)"
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PERMISSION[:PATTERN]",
        help="allow a permission, e.g. --allow 'bash:git *' (repeatable)",
    )
    parser.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="PERMISSION[:PATTERN]",
        help="deny a permission, e.g. --deny edit (repeatable)",
    )


def rule_flags(args: argparse.Namespace) -> list[Rule]:
    """The session rules ``--allow`` and ``--deny`` give; a bad one is a usage error.

    ``--yes`` is not a rule: it answers asks (Config.yes, TurnFollower), so no rule it could
    outrank, the plan agent's ``edit deny`` included, is ever lifted by it.
    """
    from harness import parse_rule_flag

    try:
        rules = [parse_rule_flag(text, "allow") for text in args.allow]
        rules += [parse_rule_flag(text, "deny") for text in args.deny]
    except ValueError as error:
        raise UsageError(str(error)) from error
    return rules


def leaves(error: BaseException) -> list[BaseException]:
    """The errors inside an exception group (Trio groups even a single one)."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def client() -> Client | None:
    """A client for the daemon's socket, or None when no usable socket path exists."""
    from harness import Config, SocketPathError
    from harness.client import Client

    try:
        return Client(Config.from_env().socket_path)
    except SocketPathError:
        return None


def from_daemon(call: Callable[[Client], T]) -> T | None:
    """``call(client)`` against the daemon, or None when no daemon answers."""
    from harness.client import DaemonUnavailable

    found = client()
    if found is None:
        return None
    try:
        return call(found)
    except DaemonUnavailable:
        return None


def require_daemon() -> Client:
    from harness.client import DaemonUnavailable

    found = client()
    if found is None or not found.alive():
        where = found.socket_path if found is not None else "$HARNESS_SOCKET"
        raise DaemonUnavailable(f"no daemon answers on {where} (start one with `harness serve`)")
    return found


def usage_on(call: Callable[[], T], *statuses: int) -> T:
    """``call()``, with the daemon's answer for bad input (``statuses``) a usage error."""
    from harness.client import ApiError

    try:
        return call()
    except ApiError as error:
        if error.status in statuses:
            raise UsageError(error.message) from error
        raise


def reader() -> Reader:
    """The ledger, read-only: for the read commands when no daemon answers. A file that
    cannot be read is a storage failure (exit 1), not a usage error."""
    from harness import NoLedgerError, open_reader

    try:
        return open_reader()
    except NoLedgerError as error:
        raise UsageError(str(error)) from error


def print_result(as_json: bool, body: dict[str, Any], text: str) -> int:
    print(json.dumps(body) if as_json else text)
    return EXIT_OK


def error_line(message: str) -> int:
    """A failure that is not a usage error (busy, a conflict): the same command may work
    later."""
    from harness import printable

    print(f"harness: {printable(message)}", file=sys.stderr)  # it may quote a reply
    return EXIT_ERROR


# --- the cyclic collector at start-up ------------------------------------------------------

_collector_paused = False


def pause_collector() -> None:
    """Keep the cyclic garbage collector off while a command imports and sets up.

    Start-up creates about 60,000 long-lived objects (Trio, pydantic's schemas, harness's
    models, the provider's SDK models) and almost no garbage (about 4,000 objects in
    cycles); on the way, the collector runs ~130 times and walks the growing heap again
    and again: about 50 ms of a ~450 ms start-up, in no way useful. Resumed by
    ``resume_collector``; a collector someone had turned off stays off.
    """
    import gc

    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True


def resume_collector() -> None:
    """The collector back on, with what start-up made frozen (idempotent).

    ``gc.freeze`` moves every object alive now into a generation the collector never
    walks: they live for the whole process anyway, and later full collections then walk
    only what the run itself made. The little start-up garbage it holds is kept for good.
    """
    import gc

    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()

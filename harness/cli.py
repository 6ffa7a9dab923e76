"""The command line (DESIGN §9, §13): ``chat``, ``serve``, ``run``, ``sessions``, ``show``,
``events``, ``cancel``, ``approve``, ``deny``, ``answer``, ``trace``, ``diff``, ``revert``,
``config``, ``mcp``, ``acp``.

This module holds what every command shares: the top-level parser, the dispatch to a
command's handler, and the exit code for whatever a handler raised. Each command is a
module of ``harness.commands`` that registers its own parser and handler.

Only the standard library is imported at module level, here and in the command modules:
``harness --help`` must answer in well under 100 ms, and each command imports what it
needs when it runs. The commands that talk to the daemon use ``harness.client`` (standard
library only), so ``harness sessions`` against a live daemon never loads Trio, httpx or
pydantic.

Exit codes (contract): 0 answered, 1 error, 2 usage, 3 stopped by a limit, 4 stopped by
a denial, 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from harness.commands import (
    acp,
    answer,
    approve,
    cancel,
    chat,
    config,
    deny,
    diff,
    events,
    ledger,
    mcp,
    revert,
    run,
    serve,
    sessions,
    show,
    trace,
)
from harness.commands.base import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    leaves,
)

__all__ = ["EXIT_CANCELLED", "EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "UsageError", "main"]

# In the order ``harness --help`` lists them.
COMMANDS = (
    chat, run, serve, config, sessions, show, trace, diff, revert, events, cancel, approve, deny,
    answer, mcp, acp, ledger,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="A coding-agent runtime: a model decides, tools act under a permission "
        "gate, and every fact lands in a SQLite ledger under $HARNESS_HOME.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def _lean_imports() -> None:
    """Libraries load without their extras for other programs (see harness.lean_imports)."""
    from harness import install_lean_imports

    install_lean_imports()


def _redact_output() -> None:
    """Whatever a command prints passes redaction when this process knows a secret."""
    from harness import RedactingStream, has_secrets

    if has_secrets():
        if not isinstance(sys.stdout, RedactingStream):
            sys.stdout = RedactingStream(sys.stdout)
        if not isinstance(sys.stderr, RedactingStream):
            sys.stderr = RedactingStream(sys.stderr)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    _lean_imports()  # first: what follows imports the libraries
    _redact_output()
    try:
        handler = getattr(args, "handler", None)
        if handler is None and args.command is None and chat.is_terminal():
            # Plain `harness` on a terminal is a chat, as other coding agents start;
            # in a pipe or a script it stays the usage text.
            handler = chat.handle
            args = parser.parse_args(["chat"])
        if handler is None:
            parser.print_help(sys.stderr)
            code = EXIT_USAGE
        else:
            code = handler(args)
    except BaseException as error:
        code = _exit_code_for(error)
    sys.exit(code)


def _exit_code_for(error: BaseException) -> int:
    """Turn an error into a clear message and an exit code: a user never sees a traceback."""
    found = leaves(error)
    first = found[0]
    if isinstance(first, SystemExit) and len(found) == 1:
        return int(first.code or 0) if not isinstance(first.code, str) else EXIT_ERROR
    if isinstance(first, UsageError):
        _say(first)
        return EXIT_USAGE
    from harness import ConfigError, ConfigFileError

    if isinstance(first, ConfigFileError):  # a file's fault, not the command line's
        _say(first)
        return EXIT_ERROR
    if isinstance(first, ConfigError):
        _say(first)
        return EXIT_USAGE
    from harness.client import ApiError, DaemonUnavailable

    if isinstance(first, ApiError):
        _say(first.message)
        return EXIT_USAGE if first.status in (400, 404, 422) else EXIT_ERROR
    if isinstance(first, DaemonUnavailable):
        _say(first)
        return EXIT_ERROR
    storage = _storage_failure(first)
    if storage is not None:
        _say(storage)
        return EXIT_ERROR
    if isinstance(first, KeyboardInterrupt):
        return EXIT_CANCELLED
    if isinstance(first, BrokenPipeError):
        # The reader went away (`| head`): not our failure to report.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return EXIT_ERROR
    import traceback

    from harness import default_home, open_private, private_dir, redact

    crash = default_home() / "logs" / "crash.log"
    try:
        private_dir(private_dir(default_home()) / "logs")
        with open_private(crash, "a", encoding="utf-8") as out:
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            out.write(redact("".join(traceback.format_exception(error))))
        where = f"details in {crash}"
    except OSError as unwritable:
        where = f"no details: {crash} cannot be written: {unwritable.strerror or unwritable}"
    _say(redact(f"internal error: {type(first).__name__}: {first} ({where})"))
    return EXIT_ERROR


def _say(message: object) -> None:
    """An error's words on stderr; they may quote a file or a reply: shown, never obeyed."""
    from harness import printable

    print(f"harness: {printable(str(message))}", file=sys.stderr)


def _storage_failure(error: BaseException) -> str | None:
    """One line for a failure of the disk or the ledger; None for anything else.

    A read-only or full ``HARNESS_HOME``, a corrupt or truncated ledger: the user's
    files, not a bug, so no traceback and no crash log (which could not be written).
    """
    import errno

    from harness import LedgerError

    if isinstance(error, LedgerError):
        return str(error)
    if "apsw" in sys.modules:
        import apsw

        if isinstance(error, apsw.Error):
            return f"the ledger cannot be read or written: {error}"
    if isinstance(error, OSError) and error.errno is not None:
        if error.errno == errno.ENOSPC:
            return f"disk full: {error.filename or 'a write'} failed ({error.strerror})"
        if error.filename is not None:
            return f"{error.filename}: {error.strerror or error}"
    return None

"""``harness ledger migrate``: bring the configured ledger's schema up to date.

A daemon migrates at start too; this lets an operator do it once, ahead of a fleet of
daemons on a shared PostgreSQL ledger (DESIGN §14), and see that the database answers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.commands.base import EXIT_ERROR, EXIT_OK, LEDGER_HELP


def register(commands: Any) -> None:
    ledger = commands.add_parser("ledger", help="manage the ledger: migrate its schema")
    actions = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    migrate = actions.add_parser("migrate", help="create or upgrade the ledger's schema")
    migrate.set_defaults(handler=_migrate)
    migrate.add_argument("--ledger", help=LEDGER_HELP)


def _migrate(args: argparse.Namespace) -> int:
    import sys

    from harness import LedgerError, config_from_files, open_ledger

    config = config_from_files(Path.cwd(), project=False, ledger=args.ledger)
    try:
        ledger = open_ledger(config)
    except LedgerError as error:
        print(f"harness: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        print(f"ledger {ledger.location}: schema up to date")
    finally:
        ledger.close()
    return EXIT_OK

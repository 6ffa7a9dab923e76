"""Which ledger a configuration names: SQLite under the home, or a PostgreSQL database.

``Config.ledger`` unset: the SQLite file ``$HARNESS_HOME/ledger.db`` (the default, and
nothing about it changes). A ``postgresql://`` URL: the database every daemon naming it
shares (DESIGN §14). psycopg is imported only in that case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.config import Config
    from harness.storage.port import LedgerPort


def is_postgres_url(ledger: str | None) -> bool:
    return bool(ledger) and str(ledger).startswith(("postgresql://", "postgres://"))


def open_ledger(config: Config, *, read_only: bool = False) -> LedgerPort:
    """The configured ledger, opened (and migrated unless ``read_only``)."""
    if is_postgres_url(config.ledger):
        try:
            from harness.storage.postgres import PostgresLedger
        except ImportError as error:  # psycopg is an optional extra
            from harness.storage.port import LedgerError

            raise LedgerError(
                f"a PostgreSQL ledger needs psycopg: pip install 'harness[postgres]' ({error})"
            ) from None
        return PostgresLedger(
            str(config.ledger), lease_seconds=config.lease_seconds, read_only=read_only
        )
    from harness.storage.ledger import Ledger

    return Ledger(config.ledger_path, durability=config.durability, read_only=read_only)

"""Read a ledger without starting anything: what ``sessions``, ``show``, ``trace`` and
``diff`` answer from when no daemon does.

The ledger is opened read-only: a reader never changes the file (no migration, no lock,
no writer), works on a read-only file or filesystem, and never waits for a running
harness's writes (SQLite's WAL lets readers through).
"""

from __future__ import annotations

from typing import Any

from harness.config import Config
from harness.messages.model import MessageWithParts, Session
from harness.messages.todo import Todo
from harness.storage.backend import open_ledger
from harness.storage.port import LedgerPort


class NoLedgerError(LookupError):
    """There is no ledger file to read (a home that never ran anything)."""

    def __str__(self) -> str:
        return str(self.args[0])


class Reader:
    """Read-only queries over one ledger. Open it with ``open_reader``."""

    def __init__(self, ledger: LedgerPort) -> None:
        self._ledger = ledger

    def sessions(self) -> list[Session]:
        return self._ledger.sessions()

    def session(self, session_id: str) -> Session | None:
        return self._ledger.session(session_id)

    def messages(self, session_id: str) -> list[MessageWithParts]:
        return self._ledger.messages(session_id)

    def todos(self, session_id: str) -> list[Todo]:
        return self._ledger.todos(session_id)

    def trace(self, session_id: str) -> dict[str, Any]:
        """The session's tree as ``trace --json`` prints it; LookupError when unknown."""
        from harness.trace import build_trace

        return build_trace(self._ledger, session_id)

    def diff(
        self, session_id: str, *, since_message: str | None = None
    ) -> tuple[str, list[dict[str, Any]]]:
        """The unified diff and changed files; ``snapshots.SnapshotError`` when unknown."""
        from harness.snapshots import diff_session

        return diff_session(self._ledger, session_id, since_message=since_message)

    def close(self) -> None:
        self._ledger.close()


def open_reader(config: Config | None = None) -> Reader:
    """A read-only reader of ``config``'s ledger (default: the environment's).

    Raises ``NoLedgerError`` when there is no ledger file, and ``LedgerError`` when the
    file cannot be read (a storage failure, not a usage error).
    """
    config = config or Config.from_env()
    if not config.ledger and not config.ledger_path.exists():
        raise NoLedgerError(f"no ledger at {config.ledger_path} (set HARNESS_HOME?)")
    return Reader(open_ledger(config, read_only=True))

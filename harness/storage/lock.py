"""One running harness per ledger: the process that runs sessions holds an exclusive lock.

Two harnesses running sessions from one ledger would each resume the other's turns as if
it had crashed, and run tools twice. So ``open_harness`` takes a ``flock`` on a file next
to the ledger for as long as it runs; the kernel releases it when the process dies, even by
``kill -9``, so a crash never leaves a stale lock. Readers (``harness sessions``, ``show``,
``trace``) do not take it.

The lock file says who holds it (``{"kind", "pid", "socket"}``): a refused process can
then tell its user whether a daemon or another embedded ``run`` is in the way, and what to
do about each.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.private import private_dir
from harness.storage.ledger import LedgerError


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who runs sessions from a ledger: ``daemon`` (with its socket) or ``embedded``."""

    kind: str = "embedded"
    pid: int = 0
    socket: str | None = None

    def describe(self) -> str:
        if self.kind == "daemon":
            where = f", socket {self.socket}" if self.socket else ""
            return f"the harness daemon (pid {self.pid}{where})"
        if self.kind == "embedded":
            return f"an embedded harness, e.g. another `harness run` (pid {self.pid})"
        return f"another process (pid {self.pid})" if self.pid else "another process"

    @classmethod
    def parse(cls, text: str) -> LockHolder:
        """What a lock file holds; a bare pid is what versions before this one wrote."""
        text = text.strip()
        if text.isascii() and text.isdigit():
            return cls("embedded", int(text))
        try:
            data = json.loads(text)
            return cls(str(data["kind"]), int(data["pid"]), data.get("socket"))
        except (ValueError, KeyError, TypeError):
            return cls("unknown")


class LedgerInUseError(LedgerError):
    """Another live process is running sessions from this ledger; ``holder`` says who."""

    def __init__(self, ledger_path: Path, holder: LockHolder) -> None:
        self.ledger_path = ledger_path
        self.holder = holder
        if holder.kind == "daemon":
            advice = (
                "`harness run` talks to a daemon by itself; with --embedded, --budget-*, "
                "--record, --durability or --show-request it cannot: drop those, stop the "
                f"daemon (kill {holder.pid}), or use another HARNESS_HOME"
            )
        else:
            advice = "wait for it to finish, or use another HARNESS_HOME"
        super().__init__(
            f"the ledger at {ledger_path} is in use by a running harness: "
            f"{holder.describe()}; {advice}"
        )


@contextlib.contextmanager
def hold_ledger(ledger_path: Path, holder: LockHolder | None = None) -> Iterator[None]:
    path = ledger_path.with_name(ledger_path.name + ".lock")
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 4096, 0).decode(errors="replace")
            raise LedgerInUseError(ledger_path, LockHolder.parse(text)) from None
        me = holder or LockHolder()
        record = {"kind": me.kind, "pid": os.getpid(), "socket": me.socket}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

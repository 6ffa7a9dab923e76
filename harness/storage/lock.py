"""One running harness per ledger: the process that runs sessions holds an exclusive lock.

Two harnesses running sessions from one ledger would each resume the other's turns as if
it had crashed, and run tools twice. So ``open_harness`` takes a ``flock`` on a file next
to the ledger for as long as it runs; the kernel releases it when the process dies, even by
``kill -9``, so a crash never leaves a stale lock. Readers (``harness sessions``, ``show``,
``trace``) do not take it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from harness.private import private_dir
from harness.storage.ledger import LedgerError


class LedgerInUseError(LedgerError):
    """Another live process is running sessions from this ledger."""


@contextlib.contextmanager
def hold_ledger(ledger_path: Path) -> Iterator[None]:
    path = ledger_path.with_name(ledger_path.name + ".lock")
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise LedgerInUseError(
                f"the ledger at {ledger_path} is in use by a running harness (pid {holder}); "
                "talk to it through the daemon (harness run without --embedded), or use "
                "another HARNESS_HOME"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

"""Files only their owner may read: everything harness keeps holds tool outputs.

``HARNESS_HOME`` and every directory harness makes in it are 0700; the ledger (and its
``-wal``/``-shm``), logs, crash files, tool-output files and cassettes are 0600. The
modes are given when a file is created (``os.open`` with a mode, never the umask's
0644), and an existing file or directory that is looser is tightened when harness opens
it. The process umask is left alone: files the tools write in the workspace keep the
user's usual modes.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` when group or others have any access to it.

    Only what the user owns, and never a shared sticky directory: ``HARNESS_HOME=/tmp``
    run as root must not lock everyone out of /tmp.
    """
    with contextlib.suppress(OSError):
        info = os.stat(path)
        if info.st_uid != os.getuid() or info.st_mode & stat.S_ISVTX:
            return
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(path, mode)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (parents, if made, get defaults)."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty at 0600 when it does not exist; tighten it when it does."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    tighten(path, FILE_MODE)
    return path


def prepare_home(home: Path) -> None:
    """``HARNESS_HOME`` and the directories harness keeps in it, owner-only."""
    private_dir(home)
    for name in ("logs", "tool-output"):
        if (home / name).is_dir():
            tighten(home / name, DIR_MODE)


_FLAGS = {
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
}


def open_private(path: Path, mode: str, **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` ("a", "ab", "w", "wb") creating the file 0600."""
    fd = os.open(path, _FLAGS[mode[0]], FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # an existing file made by someone looser
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise

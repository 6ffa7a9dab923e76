"""Where a project's own files are looked for: the session directory up to its repository.

The configuration file, agent files and skills (DESIGN §11, §12) all follow this one rule,
so it lives apart from any of them: a module that reads skills need not import the
configuration's models, nor they the tools that read skills.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def project_chain(directory: Path) -> list[Path]:
    """The folders a project file may sit in, nearest first: ``directory`` up to the
    repository root (the first holding ``.git``); outside a repository, ``directory``."""
    try:
        start = directory.expanduser().resolve()
        chain = [start, *start.parents]
        root = next((d for d in chain if (d / ".git").exists()), None)
    except (OSError, ValueError):
        # An unusable directory (too long a name, a NUL byte): the session's creation
        # says so in its own words; there is no file to read in it.
        return []
    return [start] if root is None else chain[: chain.index(root) + 1]


# --- a turn's look at the project's folders ----------------------------------------------
#
# Each turn looks for AGENTS.md, ``.git`` and three skills folders in every folder from
# the session directory up (and for the global ones): ~35 system calls and a worker
# thread, almost always to find nothing. A folder's entries change only with its ctime
# (every create, delete or rename in it sets it; so do chmod and utime), so a name seen
# missing stays missing while the folder's stat is the same. A name that exists is
# always looked at again: what it points to (a symlink, a file's text) can change
# without the folder's stat moving. Plain strings, not pathlib, here: pathlib cost more
# than the system calls saved.

# A folder changed less than this long before it was looked at is not trusted: timestamps
# come from a coarse clock (a kernel tick; whole seconds on some filesystems), so a second
# change within the same tick could leave the stat as it was (git's "racy" index rule).
RACY_NS = 2_000_000_000
_KEEP = 4096  # folders remembered; past this, all are forgotten and looked at again
_missing: dict[str, tuple[tuple[int, int, int, int], set[str]]] = {}


class FolderLook:
    """One look at project folders (a turn's start): each folder's stat taken once.

    ``missing(folder, names)`` is True only when ``folder`` surely has no entry by any
    of those names; False means "look for yourself", as without it."""

    __slots__ = ("_stats",)

    def __init__(self) -> None:
        self._stats: dict[str, os.stat_result | None] = {}

    def _stat(self, folder: str) -> os.stat_result | None:
        try:
            return self._stats[folder]
        except KeyError:
            pass
        try:
            info: os.stat_result | None = os.stat(folder)
        except (OSError, ValueError):
            info = None
        self._stats[folder] = info
        return info

    def missing(self, folder: str, names: tuple[str, ...]) -> bool:
        info = self._stat(folder)
        if info is None:
            return False  # no folder, or none we may read: the caller's own look answers
        signature = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
        known = _missing.get(folder)
        if known is not None and known[0] != signature:
            known = None
        unknown = names if known is None else [n for n in names if n not in known[1]]
        for name in unknown:
            try:
                os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                return False
            return False  # an entry by that name: the caller looks at it
        if unknown and time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_NS:
            if known is None:
                if len(_missing) >= _KEEP:
                    _missing.clear()
                known = _missing[folder] = (signature, set())
            known[1].update(unknown)
        return True

    def holds(self, folder: str, name: str) -> bool:
        """Whether ``folder/name`` exists (following links, as ``Path.exists``)."""
        return not self.missing(folder, (name,)) and os.path.exists(os.path.join(folder, name))

    def chain(self, directory: str) -> list[str]:
        """``project_chain`` in strings, through this look."""
        try:
            start = os.path.realpath(os.path.expanduser(directory))
        except (OSError, ValueError):
            return []
        folders = [start]
        folder = start
        while not self.holds(folder, ".git"):
            parent = os.path.dirname(folder)
            if parent == folder:
                return [start]  # no repository: the directory's own
            folder = parent
            folders.append(folder)
        return folders

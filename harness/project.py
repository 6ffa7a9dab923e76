"""Where a project's own files are looked for: the session directory up to its repository.

The configuration file, agent files and skills (DESIGN §11, §12) all follow this one rule,
so it lives apart from any of them: a module that reads skills need not import the
configuration's models, nor they the tools that read skills.
"""

from __future__ import annotations

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

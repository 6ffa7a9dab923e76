"""The system prompt, assembled in a fixed, documented order from named sources.

1. ``agent``        the agent's own prompt (build, plan, general)
2. ``environment``  working directory, platform, date, and git state in short
3. ``AGENTS.md``    the project's instructions (the session directory, then its parents up
                    to the repository root: the nearest file wins)
4. ``global``       the user's own ``$HARNESS_HOME/AGENTS.md``

Each block keeps its source, so ``--show-request`` can say where every line came from.
It is built once per turn: a ``git status`` per step would cost more than the step.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from harness.gitsafe import git_output
from harness.project import FolderLook

MAX_INSTRUCTIONS_BYTES = 64 * 1024
MAX_STATUS_LINES = 20


@dataclass(frozen=True, slots=True)
class SystemBlock:
    source: str  # "agent", "environment", "AGENTS.md: /path", "global: /path", ...
    text: str


async def _git(directory: Path, *args: str) -> str | None:
    # Through gitsafe: the repository's config must not choose programs for us to run.
    return await git_output(directory, *args)


# Many sessions in one directory start turns together (a daemon resuming after a restart,
# a fan-out of subtasks): they share one git look-up made within this many seconds.
ENVIRONMENT_TTL = 2.0
ENVIRONMENT_KEEP = 64  # past this many directories, the stale ones are dropped
_environment: dict[Path, tuple[float, SystemBlock]] = {}
_environment_locks: dict[Path, trio.Lock] = {}


async def environment_block(directory: Path) -> SystemBlock:
    lock = _environment_locks.setdefault(directory, trio.Lock())
    async with lock:
        cached = _environment.get(directory)
        if cached is not None and time.monotonic() - cached[0] < ENVIRONMENT_TTL:
            return cached[1]
        block = await _environment_block(directory)
        _environment[directory] = (time.monotonic(), block)
        if len(_environment) > ENVIRONMENT_KEEP:
            _forget_stale_environments()
        return block


def prefetch_environment(directory: Path) -> None:
    """Start the environment block of a session about to begin in ``directory``.

    Its ``git`` processes (one outside a repository, three in one: ~5-30 ms of waiting)
    then run while the harness opens and the session is made, and the turn's own
    ``environment_block`` finds the block made (or waits for it) instead of starting
    them then: ``harness run`` calls this for a new session. Runs in Trio's system
    nursery; whatever goes wrong here is left for the turn's own call to meet.
    """
    path = directory.expanduser().resolve()

    async def fetch() -> None:
        with contextlib.suppress(Exception):
            await environment_block(path)

    trio.lowlevel.spawn_system_task(fetch, name="harness.prefetch_environment")


def _forget_stale_environments() -> None:
    """Bound the caches to the directories in use: a daemon sees any number of them."""
    now = time.monotonic()
    for directory, (made, _) in list(_environment.items()):
        if now - made >= ENVIRONMENT_TTL:
            del _environment[directory]
            lock = _environment_locks.get(directory)
            if lock is not None and not lock.locked():
                del _environment_locks[directory]


async def _environment_block(directory: Path) -> SystemBlock:
    lines = [
        f"Working directory: {directory}",
        f"Platform: {platform.system().lower()}",
        f"Today's date: {time.strftime('%Y-%m-%d')}",
    ]
    root = await _git(directory, "rev-parse", "--show-toplevel")
    if root is None:
        lines.append("Git repository: no")
    else:
        lines.append(f"Git repository: yes (root {root.strip()})")
        status = await _git(directory, "status", "--short", "--branch")
        if status is not None:
            rows = status.splitlines()
            shown = rows[:MAX_STATUS_LINES]
            if len(rows) > len(shown):
                shown.append(f"... and {len(rows) - len(shown)} more changed files")
            lines.append("Git status:\n" + ("\n".join(shown) if shown else "(clean)"))
    return SystemBlock("environment", "<environment>\n" + "\n".join(lines) + "\n</environment>")


def _instructions(path: Path, source: str) -> SystemBlock | None:
    try:
        raw = path.read_bytes()[:MAX_INSTRUCTIONS_BYTES]
    except OSError:
        return None
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None
    return SystemBlock(
        f"{source}: {path}", f'<instructions source="{path}">\n{text}\n</instructions>'
    )


def project_instructions(directory: Path, look: FolderLook | None = None) -> SystemBlock | None:
    """The nearest AGENTS.md from the session directory up to the repository root
    (``look``: a turn's look at the folders, which knows where none is)."""
    look = look or FolderLook()
    folder = os.path.abspath(directory)
    while True:
        if not look.missing(folder, ("AGENTS.md",)):
            block = _instructions(Path(folder, "AGENTS.md"), "AGENTS.md")
            if block is not None:
                return block
        parent = os.path.dirname(folder)
        if parent == folder or look.holds(folder, ".git"):
            return None
        folder = parent


def global_instructions(home: Path, look: FolderLook | None = None) -> SystemBlock | None:
    """The user's own ``$HARNESS_HOME/AGENTS.md``."""
    if look is not None and look.missing(os.fspath(home), ("AGENTS.md",)):
        return None
    return _instructions(home / "AGENTS.md", "global")


async def assemble_system(
    agent_prompt: str, directory: Path, home: Path, look: FolderLook | None = None
) -> list[SystemBlock]:
    look = look or FolderLook()
    blocks = [SystemBlock("agent", agent_prompt), await environment_block(directory)]
    for block in (project_instructions(directory, look), global_instructions(home, look)):
        if block is not None:
            blocks.append(block)
    return blocks

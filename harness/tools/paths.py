"""Resolve model-given paths against the session directory (DESIGN §7).

Every path is resolved through symlinks before it is judged, so a link inside the session
directory that points elsewhere counts as outside, just like ``..``.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.messages.names import on_disk
from harness.tools.base import PermissionNeed, ToolContext


def _root(ctx: ToolContext) -> str:
    """The session directory's real path: the executor's, resolved once for the turn.

    Without one (a tool run on its own), ``ctx.directory`` is resolved here: it is meant to
    be resolved already, and resolving again keeps the inside/outside test honest if a
    caller passed a symlinked directory. A root resolved at the turn's start stays the
    boundary if the directory is swapped for a link later in the turn: each target is
    resolved itself on every call, so a path through the swapped link lands outside it.
    """
    return ctx.root if ctx.root is not None else os.path.realpath(ctx.directory)


def resolve_path(raw: str, ctx: ToolContext) -> Path:
    """The real, absolute path ``raw`` names, relative paths taken from the session dir.

    A name the model saw with a non-UTF-8 byte shown as ``\\xff`` names that byte, unless
    a file is literally called so (harness/messages/names.py).
    """
    path = _resolve(raw, ctx)
    if "\\x" in raw and not os.path.lexists(path):
        return _resolve(on_disk(raw), ctx)
    return path


def _resolve(raw: str, ctx: ToolContext) -> Path:
    # In strings, and one Path at the end: every call resolves its target, and pathlib's
    # parsing of the intermediate paths cost more than realpath's own work.
    # os.path.join keeps an absolute ``raw`` as it is, as ``/`` did.
    expanded = os.path.join(ctx.directory, os.path.expanduser(raw.strip()))
    return Path(real_path(expanded))


# Opening a path for its name only (no read, no device opened, no permission on the file
# needed) lets the kernel resolve it: Linux's ``O_PATH``.
_O_PATH = getattr(os, "O_PATH", 0)


def real_path(path: str) -> str:
    """``os.path.realpath(path)``, resolved by the kernel when it can.

    Python's realpath walks the path a component at a time (an ``lstat`` each, ~90
    Python calls for a file five directories deep); a step resolves its ``read``'s path
    twice (the permission check, the read), ~25 µs each. The kernel resolves a path that
    exists in one ``open`` and names the result in ``/proc/self/fd``: ~8 µs. Anything
    else (a missing file, a loop, a denied directory, no ``/proc``, a name that is not a
    path) is Python's realpath, whose answer for a path that exists is the same.
    """
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        except OSError:
            return os.path.realpath(path)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = ""
        finally:
            os.close(fd)
        # Not a path ("pipe:[12]" through /proc/self/fd/0), or one since unlinked.
        if real.startswith("/") and not real.endswith(" (deleted)"):
            return real
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    """``Path(path).is_relative_to(root)`` for two real paths, without building Paths."""
    if path == root:
        return True
    return path.startswith(root if root.endswith("/") else root + "/")


def is_inside(path: Path, ctx: ToolContext) -> bool:
    return _inside(str(path), _root(ctx))


def external_need(path: Path, ctx: ToolContext) -> PermissionNeed | None:
    """The ``external_directory`` need for a resolved path outside the session dir, if any."""
    if is_inside(path, ctx):
        return None
    directory = path if path.is_dir() else path.parent
    glob = f"{directory}/*" if str(directory) != "/" else "/*"
    return PermissionNeed(
        permission="external_directory",
        pattern=glob,
        always=glob,
        metadata={"path": str(path)},
    )


def path_needs(
    permission: str,
    path: Path,
    ctx: ToolContext,
    *,
    pattern: str | None = None,
    always: str | None = None,
) -> list[PermissionNeed]:
    """What a call on ``path`` needs: ``external_directory`` first when it is outside the
    session directory, then ``permission`` on the path (or on ``pattern``, when the rules
    are about something else, like a regex)."""
    needs = [need] if (need := external_need(path, ctx)) else []
    subject = pattern if pattern is not None else str(path)
    needs.append(PermissionNeed(permission, subject, always if always is not None else subject))
    return needs


def may_read(path: Path, ctx: ToolContext, *, resolved: bool = False) -> bool:
    """Whether the rules let a search open ``path`` as ``read`` would, asking nobody.

    The path is resolved first (a link to ``/etc/passwd`` is judged as ``/etc/passwd``),
    then it must pass exactly the needs the read tool would have: ``external_directory``
    when outside the session directory, and ``read`` on the file. Only "allow" counts:
    a search cannot stop to ask about each file, so what would ask is skipped.
    ``resolved``: the caller knows no component of ``path`` is a link (a walk from a
    resolved root that follows no link), so only the last one needs a look.
    """
    real = path if resolved and not path.is_symlink() else Path(os.path.realpath(path))
    return all(ctx.allows(need.permission, need.pattern) for need in path_needs("read", real, ctx))


class ReadCheck:
    """``may_read`` for the many files of one search, with the same answers.

    ``may_read`` resolves the session directory on every call, most of its 24 µs a
    file; a search over 100,000 files resolves it once here (7 µs a file, the rules'
    own matching most of it). A file the walk reached
    without following a link, inside the session directory, needs only ``read`` on its
    path; anything else (a link, a file outside) takes ``may_read`` itself.
    """

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        root = _root(ctx)
        self._inside = root if root.endswith("/") else root + "/"

    def allows(self, path: str, *, link: bool) -> bool:
        """``path``: absolute, as a walk from a resolved root built it; ``link``: a symlink."""
        if not link and path.startswith(self._inside):
            return self._ctx.allows("read", path)
        return may_read(Path(path), self._ctx, resolved=not link)


def skipped_note(count: int) -> str:
    """The line a search adds when the read rules kept it out of some files."""
    files = "file" if count == 1 else "files"
    return f"({count} {files} skipped: not allowed by the read rules)"


GIT_INTERNAL = "git_internal"


def _looks_like_git_dir(directory: Path) -> bool:
    # What git itself checks before taking a directory for a repository (setup.c):
    # HEAD, objects/ and refs/. Catches bare repositories and separate git dirs.
    return (
        (directory / "HEAD").is_file()
        and (directory / "objects").is_dir()
        and (directory / "refs").is_dir()
    )


def inside_git_dir(path: Path) -> bool:
    """Whether a resolved path is in a repository's own files (config, hooks, index).

    Any component named ``.git`` (also the ``.git`` file of a worktree, and ``.GIT`` on a
    case-insensitive disk), or any ancestor that git would take for a git directory.
    """
    if any(part.lower() == ".git" for part in path.parts):
        return True
    return any(_looks_like_git_dir(parent) for parent in path.parents)


def write_needs(path: Path, ctx: ToolContext) -> list[PermissionNeed]:
    """What writing ``path`` needs: ``path_needs("edit", ...)``, then ``git_internal`` when
    the path is inside a git directory.

    Writing a repository's config or hooks is running commands: git runs what
    ``core.fsmonitor``, a hook or a filter driver names. So it is a permission of its
    own (ask by default): ``--allow edit`` does not allow it.
    """
    needs = path_needs("edit", path, ctx)
    if inside_git_dir(path):
        needs.append(PermissionNeed(GIT_INTERNAL, str(path), str(path)))
    return needs


def display_path(path: Path, ctx: ToolContext) -> str:
    """Relative to the session dir when inside it (``.`` for the dir itself), else absolute."""
    root = _root(ctx)
    text = str(path)
    if text == root:
        return "."
    if _inside(text, root):
        return text[len(root) :].lstrip("/")
    return text

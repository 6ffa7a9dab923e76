"""Resolve model-given paths against the session directory (DESIGN §7).

Every path is resolved through symlinks before it is judged, so a link inside the session
directory that points elsewhere counts as outside, just like ``..``.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.messages.names import on_disk
from harness.tools.base import PermissionNeed, ToolContext


def _root(ctx: ToolContext) -> Path:
    # ctx.directory is meant to be resolved already; resolving again is cheap and keeps the
    # inside/outside test honest if a caller passed a symlinked directory.
    return Path(os.path.realpath(ctx.directory))


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
    expanded = Path(os.path.expanduser(raw.strip()))
    if not expanded.is_absolute():
        expanded = ctx.directory / expanded
    return Path(os.path.realpath(expanded))


def is_inside(path: Path, ctx: ToolContext) -> bool:
    return path.is_relative_to(_root(ctx))


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


def display_path(path: Path, ctx: ToolContext) -> str:
    """Relative to the session dir when inside it (``.`` for the dir itself), else absolute."""
    root = _root(ctx)
    if path.is_relative_to(root):
        return str(path.relative_to(root)) or "."
    return str(path)

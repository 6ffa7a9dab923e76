"""The ``list`` tool: an indented tree of a directory."""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from pydantic import Field

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.glob import compile_glob
from harness.tools.paths import display_path, path_needs, resolve_path

MAX_ENTRIES = 100
DEFAULT_IGNORES = (
    ".git",
    "node_modules",
    "__pycache__",
    ".venv",
    "dist",
    "build",
    ".mypy_cache",
    ".pytest_cache",
)


class ListParams(ToolParams):
    path: str | None = Field(
        default=None,
        description="Directory to list; defaults to the working directory.",
    )
    ignore: list[str] | None = Field(
        default=None,
        description="Extra glob patterns to leave out, e.g. ['*.log', 'tmp'].",
    )


def _build_tree(root: Path, ignore: list[str], limit: int) -> tuple[list[str], int, bool]:
    """Lines of the tree, how many entries it shows, and whether entries were left out.

    Entries are gathered breadth first, so when the cap is hit the model still sees the
    whole top of the tree rather than the inside of the first deep directory.
    """
    matchers = [compile_glob(pattern) for pattern in ignore]
    children: dict[str, list[tuple[str, bool]]] = {}
    queue: deque[tuple[Path, str]] = deque([(root, "")])
    count = 0
    cut = False
    while queue:
        directory, rel = queue.popleft()
        try:
            with os.scandir(directory) as it:
                scanned = list(it)
        except OSError:
            continue
        entries: list[tuple[str, bool, bool]] = []
        for entry in scanned:
            entry_rel = f"{rel}/{entry.name}" if rel else entry.name
            if any(match(entry_rel) for match in matchers):
                continue
            try:
                is_dir = entry.is_dir()
                # A symlinked directory is shown but not entered, so cycles cannot recurse.
                descend = is_dir and not entry.is_symlink()
            except OSError:
                is_dir = descend = False
            entries.append((entry.name, is_dir, descend))
        entries.sort(key=lambda e: (not e[1], e[0]))
        kept: list[tuple[str, bool]] = []
        for name, is_dir, descend in entries:
            if count >= limit:
                cut = True
                break
            count += 1
            kept.append((name, is_dir))
            if descend:
                queue.append((directory / name, f"{rel}/{name}" if rel else name))
        children[rel] = kept
        if cut:
            break

    lines: list[str] = []

    def render(rel: str, depth: int) -> None:
        for name, is_dir in children.get(rel, []):
            lines.append("  " * depth + (name + "/" if is_dir else name))
            if is_dir:
                render(f"{rel}/{name}" if rel else name, depth + 1)

    render("", 1)
    return lines, count, cut


class ListTool(Tool[ListParams]):
    name = "list"
    description = (
        "Show the files and directories under a directory as an indented tree, directories "
        "first and marked with a trailing '/'.\n"
        f"- Shows at most {MAX_ENTRIES} entries, the top levels first.\n"
        "- Skips " + ", ".join(DEFAULT_IGNORES) + "; add more with ignore "
        "(glob patterns on names, e.g. '*.log').\n"
        "- Use glob or grep to find specific files."
    )
    params = ListParams
    read_only = True

    def permissions(self, args: ListParams, ctx: ToolContext) -> list[PermissionNeed]:
        return path_needs("list", resolve_path(args.path or ".", ctx), ctx)

    def title(self, args: ListParams) -> str:
        return f"list {args.path or '.'}"

    async def execute(self, args: ListParams, ctx: ToolContext) -> ToolOutput:
        root = resolve_path(args.path or ".", ctx)
        shown = display_path(root, ctx)
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a directory"
            raise ToolFailure(f"Cannot list {shown}: it {what}.")
        ignore = [*DEFAULT_IGNORES, *(args.ignore or [])]
        lines, count, cut = _build_tree(root, ignore, MAX_ENTRIES)
        out = [f"{root}/", *lines]
        if not lines:
            out.append("  (empty)")
        if cut:
            out += [
                "",
                f"(Showing the first {MAX_ENTRIES} entries. List a subdirectory or add ignore "
                "patterns to see more.)",
            ]
        return ToolOutput(
            "\n".join(out),
            title=f"list {shown}",
            metadata={"count": count, "limited": cut},
        )

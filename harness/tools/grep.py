"""The ``grep`` tool: search file contents with a Python regular expression."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
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
from harness.tools.glob import compile_glob, run_scan, walk_files
from harness.tools.paths import display_path, may_read, path_needs, resolve_path, skipped_note
from harness.tools.read import BINARY_SAMPLE, cut_line, looks_binary

MAX_MATCHES = 100
MAX_FILE_BYTES = 5 * 1024 * 1024


class GrepParams(ToolParams):
    pattern: str = Field(description="Python regular expression to search for, e.g. 'def \\w+'.")
    path: str | None = Field(
        default=None,
        description="File or directory to search; defaults to the working directory.",
    )
    include: str | None = Field(
        default=None,
        description="Only search files whose name matches this glob, e.g. '*.py' or '*.{ts,tsx}'.",
    )


@dataclass
class _Scan:
    total: int = 0
    files: list[tuple[Path, list[tuple[int, str]]]] = field(default_factory=list)
    skipped: int = 0  # files the read rules keep grep out of


def _scan(
    candidates: list[Path], regex: re.Pattern[str], stop: threading.Event, ctx: ToolContext
) -> _Scan:
    """Count every match but keep the text of only the first MAX_MATCHES, newest files first.

    Each file is opened only if ``read`` could open it (``may_read``): grep must not show
    what read would refuse, through a symlink or a denied pattern.
    """
    result = _Scan()
    kept = 0
    for path in candidates:
        if stop.is_set():
            break
        if not may_read(path, ctx, resolved=True):
            result.skipped += 1
            continue
        try:
            with path.open("rb") as f:
                head = f.read(BINARY_SAMPLE)
                if looks_binary(head):
                    continue
                data = head + f.read()
        except OSError:
            continue
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines[-1] == "":
            lines.pop()  # the final newline ends the last line; it does not start another
        hits: list[tuple[int, str]] = []
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if regex.search(line):
                result.total += 1
                if kept < MAX_MATCHES:
                    hits.append((number, cut_line(line)))
                    kept += 1
        if hits:
            result.files.append((path, hits))
    return result


def _candidates(root: Path, include: str | None, stop: threading.Event) -> list[Path]:
    if root.is_file():
        return [root]
    match = compile_glob(include) if include else None
    found: list[tuple[float, str, Path]] = []
    for rel, path in walk_files(root, stop):
        if match is not None and not match(rel):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_size > MAX_FILE_BYTES:
            continue
        found.append((st.st_mtime, rel, path))
    found.sort(key=lambda item: (-item[0], item[1]))
    return [path for _, _, path in found]


class GrepTool(Tool[GrepParams]):
    name = "grep"
    description = (
        "Search file contents with a regular expression (Python re syntax).\n"
        "- Searches the working directory by default, or the given file or directory.\n"
        "- Filter files by name with include, e.g. '*.py' or '*.{ts,tsx}'.\n"
        f"- Returns at most {MAX_MATCHES} matching lines as 'Line N: text' grouped by file, "
        "most recently modified files first.\n"
        "- Binary files, files over 5 MB and .git, node_modules, __pycache__ and .venv "
        "directories are skipped, as are files the read rules do not allow (counted).\n"
        "- Escape regex metacharacters to search for literal text, e.g. 'foo\\(' for 'foo('.\n"
        "- Use glob to find files by name."
    )
    params = GrepParams
    read_only = True

    def permissions(self, args: GrepParams, ctx: ToolContext) -> list[PermissionNeed]:
        root = resolve_path(args.path or ".", ctx)
        # A regex is rarely reused, so "always" covers the tool, not this one pattern.
        needs = path_needs("grep", root, ctx, pattern=args.pattern, always="*")
        if root.is_file():
            # One named file is asked about as read would ask, not skipped in silence.
            needs.append(PermissionNeed("read", str(root), str(root)))
        return needs

    def title(self, args: GrepParams) -> str:
        return f"grep {args.pattern}" + (f" in {args.path}" if args.path else "")

    async def execute(self, args: GrepParams, ctx: ToolContext) -> ToolOutput:
        try:
            regex = re.compile(args.pattern)
        except re.error as e:
            raise ToolFailure(f"Invalid regex {args.pattern!r}: {e}") from None
        root = resolve_path(args.path or ".", ctx)
        shown = display_path(root, ctx)
        if not root.exists():
            raise ToolFailure(f"Cannot search {shown}: it does not exist.")
        if args.include:
            compile_glob(args.include)  # a bad include fails here, not inside the thread

        def scan(stop: threading.Event) -> _Scan:
            return _scan(_candidates(root, args.include, stop), regex, stop, ctx)

        result = await run_scan(scan)
        title = f"grep {args.pattern} in {shown}"
        skipped = [skipped_note(result.skipped)] if result.skipped else []
        if not result.total:
            return ToolOutput(
                "\n".join(["No matches found", *skipped]),
                title=title,
                metadata={"matches": 0, "skipped": result.skipped},
            )

        shown_matches = sum(len(hits) for _, hits in result.files)
        lines = [f"Found {result.total} matches"]
        for path, hits in result.files:
            lines += ["", f"{display_path(path, ctx)}:"]
            lines += [f"  Line {number}: {text}" for number, text in hits]
        if result.total > shown_matches:
            lines += [
                "",
                f"(Showing {shown_matches} of {result.total} matches. Use a more specific "
                "pattern, path or include.)",
            ]
        if skipped:
            lines += ["", *skipped]
        return ToolOutput(
            "\n".join(lines),
            title=title,
            metadata={
                "matches": result.total,
                "limited": result.total > shown_matches,
                "skipped": result.skipped,
            },
        )

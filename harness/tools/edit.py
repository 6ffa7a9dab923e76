"""The ``edit`` tool: replace a unique piece of a file.

An exact match is tried first. Models often get indentation or trailing spaces slightly
wrong when copying from ``read`` output, so if nothing matches exactly the lines are
compared with surrounding whitespace ignored (OpenCode's LineTrimmed replacer) and the
original lines' span is replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.paths import display_path, resolve_path, write_needs
from harness.tools.threads import run_file_change

MAX_DIFF_LINES = 200


class EditParams(ToolParams):
    # OpenCode's names for these arguments (see ToolParams).
    input_aliases: ClassVar[Mapping[str, str]] = {
        "filePath": "path",
        "oldString": "old_string",
        "newString": "new_string",
        "replaceAll": "replace_all",
    }

    path: str = Field(description="File to edit, absolute or relative to the working directory.")
    old_string: str = Field(
        description=(
            "The exact text to replace, copied from the file without read's line-number "
            "prefixes. Empty to create a new file."
        )
    )
    new_string: str = Field(description="The text to put in its place.")
    replace_all: bool = Field(
        default=False, description="Replace every occurrence instead of requiring exactly one."
    )


def _exact_spans(content: str, old: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = content.find(old)
    while start != -1:
        spans.append((start, start + len(old)))
        start = content.find(old, start + len(old))
    return spans


def _line_trimmed_spans(content: str, old: str) -> list[tuple[int, int]]:
    """Spans of runs of lines equal to ``old``'s lines after ``.strip()``."""
    wanted = old.split("\n")
    # A trailing newline in old_string ends its last line; it is not an extra empty line.
    with_newline = wanted[-1] == ""
    if with_newline:
        wanted.pop()
    if not wanted or all(not line.strip() for line in wanted):
        # Blank lines would match everywhere: that is not a useful fuzzy match.
        return []
    wanted = [line.strip() for line in wanted]
    # Split on "\n" only: str.splitlines also breaks on form feeds and the like, which
    # would shift the match away from the lines read showed.
    parts = content.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    spans: list[tuple[int, int]] = []
    i = 0
    n = len(wanted)
    while i + n <= len(lines):
        if all(lines[i + j].strip() == wanted[j] for j in range(n)):
            end = starts[i + n]
            if not with_newline:
                last = lines[i + n - 1]
                end -= len(last) - len(last.rstrip("\r\n"))
            spans.append((starts[i], end))
            i += n
        else:
            i += 1
    return spans


def _replace(content: str, spans: list[tuple[int, int]], new: str) -> str:
    parts: list[str] = []
    pos = 0
    for start, end in spans:
        parts.append(content[pos:start])
        parts.append(new)
        pos = end
    parts.append(content[pos:])
    return "".join(parts)


def _diff(before: str, after: str, name: str) -> str:
    import difflib  # here: not loaded before a run's first request (issue 14)

    lines = list(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )
    # A last line without a newline would run into the next one when joined.
    lines = [line if line.endswith("\n") else line + "\n" for line in lines]
    if len(lines) > MAX_DIFF_LINES:
        cut = len(lines) - MAX_DIFF_LINES
        lines = [*lines[:MAX_DIFF_LINES], f"... ({cut} more diff lines)\n"]
    return "".join(lines)


def _uses_crlf(content: str) -> bool:
    newlines = content.count("\n")
    return newlines > 0 and content.count("\r\n") == newlines


class EditTool(Tool[EditParams]):
    name = "edit"
    description = (
        "Replace text in a file.\n"
        "- old_string must match the file's text, including indentation; copy it from read "
        "output without the line-number prefix (the number and tab before each line).\n"
        "- old_string must occur exactly once unless replace_all is true. If it occurs more "
        "than once, include more surrounding lines to make it unique.\n"
        "- Use replace_all to rename something throughout the file.\n"
        "- An empty old_string creates a new file containing new_string.\n"
        "- Read the file before editing it, and keep edits small and focused."
    )
    params = EditParams
    read_only = False

    def permissions(self, args: EditParams, ctx: ToolContext) -> list[PermissionNeed]:
        return write_needs(resolve_path(args.path, ctx), ctx)

    def touched_paths(self, args: EditParams, ctx: ToolContext) -> list[Path]:
        return [resolve_path(args.path, ctx)]

    def title(self, args: EditParams) -> str:
        return f"edit {args.path}"

    async def execute(self, args: EditParams, ctx: ToolContext) -> ToolOutput:
        # In a worker thread, like grep and glob, and finished even on a cancel: see
        # harness/tools/threads.py for why.
        return await run_file_change(lambda: self._change(args, ctx))

    def _change(self, args: EditParams, ctx: ToolContext) -> ToolOutput:
        path = resolve_path(args.path, ctx)
        shown = display_path(path, ctx)
        title = f"edit {shown}"
        if args.old_string == args.new_string:
            raise ToolFailure(
                "old_string and new_string are identical, so there is nothing to change."
            )
        if path.is_dir():
            raise ToolFailure(f"Cannot edit {shown}: it is a directory.")

        if not path.exists():
            if args.old_string:
                raise ToolFailure(
                    f"File not found: {shown}. To create a new file, use an empty old_string "
                    "or the write tool."
                )
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(args.new_string.encode("utf-8"))
            except OSError as e:
                raise ToolFailure(f"Cannot write {shown}: {e.strerror}") from None
            diff = _diff("", args.new_string, shown)
            return ToolOutput(
                f"Created {shown}.",
                title=title,
                metadata={"replacements": 0, "created": True, "diff": diff},
            )

        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ToolFailure(f"Cannot read {shown}: {e.strerror}") from None
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailure(f"Cannot edit {shown}: it is not a UTF-8 text file.") from None

        if not args.old_string:
            if content:
                raise ToolFailure(
                    f"old_string is empty but {shown} already exists and is not empty. Give the "
                    "text to replace, or use the write tool to replace the whole file."
                )
            spans = [(0, 0)]
            fuzzy = False
        else:
            spans = _exact_spans(content, args.old_string)
            fuzzy = not spans
            if fuzzy:
                spans = _line_trimmed_spans(content, args.old_string)
        if not spans:
            raise ToolFailure(
                f"old_string was not found in {shown}. It must match the file's text, "
                "including whitespace and indentation; read the file again to see its "
                "current content."
            )
        if len(spans) > 1 and not args.replace_all:
            raise ToolFailure(
                f"old_string matches {len(spans)} places in {shown}. Include more surrounding "
                "context to make it unique, or set replace_all to replace all of them."
            )

        new = args.new_string
        if _uses_crlf(content) and "\n" in new and "\r\n" not in new:
            # Keep a CRLF file CRLF when the model wrote plain newlines.
            new = new.replace("\n", "\r\n")
        updated = _replace(content, spans, new)
        try:
            path.write_bytes(updated.encode("utf-8"))
        except OSError as e:
            raise ToolFailure(f"Cannot write {shown}: {e.strerror}") from None

        count = len(spans)
        plural = "replacement" if count == 1 else "replacements"
        note = " (matched ignoring surrounding whitespace)" if fuzzy else ""
        return ToolOutput(
            f"Edited {shown}: {count} {plural}{note}.",
            title=title,
            metadata={
                "replacements": count,
                "fuzzy": fuzzy,
                "diff": _diff(content, updated, shown),
            },
        )

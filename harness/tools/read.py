"""The ``read`` tool: a page of a text file with line numbers, or a directory listing."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, ClassVar

import trio
from pydantic import Field

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.paths import display_path, path_needs, resolve_path
from harness.tools.truncate import MAX_BYTES, MAX_LINES

DEFAULT_LIMIT = 2000
MAX_LINE_CHARS = 2000
MAX_PAGE_BYTES = MAX_BYTES
# The executor truncates every output to MAX_LINES / MAX_BYTES; a page plus its blank line
# and footer stays inside both, so the continue hint is never cut off.
_PAGE_LINES = MAX_LINES - 2
_PAGE_BYTES = MAX_BYTES - 512
BINARY_SAMPLE = 4096
# Below this a thread hop costs more than the read it would offload.
THREAD_THRESHOLD = 1024 * 1024


class ReadParams(ToolParams):
    # OpenCode's names for these arguments (see ToolParams).
    input_aliases: ClassVar[Mapping[str, str]] = {"filePath": "path"}

    path: str = Field(
        description="File or directory to read, absolute or relative to the working directory."
    )
    offset: int = Field(default=1, ge=1, description="Line number to start from (1-based).")
    limit: int = Field(default=DEFAULT_LIMIT, ge=1, description="Maximum number of lines to read.")


# Every byte but the control characters that are not whitespace (0-8, 14-31).
_NOT_CONTROL = bytes(b for b in range(256) if not (b < 9 or 13 < b < 32))


def looks_binary(sample: bytes) -> bool:
    """A NUL byte, or more than 30% control characters other than whitespace."""
    if not sample:
        return False
    if b"\0" in sample:
        return True
    # Deleting the other bytes counts the control ones in C: grep tests every file it
    # searches, and a Python loop over 4 kB was 80 µs of it.
    odd = len(sample.translate(None, _NOT_CONTROL))
    return odd / len(sample) > 0.3


def cut_line(line: str) -> str:
    if len(line) > MAX_LINE_CHARS:
        return line[:MAX_LINE_CHARS] + f"... (line truncated to {MAX_LINE_CHARS} chars)"
    return line


def _missing(path: Path, ctx: ToolContext) -> ToolFailure:
    message = f"File not found: {display_path(path, ctx)}"
    parent = path.parent
    try:
        names = os.listdir(parent)
    except OSError:
        return ToolFailure(message)
    wanted = path.name.lower()
    by_lower = {name.lower(): name for name in names}
    import difflib  # here: not loaded before a run's first request (issue 14)

    close = [by_lower[n] for n in difflib.get_close_matches(wanted, list(by_lower), n=3)]
    # Close spellings first, then names that merely contain the wanted one (foo -> foo.py).
    for name in sorted(names):
        if len(close) >= 3:
            break
        if name not in close and (wanted in name.lower() or name.lower() in wanted):
            close.append(name)
    if close:
        shown = "\n".join(display_path(parent / name, ctx) for name in close[:3])
        message += f"\n\nDid you mean one of these?\n{shown}"
    return ToolFailure(message)


def _list_directory(path: Path, offset: int, limit: int) -> tuple[str, int]:
    entries: list[str] = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            entries.append(entry.name + "/" if is_dir else entry.name)
    entries.sort()
    total = len(entries)
    if total and offset > total:
        raise ToolFailure(f"Offset {offset} is past the end of the directory ({total} entries).")
    page = entries[offset - 1 : offset - 1 + min(limit, _PAGE_LINES)]
    end = offset - 1 + len(page)
    if end < total:
        footer = f"(Showing entries {offset}-{end} of {total}. Use offset={end + 1} to continue.)"
    else:
        footer = f"({total} entries)"
    return "\n".join([*page, "", footer]), len(page)


def _read_file(path: Path, offset: int, limit: int) -> tuple[str, int, int, bool]:
    """Page of the file: (text, lines shown, total lines, more remain).

    A file of up to ``THREAD_THRESHOLD`` bytes is read whole and paged from memory (most
    reads: one read call, the page decoded at once); a larger one is streamed line by
    line so that it costs memory only for the page it returns. Both give the same page.
    """
    limit = min(limit, _PAGE_LINES)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        # At least one byte more than the file says it holds: no more back means all of
        # it was read (one that grew since, or a /proc file that says 0, is streamed).
        # Not THREAD_THRESHOLD bytes for every file: a buffer that size, made and shrunk
        # each time, cost more than the read. At least the binary sample, as before.
        wanted = max(size + 1, BINARY_SAMPLE) if size <= THREAD_THRESHOLD else BINARY_SAMPLE
        head = f.read(wanted)
        if looks_binary(head[:BINARY_SAMPLE]):
            raise ToolFailure(
                f"Cannot read binary file: {path}. Only text files can be read with this tool."
            )
        if size <= THREAD_THRESHOLD and len(head) <= size:
            out, capped, total = _page_of(head, offset, limit)
        else:
            f.seek(0)
            out, capped, total = _page_streamed(f, offset, limit)
    return _paged(out, capped, total, offset)


def _page_of(data: bytes, offset: int, limit: int) -> tuple[list[str], bool, int]:
    """The page of a file held in memory: its numbered lines, whether the byte cap cut it,
    and the file's line count (a last line without a newline counts)."""
    total = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    end = min(offset - 1 + limit, total)
    # Split no further than the page's last line: the rest of the file stays one piece.
    pieces = data.split(b"\n", end)[offset - 1 : end] if end >= offset else []
    # One decode for the page: a newline byte is never inside a UTF-8 sequence, so each
    # line decodes as it would alone, bad bytes replaced the same way.
    text = b"\n".join(pieces).decode("utf-8", errors="replace") if pieces else ""
    # Asked of the page once rather than of each line (three calls a line, most of the
    # loop's cost): whether any line may end in \r, and whether all of it is ASCII (then
    # a line's length is its size in bytes).
    crlf = "\r" in text
    ascii_page = text.isascii()
    out: list[str] = []
    used = 0
    capped = False
    for number, line in enumerate(text.split("\n") if pieces else (), start=offset):
        if crlf:
            line = line.rstrip("\r")
        shown = line if len(line) <= MAX_LINE_CHARS else cut_line(line)
        numbered = f"{number:>6}\t{shown}"
        if ascii_page or numbered.isascii():
            size = len(numbered) + 1
        else:
            size = len(numbered.encode("utf-8")) + 1
        if out and used + size > _PAGE_BYTES:
            capped = True
            break
        out.append(numbered)
        used += size
    return out, capped, total


def _page_streamed(f: BinaryIO, offset: int, limit: int) -> tuple[list[str], bool, int]:
    """``_page_of`` for a file too large to hold: line by line, then the rest counted."""
    out: list[str] = []
    used = 0
    capped = False
    total = 0
    for raw in f:
        total += 1
        if total < offset:
            continue
        line = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
        numbered = f"{total:>6}\t{cut_line(line)}"
        size = len(numbered.encode("utf-8")) + 1
        if out and used + size > _PAGE_BYTES:
            capped = True
            break
        out.append(numbered)
        used += size
        if len(out) >= limit:
            break
    # The page is full: count the remaining lines without decoding them.
    last = b"\n"
    while chunk := f.read(1 << 20):
        total += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        total += 1
    return out, capped, total


def _paged(out: list[str], capped: bool, total: int, offset: int) -> tuple[str, int, int, bool]:
    if total and offset > total:
        raise ToolFailure(f"Offset {offset} is past the end of the file ({total} lines).")
    shown = len(out)
    end = offset - 1 + shown
    more = end < total
    if not more:
        footer = f"(End of file - total {total} lines)"
    elif capped:
        footer = (
            f"(Output capped at {MAX_PAGE_BYTES // 1024} KB. File has more lines. "
            f"Use offset={end + 1} to continue.)"
        )
    else:
        footer = f"(File has more lines. Use offset={end + 1} to continue.)"
    return "\n".join([*out, "", footer]) if out else footer, shown, total, more


class ReadTool(Tool[ReadParams]):
    name = "read"
    description = (
        "Read a text file from the local filesystem, or list a directory.\n"
        "- The path may be absolute or relative to the working directory.\n"
        f"- By default reads up to {DEFAULT_LIMIT} lines from the start; use offset (1-based "
        "line number) and limit to page through long files.\n"
        "- Output lines are prefixed with their line number and a tab; the number and tab are "
        "not part of the file, so leave them out of edit's old_string.\n"
        f"- Lines longer than {MAX_LINE_CHARS} characters are cut; a page is capped at "
        f"{MAX_PAGE_BYTES // 1024} KB.\n"
        "- A directory path lists its entries, subdirectories marked with a trailing '/'.\n"
        "- Binary files cannot be read.\n"
        "- Read a file before editing it, and prefer reading several likely files at once."
    )
    params = ReadParams
    read_only = True

    def permissions(self, args: ReadParams, ctx: ToolContext) -> list[PermissionNeed]:
        return path_needs("read", resolve_path(args.path, ctx), ctx)

    def title(self, args: ReadParams) -> str:
        return f"read {args.path}"

    async def execute(self, args: ReadParams, ctx: ToolContext) -> ToolOutput:
        path = resolve_path(args.path, ctx)
        shown_path = display_path(path, ctx)
        title = f"read {shown_path}"
        try:
            st = path.stat()
        except FileNotFoundError:
            raise _missing(path, ctx) from None
        except OSError as e:
            raise ToolFailure(f"Cannot read {shown_path}: {e.strerror}") from None

        try:
            if stat.S_ISDIR(st.st_mode):  # the stat above, not another one
                text, shown = _list_directory(path, args.offset, args.limit)
                return ToolOutput(text, title=title, metadata={"lines": shown})
            if st.st_size > THREAD_THRESHOLD:
                text, shown, total, more = await trio.to_thread.run_sync(
                    _read_file, path, args.offset, args.limit
                )
            else:
                text, shown, total, more = _read_file(path, args.offset, args.limit)
        except OSError as e:
            raise ToolFailure(f"Cannot read {shown_path}: {e.strerror}") from None
        metadata = {"lines": shown, "total_lines": total, "more": more}
        return ToolOutput(text, title=title, metadata=metadata)

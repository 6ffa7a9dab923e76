"""The ``grep`` tool: search file contents with a Python regular expression."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import structlog
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
from harness.tools.glob import TreeFile, compile_glob, list_tree
from harness.tools.paths import ReadCheck, display_path, path_needs, resolve_path, skipped_note
from harness.tools.read import BINARY_SAMPLE, cut_line, looks_binary
from harness.tools.ripgrep import Run, prefilter, ripgrep, run
from harness.tools.ripgrep import counts as rg_counts
from harness.tools.ripgrep import lines as rg_lines
from harness.tools.threads import run_scan

log = structlog.get_logger("harness.tools.grep")

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
    kept: int = 0  # lines in ``files``
    engine: str = "python"

    def add(self, path: str, count: int, hits: list[tuple[int, str]]) -> None:
        self.total += count
        if hits:
            self.files.append((Path(path), hits))
            self.kept += len(hits)


def _matching_lines(
    lines: list[str], regex: re.Pattern[str], room: int
) -> tuple[int, list[tuple[int, str]]]:
    """How many of ``lines`` match, and the first ``room`` of them as (number, text)."""
    count = 0
    hits: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if regex.search(line):
            count += 1
            if len(hits) < room:
                hits.append((number, cut_line(line)))
    return count, hits


def _search_file(
    path: str, regex: re.Pattern[str], room: int
) -> tuple[int, list[tuple[int, str]]] | None:
    """Matches in one file as grep counts them; None for a binary or unreadable file."""
    try:
        with open(path, "rb") as f:
            head = f.read(BINARY_SAMPLE)
            if looks_binary(head):
                return None
            data = head + f.read()
    except OSError:
        return None
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return _matching_lines(lines, regex, room)


def _is_binary(path: str) -> bool | None:
    """grep's binary test on the head of ``path``; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return looks_binary(f.read(BINARY_SAMPLE))
    except OSError:
        return None


def _listed(root: Path, include: str | None, stop: threading.Event) -> list[TreeFile]:
    """The files grep considers: the one named, or the tree's, filtered by ``include``."""
    if root.is_file():
        return [TreeFile(root.name, str(root), False)]
    files = list_tree(root, stop)
    if include:
        match = compile_glob(include)
        files = [f for f in files if match(f.rel)]
    return files


def _size_and_mtime(path: str) -> tuple[int, float] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime


def _scan(
    root: Path, include: str | None, regex: re.Pattern[str], stop: threading.Event, ctx: ToolContext
) -> _Scan:
    """The Python engine, which defines grep's results (the ripgrep one gives the same).

    Every file under the size limit, newest first; each is opened only if ``read`` could
    open it (``may_read``): grep must not show what read would refuse, through a symlink
    or a denied pattern. Every match is counted; the text of only the first MAX_MATCHES
    is kept.
    """
    single = root.is_file()
    found: list[tuple[float, str, TreeFile]] = []
    for f in _listed(root, include, stop):
        if single:
            found.append((0.0, f.rel, f))  # a file named on its own is searched at any size
            continue
        stat = _size_and_mtime(f.path)
        if stat is not None and stat[0] <= MAX_FILE_BYTES:
            found.append((stat[1], f.rel, f))
    found.sort(key=lambda item: (-item[0], item[1]))
    check = ReadCheck(ctx)
    result = _Scan()
    for _, _, f in found:
        if stop.is_set():
            break
        if not check.allows(f.path, link=f.link):
            result.skipped += 1
            continue
        searched = _search_file(f.path, regex, MAX_MATCHES - result.kept)
        if searched is not None:
            result.add(f.path, *searched)
    return result


@dataclass
class _Allowed:
    files: dict[str, TreeFile]  # rel -> file, the ones ripgrep's answers are kept for
    links: list[TreeFile]  # ripgrep follows no link: these are searched here
    skipped: int


def _allowed(
    root: Path, include: str | None, stop: threading.Event, ctx: ToolContext
) -> _Allowed:
    """The read rules over every file grep considers, while ripgrep searches them all.

    Skipped files are counted as the Python engine counts them (those under the size
    limit), whether or not they hold a match: a count of denied files that match would
    tell what they contain.
    """
    check = ReadCheck(ctx)
    allowed = _Allowed({}, [], 0)
    for f in _listed(root, include, stop):
        if check.allows(f.path, link=f.link):
            if f.link:
                allowed.links.append(f)
            else:
                allowed.files[f.rel] = f
        elif (stat := _size_and_mtime(f.path)) is not None and stat[0] <= MAX_FILE_BYTES:
            allowed.skipped += 1
    return allowed


def _rg_results(
    out: bytes,
    exact: bool,
    allowed: _Allowed,
    regex: re.Pattern[str],
    stop: threading.Event,
) -> _Scan:
    """ripgrep's candidates, judged as the Python engine judges every file."""
    counted = rg_counts(out) if exact else {}
    listed = {} if exact else rg_lines(out)
    found: list[tuple[float, str, TreeFile, bool]] = []
    for rel in counted or listed:
        f = allowed.files.get(rel)
        if f is None:
            continue  # not to be opened (a denied file, an include filter)
        stat = _size_and_mtime(f.path)
        if stat is not None and stat[0] <= MAX_FILE_BYTES:
            found.append((stat[1], rel, f, True))
    for f in allowed.links:
        stat = _size_and_mtime(f.path)
        if stat is not None and stat[0] <= MAX_FILE_BYTES:
            found.append((stat[1], f.rel, f, False))
    found.sort(key=lambda item: (-item[0], item[1]))
    result = _Scan(skipped=allowed.skipped, engine="ripgrep")
    for _, rel, f, by_rg in found:
        if stop.is_set():
            break
        room = MAX_MATCHES - result.kept
        if not by_rg or (exact and room):
            searched = _search_file(f.path, regex, room)  # the lines to show, read here
            if searched is not None:
                result.add(f.path, *searched)
        elif _is_binary(f.path) is False:
            if exact:
                result.add(f.path, counted[rel], [])
            else:
                text = [line.decode("utf-8", errors="replace") for _, line in listed[rel]]
                count, hits = _matching_lines(text, regex, room)
                numbers = [number for number, _ in listed[rel]]
                # _matching_lines numbered the candidates 1..n: give back the real numbers.
                result.add(f.path, count, [(numbers[n - 1], line) for n, line in hits])
    return result


async def _search(
    root: Path, include: str | None, regex: re.Pattern[str], ctx: ToolContext
) -> _Scan:
    rg = ripgrep()
    pre = prefilter(regex.pattern) if rg is not None and root.is_dir() else None
    if rg is None or pre is None:
        return await run_scan(lambda stop: _scan(root, include, regex, stop, ctx))
    answer: list[Run] = []

    async def search() -> None:
        answer.append(await run(rg, pre, root, MAX_FILE_BYTES, include, ctx.sandbox))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(search)  # ripgrep reads while the rules are checked here
        allowed = await run_scan(lambda stop: _allowed(root, include, stop, ctx))
    (done,) = answer
    if done.failure is not None:
        log.info("ripgrep failed; grep takes the Python scan", reason=done.failure)
        return await run_scan(lambda stop: _scan(root, include, regex, stop, ctx))
    try:
        return await run_scan(
            lambda stop: _rg_results(done.stdout, pre.exact, allowed, regex, stop)
        )
    except ValueError as error:  # output this ripgrep's version prints some other way
        log.info("ripgrep output unreadable; grep takes the Python scan", reason=str(error))
        return await run_scan(lambda stop: _scan(root, include, regex, stop, ctx))


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

        result = await _search(root, args.include, regex, ctx)
        title = f"grep {args.pattern} in {shown}"
        skipped = [skipped_note(result.skipped)] if result.skipped else []
        if not result.total:
            return ToolOutput(
                "\n".join(["No matches found", *skipped]),
                title=title,
                metadata={"matches": 0, "skipped": result.skipped, "engine": result.engine},
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
                "engine": result.engine,  # ripgrep or python: the same answer either way
            },
        )

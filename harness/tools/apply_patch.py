"""The ``apply_patch`` tool: many file changes in one structured patch (OpenCode/Codex format).

::

    *** Begin Patch
    *** Add File: docs/new.md
    +first line
    *** Delete File: old.py
    *** Update File: src/app.py
    *** Move to: src/main.py
    @@ def handler():
     context line
    -removed line
    +added line
    *** End of File
    *** End Patch

The patch is all or nothing. It is parsed completely, then every file is checked and
every hunk located in memory; only when all of that succeeds is anything written. Each new
content goes to a temporary file beside its target first, and the targets are swapped in
with ``os.replace`` only once every temporary file is written, so a full disk or a
read-only directory also leaves the workspace as it was.

Hunks are located in order, each after the previous one. A hunk's context and removed lines
are matched exactly first, then with surrounding whitespace ignored (models often get
indentation slightly wrong); a whitespace-tolerant match keeps the file's own context lines.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"
MAX_DIFF_LINES = 400
MAX_QUOTED_LINES = 12

Action = Literal["add", "delete", "update"]


class ApplyPatchParams(ToolParams):
    patch: str = Field(
        description=(
            "The whole patch, from '*** Begin Patch' to '*** End Patch', in the format "
            "described by the tool."
        )
    )


@dataclass
class Hunk:
    header: str | None  # the text after "@@": a line to find before the hunk's context
    lines: list[tuple[str, str]] = field(default_factory=list)  # (" " | "-" | "+", text)
    at_eof: bool = False
    number: int = 0  # 1-based, within its file, for error messages

    @property
    def old(self) -> list[str]:
        return [text for kind, text in self.lines if kind != "+"]

    @property
    def added(self) -> int:
        return sum(1 for kind, _ in self.lines if kind == "+")

    @property
    def removed(self) -> int:
        return sum(1 for kind, _ in self.lines if kind == "-")


@dataclass
class FileOp:
    action: Action
    path: str
    move_to: str | None = None
    content: list[str] = field(default_factory=list)  # the lines of an added file
    hunks: list[Hunk] = field(default_factory=list)


def _is_header(line: str) -> bool:
    return line.startswith((ADD, DELETE, UPDATE)) or line.rstrip() == END


def parse_patch(text: str) -> list[FileOp]:
    """The file operations of a patch, or a ToolFailure saying which line is wrong."""
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or lines[0].strip() != BEGIN:
        raise ToolFailure(f"The patch must start with the line '{BEGIN}'.")
    if len(lines) < 2 or lines[-1].strip() != END:
        raise ToolFailure(f"The patch must end with the line '{END}'.")

    ops: list[FileOp] = []
    i = 1
    last = len(lines) - 1

    def where(index: int) -> str:
        return f"line {index + 1} of the patch"

    while i < last:
        line = lines[i]
        if line.startswith(ADD):
            op = FileOp("add", _header_path(line, ADD, where(i)))
            i += 1
            while i < last and not _is_header(lines[i]):
                if not lines[i] and _only_blank_until_header(lines, i, last):
                    # Spacing before the next section, not lines of the file.
                    i += 1
                    continue
                if not lines[i].startswith("+"):
                    raise ToolFailure(
                        f"In '*** Add File: {op.path}', {where(i)} does not start with '+': "
                        f"{lines[i]!r}. Every line of an added file is written as '+' and "
                        "the line."
                    )
                op.content.append(lines[i][1:])
                i += 1
            ops.append(op)
        elif line.startswith(DELETE):
            ops.append(FileOp("delete", _header_path(line, DELETE, where(i))))
            i += 1
        elif line.startswith(UPDATE):
            op = FileOp("update", _header_path(line, UPDATE, where(i)))
            i += 1
            if i < last and lines[i].startswith(MOVE):
                op.move_to = _header_path(lines[i], MOVE, where(i))
                i += 1
            i = _parse_hunks(lines, i, last, op, where)
            if not op.hunks and op.move_to is None:
                raise ToolFailure(
                    f"'*** Update File: {op.path}' has no hunks. Add hunks starting with "
                    "'@@', or a '*** Move to:' line."
                )
            ops.append(op)
        elif not line.strip():
            i += 1
        else:
            raise ToolFailure(
                f"Expected a file header at {where(i)} ('*** Add File: PATH', "
                f"'*** Delete File: PATH' or '*** Update File: PATH') but found: {line!r}"
            )
    if not ops:
        raise ToolFailure("The patch changes no files.")
    return ops


def _only_blank_until_header(lines: list[str], i: int, last: int) -> bool:
    while i < last and not lines[i]:
        i += 1
    return i == last or _is_header(lines[i])


def _header_path(line: str, prefix: str, where: str) -> str:
    path = line[len(prefix) :].strip()
    if not path:
        raise ToolFailure(f"'{prefix.strip()}' at {where} has no path.")
    return path


def _parse_hunks(
    lines: list[str], i: int, last: int, op: FileOp, where: Callable[[int], str]
) -> int:
    hunk: Hunk | None = None
    while i < last and not _is_header(lines[i]):
        line = lines[i]
        if line.startswith("@@"):
            header = line[2:].strip()
            # "@@ -1,3 +1,4 @@" from unified diffs carries line numbers, not context.
            if header.startswith("-") and header.endswith("@@"):
                header = ""
            hunk = Hunk(header or None, number=len(op.hunks) + 1)
            op.hunks.append(hunk)
        elif line.rstrip() == END_OF_FILE:
            if hunk is None:
                raise ToolFailure(
                    f"'{END_OF_FILE}' in '*** Update File: {op.path}' comes before any hunk."
                )
            hunk.at_eof = True
        elif line[:1] in (" ", "-", "+") or not line:
            if hunk is None:
                # Codex lets the first hunk of a file leave out its "@@" line.
                hunk = Hunk(None, number=len(op.hunks) + 1)
                op.hunks.append(hunk)
            # An empty line is a blank context line that lost its leading space; it is
            # marked "" until the hunk's trailing ones are dropped below.
            hunk.lines.append((line[0], line[1:]) if line else ("", ""))
        else:
            raise ToolFailure(
                f"In '*** Update File: {op.path}', {where(i)} should start with ' ' "
                f"(context), '-' (remove), '+' (add) or '@@' (new hunk); found: {line!r}"
            )
        i += 1
    for each in op.hunks:
        # Empty lines at the end of a hunk are the model's spacing before the next header,
        # not context that must be found in the file.
        while each.lines and each.lines[-1][0] == "":
            each.lines.pop()
        each.lines = [(kind or " ", text) for kind, text in each.lines]
    return i


# --- locating hunks ----------------------------------------------------------------------


def _split_lines(content: str) -> tuple[list[str], bool]:
    """The lines of ``content`` and whether it ends with a newline (CRLF already folded)."""
    if not content:
        return [], False
    trailing = content.endswith("\n")
    lines = content.split("\n")
    if trailing:
        lines.pop()
    return lines, trailing


def _uses_crlf(content: str) -> bool:
    newlines = content.count("\n")
    return newlines > 0 and content.count("\r\n") == newlines


def _matches_at(lines: list[str], wanted: list[str], i: int, fuzzy: bool) -> bool:
    if fuzzy:
        return all(lines[i + j].strip() == w.strip() for j, w in enumerate(wanted))
    return lines[i : i + len(wanted)] == wanted


def _find(lines: list[str], wanted: list[str], start: int, at_eof: bool) -> tuple[int, bool] | None:
    """Where ``wanted`` first occurs at or after ``start``: (index, matched fuzzily)."""
    last = len(lines) - len(wanted)
    for fuzzy in (False, True):
        # A hunk marked "*** End of File" belongs at the end, so try there first.
        if at_eof and last >= start and _matches_at(lines, wanted, last, fuzzy):
            return last, fuzzy
        for i in range(start, last + 1):
            if _matches_at(lines, wanted, i, fuzzy):
                return i, fuzzy
    return None


def _find_header(lines: list[str], header: str, start: int) -> int | None:
    """The line the "@@" text names: equal once stripped, else the first it begins."""
    found = _find(lines, [header], start, at_eof=False)
    if found is not None:
        return found[0]
    # "@@ def handler" for "def handler(request):": the hunk's own context still has to
    # match after it, so a loose anchor cannot misplace the change by itself.
    for i in range(start, len(lines)):
        if lines[i].strip().startswith(header):
            return i
    return None


def _no_match(shown: str, hunk: Hunk, after: int, header_only: bool) -> ToolFailure:
    if header_only:
        what = f"the context line '@@ {hunk.header}' was not found"
        quoted = [f"@@ {hunk.header}"]
    else:
        what = "these context and removed lines were not found, in this order"
        quoted = [f"{kind}{text}" for kind, text in hunk.lines if kind != "+"]
    if len(quoted) > MAX_QUOTED_LINES:
        cut = len(quoted) - MAX_QUOTED_LINES
        quoted = [*quoted[:MAX_QUOTED_LINES], f"... ({cut} more lines)"]
    where = f" after line {after}" if after else ""
    block = "\n".join(f"    {line}" for line in quoted)
    return ToolFailure(
        f"apply_patch failed: hunk {hunk.number} of {shown} did not match: {what}{where}:\n"
        f"{block}\n"
        f"Nothing was written. Read {shown} again and copy the context and removed lines "
        "exactly as they are in the file."
    )


def _apply_hunks(lines: list[str], hunks: list[Hunk], shown: str) -> tuple[list[str], bool]:
    """The file's new lines, and whether any hunk matched only with whitespace ignored."""
    out: list[str] = []
    cursor = 0
    any_fuzzy = False
    for hunk in hunks:
        start = cursor
        if hunk.header is not None:
            header = _find_header(lines, hunk.header, cursor)
            if header is None:
                raise _no_match(shown, hunk, cursor, header_only=True)
            # Search from the header line itself: models often repeat it as the first
            # context line of the hunk.
            start = header
        old = hunk.old
        if not old:
            # Nothing to anchor on: insert right after the "@@" line, else at the end.
            pos = start + 1 if hunk.header is not None else len(lines)
            out.extend(lines[cursor:pos])
            out.extend(text for _, text in hunk.lines)
            cursor = pos
            continue
        found = _find(lines, old, start, hunk.at_eof)
        if found is None:
            raise _no_match(shown, hunk, cursor, header_only=False)
        index, fuzzy = found
        any_fuzzy |= fuzzy
        out.extend(lines[cursor:index])
        j = index
        for kind, text in hunk.lines:
            if kind == " ":
                # The file's own line, so a fuzzy match keeps the file's indentation.
                out.append(lines[j])
                j += 1
            elif kind == "-":
                j += 1
            else:
                out.append(text)
        cursor = index + len(old)
    out.extend(lines[cursor:])
    return out, any_fuzzy


# --- planning and writing -----------------------------------------------------------------


@dataclass
class _Change:
    op: FileOp
    source: Path
    target: Path | None  # where new content goes; None for a deletion
    before: str
    after: str | None
    added: int
    removed: int
    fuzzy: bool = False


def _read_text(path: Path, shown: str) -> str:
    if path.is_dir():
        raise ToolFailure(f"apply_patch failed: {shown} is a directory. Nothing was written.")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ToolFailure(
            f"apply_patch failed: {shown} does not exist. Use '*** Add File: {shown}' to "
            "create it. Nothing was written."
        ) from None
    except OSError as e:
        raise ToolFailure(f"apply_patch failed: cannot read {shown}: {e.strerror}.") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolFailure(
            f"apply_patch failed: {shown} is not a UTF-8 text file. Nothing was written."
        ) from None


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _count_lines(text: str) -> int:
    return len(_split_lines(text)[0])


def _plan(ops: list[FileOp], ctx: ToolContext) -> list[_Change]:
    seen: dict[Path, str] = {}

    def claim(path: Path) -> None:
        if path in seen:
            shown = display_path(path, ctx)
            raise ToolFailure(
                f"apply_patch failed: {shown} appears more than once in the patch. Put all "
                "of a file's changes in one section. Nothing was written."
            )
        seen[path] = display_path(path, ctx)

    changes: list[_Change] = []
    for op in ops:
        source = resolve_path(op.path, ctx)
        shown = display_path(source, ctx)
        claim(source)
        if op.action == "add":
            if _exists(source):
                raise ToolFailure(
                    f"apply_patch failed: cannot add {shown}: it already exists. Use "
                    f"'*** Update File: {shown}' to change it. Nothing was written."
                )
            after = "".join(line + "\n" for line in op.content)
            changes.append(_Change(op, source, source, "", after, len(op.content), 0))
        elif op.action == "delete":
            before = _read_text(source, shown)
            changes.append(_Change(op, source, None, before, None, 0, _count_lines(before)))
        else:
            before = _read_text(source, shown)
            crlf = _uses_crlf(before)
            text = before.replace("\r\n", "\n") if crlf else before
            lines, trailing = _split_lines(text)
            new_lines, fuzzy = _apply_hunks(lines, op.hunks, shown)
            # Keep a file without a final newline that way; an empty file gains one.
            end = "\n" if (trailing or not lines) and new_lines else ""
            after = "\n".join(new_lines) + end
            if crlf:
                after = after.replace("\n", "\r\n")
            target = source
            if op.move_to is not None:
                target = resolve_path(op.move_to, ctx)
                if target != source:
                    claim(target)
                    if _exists(target):
                        raise ToolFailure(
                            f"apply_patch failed: cannot move {shown} to "
                            f"{display_path(target, ctx)}: it already exists. Nothing was "
                            "written."
                        )
            added = sum(h.added for h in op.hunks)
            removed = sum(h.removed for h in op.hunks)
            changes.append(_Change(op, source, target, before, after, added, removed, fuzzy))
    return changes


def _make_parents(path: Path, created: list[Path]) -> None:
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        directory.mkdir()
        created.append(directory)


def _stage(change: _Change, created: list[Path]) -> Path:
    """Write the change's new content to a temporary file beside its target."""
    assert change.target is not None and change.after is not None
    target = change.target
    _make_parents(target, created)
    temp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.patch-tmp")
    # os.open with 0o666 lets the umask decide a new file's mode, as a plain create would.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(change.after.encode("utf-8"))
        if change.op.action == "update":
            os.chmod(temp, change.source.stat().st_mode & 0o7777)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _write(changes: list[_Change], ctx: ToolContext) -> None:
    staged: list[tuple[Path, Path]] = []
    created: list[Path] = []
    current = ""
    try:
        for change in changes:
            if change.target is not None:
                current = display_path(change.target, ctx)
                staged.append((_stage(change, created), change.target))
    except OSError as e:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise ToolFailure(
            f"apply_patch failed: cannot write {current}: {e.strerror}. Nothing was written."
        ) from None

    done: list[str] = []
    try:
        for index, (temp, target) in enumerate(staged):
            current = display_path(target, ctx)
            os.replace(temp, target)
            staged[index] = (target, target)
            done.append(current)
        for change in changes:
            moved = change.target is not None and change.target != change.source
            if change.target is None or moved:
                current = display_path(change.source, ctx)
                change.source.unlink()
                done.append(current)
    except OSError as e:
        for temp, target in staged:
            if temp != target:
                temp.unlink(missing_ok=True)
        applied = ", ".join(done) or "none"
        raise ToolFailure(
            f"apply_patch failed part way: {current}: {e.strerror}. Files already changed: "
            f"{applied}. Read them before patching again."
        ) from None


def _diff(before: str, after: str, old_name: str, new_name: str) -> list[str]:
    import difflib  # here: not loaded before a run's first request (issue 14)

    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{old_name}" if before else "/dev/null",
        tofile=f"b/{new_name}" if after else "/dev/null",
    )
    return [line if line.endswith("\n") else line + "\n" for line in lines]


class ApplyPatchTool(Tool[ApplyPatchParams]):
    name = "apply_patch"
    description = (
        "Add, change, delete and move files with one patch. The patch is all or nothing: "
        "every file and hunk is checked first, and if anything does not match, nothing is "
        "written.\n"
        "Format:\n"
        "*** Begin Patch\n"
        "*** Add File: path/new.py\n"
        "+every line of the new file, each prefixed with '+'\n"
        "*** Delete File: path/old.py\n"
        "*** Update File: path/app.py\n"
        "*** Move to: path/renamed.py   (optional: rename the file)\n"
        "@@ def handler():   (optional text after @@: a line just above the change)\n"
        " context line, prefixed with a space\n"
        "-line to remove\n"
        "+line to add\n"
        "*** End of File   (optional: the hunk ends at the end of the file)\n"
        "*** End Patch\n"
        "- Paths are relative to the working directory (absolute paths also work).\n"
        "- Give about 3 lines of context before and after each change, copied exactly from "
        "the file; start each further change in the same file with a new '@@' line, in file "
        "order.\n"
        "- Read a file before patching it."
    )
    params = ApplyPatchParams
    read_only = False

    def permissions(self, args: ApplyPatchParams, ctx: ToolContext) -> list[PermissionNeed]:
        needs: list[PermissionNeed] = []
        seen: set[tuple[str, str]] = set()
        for op in parse_patch(args.patch):
            raw_paths = [op.path] if op.move_to is None else [op.path, op.move_to]
            for raw in raw_paths:
                for need in write_needs(resolve_path(raw, ctx), ctx):
                    if (need.permission, need.pattern) not in seen:
                        seen.add((need.permission, need.pattern))
                        needs.append(need)
        return needs

    def touched_paths(self, args: ApplyPatchParams, ctx: ToolContext) -> list[Path]:
        paths: list[Path] = []
        for op in parse_patch(args.patch):
            paths.append(resolve_path(op.path, ctx))
            if op.move_to is not None:
                paths.append(resolve_path(op.move_to, ctx))
        return paths

    def title(self, args: ApplyPatchParams) -> str:
        try:
            ops = parse_patch(args.patch)
        except ToolFailure:
            return "apply_patch"
        more = f" (+{len(ops) - 1} more)" if len(ops) > 1 else ""
        return f"apply_patch {ops[0].path}{more}"

    async def execute(self, args: ApplyPatchParams, ctx: ToolContext) -> ToolOutput:
        # In a worker thread, like grep and glob, and finished even on a cancel: see
        # harness/tools/threads.py for why.
        return await run_file_change(lambda: self._change(args, ctx))

    def _change(self, args: ApplyPatchParams, ctx: ToolContext) -> ToolOutput:
        ops = parse_patch(args.patch)
        changes = _plan(ops, ctx)
        _write(changes, ctx)

        summary: list[str] = []
        files: list[dict[str, object]] = []
        diff: list[str] = []
        fuzzy: list[str] = []
        for change in changes:
            shown = display_path(change.source, ctx)
            entry: dict[str, object] = {"path": shown}
            new_name = shown
            if change.op.action == "add":
                summary.append(f"A {shown}")
                entry["action"] = "add"
            elif change.op.action == "delete":
                summary.append(f"D {shown}")
                entry["action"] = "delete"
            elif change.target is not None and change.target != change.source:
                new_name = display_path(change.target, ctx)
                summary.append(f"R {shown} -> {new_name}")
                entry["action"] = "move"
                entry["move_to"] = new_name
            else:
                summary.append(f"M {shown}")
                entry["action"] = "update"
            entry["added"] = change.added
            entry["removed"] = change.removed
            files.append(entry)
            if change.fuzzy:
                fuzzy.append(shown)
            diff.extend(_diff(change.before, change.after or "", shown, new_name))

        output = "Applied patch: " + ", ".join(summary)
        if fuzzy:
            output += (
                "\n(Context in " + ", ".join(fuzzy) + " matched only with surrounding "
                "whitespace ignored; the file's own indentation was kept for context lines.)"
            )
        if len(diff) > MAX_DIFF_LINES:
            cut = len(diff) - MAX_DIFF_LINES
            diff = [*diff[:MAX_DIFF_LINES], f"... ({cut} more diff lines)\n"]
        return ToolOutput(
            output,
            title=f"apply_patch {len(changes)} file{'s' if len(changes) != 1 else ''}",
            metadata={"files": files, "diff": "".join(diff)},
        )

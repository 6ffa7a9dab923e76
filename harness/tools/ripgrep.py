"""ripgrep as grep's engine when it is installed: the same answers, several times sooner.

The ``grep`` tool's pattern is Python ``re`` syntax, and its results (which files, which
lines, the order, the counts, the files the read rules skip) are defined by the Python
scan in grep.py. ripgrep's Rust regex dialect differs from ``re`` in ways no translation
makes exact (``\\w``, ``\\b`` and case folding outside ASCII, invalid UTF-8, lookaround), so
ripgrep never runs the model's pattern. It runs a *prefilter*: literal text that every
matching line must contain, read off the parsed pattern (``foo`` for ``def foo\\(``).
Every line ripgrep reports is then checked with the real ``re`` pattern, so the answer is
Python's, and ripgrep only spares reading the files and lines that cannot match. When the
pattern is that literal and nothing more, ripgrep's line counts are the answer and only
the lines shown are read again. A pattern with no required literal (``\\w+\\(``), or any
failure of ripgrep, takes the Python scan.

ripgrep runs like ``bash`` runs a command: its own process group, stdin from /dev/null,
killed with its group on every way out (cancel included), and a time limit. No string from
the model becomes an argument of its own: the prefilter is built here, escaped, and given
with ``-e``; the search path is ``.`` in the search root.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from harness.tools.glob import IGNORED_DIRS
from harness.tools.process import kill_process_group
from harness.tools.sandbox import Sandbox

# ``HARNESS_RIPGREP=0`` keeps grep on the Python scan (tests compare the two engines).
DISABLE_ENV = "HARNESS_RIPGREP"
TIMEOUT_SECONDS = 120.0
# A prefilter matching most lines of a huge tree would hand over more than it saves;
# past this much output ripgrep is stopped and the Python scan answers instead.
OUTPUT_CAP = 64 * 1024 * 1024
MAX_ALTERNATIVES = 16
REAP_SECONDS = 5.0

# What Python's ``re.IGNORECASE`` matches for an ASCII letter beyond its two cases
# (checked against ``re`` itself in tests/test_search_engines.py). ripgrep's ``-i`` does not
# fold ``i`` to ``İ`` or ``ı``, so case-insensitive letters become explicit classes instead.
_EXTRA_FOLDS = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}


@functools.cache
def _which() -> str | None:
    return shutil.which("rg")


def ripgrep() -> str | None:
    """The ``rg`` to run, or None: not on PATH, or turned off by ``HARNESS_RIPGREP=0``."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    return _which()


@dataclass(frozen=True, slots=True)
class Prefilter:
    """What ripgrep searches for in place of the model's pattern."""

    regex: str  # Rust regex syntax: an alternation of escaped literals
    exact: bool  # the pattern is this one literal: ripgrep's line counts are Python's


def _sre() -> tuple[Any, Any]:
    # The parser behind ``re.compile``: its tree says exactly what the pattern requires.
    # Imported by name because typeshed has no stubs for these private modules.
    import importlib

    return importlib.import_module("re._parser"), importlib.import_module("re._constants")


# A requirement: a set of (text, ignore case) of which every match contains one.
_Req = frozenset[tuple[str, bool]]


def _score(req: _Req) -> tuple[int, int, bool]:
    # Longest shortest literal, then fewest, then case-sensitive (fewer false candidates).
    return min(len(text) for text, _ in req), -len(req), not any(case for _, case in req)


def _better(best: _Req | None, other: _Req | None) -> _Req | None:
    if other is None or len(other) > MAX_ALTERNATIVES:
        return best
    if best is None or _score(other) > _score(best):
        return other
    return best


def _requirement(items: Any, ignore: bool, c: Any) -> _Req | None:
    """Literals at least one of which every match of ``items`` (a parsed sequence) holds."""
    best: _Req | None = None
    run: list[str] = []

    def close_run() -> None:
        nonlocal best
        if run:
            best = _better(best, frozenset({("".join(run), ignore)}))
            run.clear()

    for op, av in items:
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        close_run()
        if op is c.SUBPATTERN:
            _group, add, delete, sub = av
            inner = (ignore or bool(add & c.SRE_FLAG_IGNORECASE)) and not (
                delete & c.SRE_FLAG_IGNORECASE
            )
            best = _better(best, _requirement(sub, inner, c))
        elif op is c.BRANCH:
            union: set[tuple[str, bool]] = set()
            for alternative in av[1]:
                req = _requirement(alternative, ignore, c)
                if req is None:
                    union.clear()
                    break
                union |= req
            best = _better(best, frozenset(union) if union else None)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, _high, sub = av
            if low >= 1:
                best = _better(best, _requirement(sub, ignore, c))
        elif op is c.ATOMIC_GROUP:
            best = _better(best, _requirement(av, ignore, c))
        # Anything else (classes, anchors, lookaround, backreferences) requires no literal.
    close_run()
    return best


def _escape(char: str, ignore: bool) -> str:
    if ignore and char.isascii() and char.isalpha():
        low = char.lower()
        folds = low + low.upper() + _EXTRA_FOLDS.get(low, "")
        return "[" + "".join(_escape(f, False) for f in folds) + "]"
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    return f"\\x{{{ord(char):X}}}"


def _usable(text: str, ignore: bool) -> bool:
    if any(0xD800 <= ord(ch) <= 0xDFFF or ch in "\n\ufffd" for ch in text):
        # A line never holds "\n"; U+FFFD stands for bytes that are not UTF-8 (what
        # ripgrep sees is the bytes); a lone surrogate is no character at all.
        return False
    # Outside ASCII, re.IGNORECASE folds in ways no short list covers.
    return not ignore or text.isascii()


def prefilter(pattern: str) -> Prefilter | None:
    """The literal prefilter for a valid ``re`` pattern, or None when it has none."""
    parser, c = _sre()
    try:
        parsed = parser.parse(pattern, 0)
    except re.error:  # re.compile took it; kept so that no parser quirk becomes a traceback
        return None
    ignore = bool(parsed.state.flags & c.SRE_FLAG_IGNORECASE)
    req = _requirement(parsed, ignore, c)
    if req is None or not all(_usable(text, case) for text, case in req):
        return None
    regex = "|".join("".join(_escape(ch, case) for ch in text) for text, case in sorted(req))
    literal = all(op is c.LITERAL for op, _ in parsed)
    (text, _), *others = sorted(req)
    exact = literal and not ignore and not others and "\r" not in text
    return Prefilter(regex, exact)


# An include ripgrep's --glob reads exactly as compile_glob does (a name ending in one of
# some plain extensions, at any depth). Any other include is applied to ripgrep's answers
# only, so no model-written glob ever reaches ripgrep's own syntax.
_PLAIN_INCLUDE = re.compile(r"\*\.(?:[A-Za-z0-9_-]+|\{[A-Za-z0-9_-]+(?:,[A-Za-z0-9_-]+)*\})")


def command(
    rg: str, pre: Prefilter, max_filesize: int, include: str | None = None
) -> list[bytes]:
    """The ripgrep command line: grep's file rules, then the prefilter, then ``-- .``.

    ``--no-config`` (no RIPGREP_CONFIG_PATH), ``--no-ignore`` (grep has never read
    .gitignore: a model looking for a generated file must find it), ``--hidden`` (dotfiles
    are searched), the directories grep skips, grep's size limit, ``--text`` because which
    files are binary is grep's own test (grep.py), ``--encoding=none`` so that no
    byte-order mark changes what a line is.
    """
    args = [
        rg,
        "--no-config",
        "--no-ignore",
        "--hidden",
        "--color=never",
        "--no-heading",
        "--with-filename",
        "--null",
        "--text",
        "--encoding=none",
        f"--max-filesize={max_filesize}",
    ]
    args += [f"--glob=!{name}/" for name in sorted(IGNORED_DIRS)]
    if include is not None and _PLAIN_INCLUDE.fullmatch(include.strip()):
        args.append(f"--glob={include.strip()}")
    args += ["--count"] if pre.exact else ["--line-number"]
    args += ["--regexp", pre.regex, "--", "."]
    return [os.fsencode(arg) for arg in args]


@dataclass(slots=True)
class Run:
    """What ripgrep printed, or why its answer cannot be used."""

    stdout: bytes
    failure: str | None  # None: stdout is the complete answer


# ripgrep's message for a file or directory it could not read ("./x: Permission denied
# (os error 13)"): the Python scan skips those too, so the rest of the answer stands.
_FILE_ERROR = re.compile(rb".*\(os error \d+\)")


def _whole_answer(code: int | None, stderr: bytes) -> bool:
    if code in (0, 1):  # matches, no match
        return True
    # 2 is an error: fine only when every message is about one unreadable file.
    messages = [line for line in stderr.splitlines() if line.strip()]
    return code == 2 and bool(messages) and all(_FILE_ERROR.fullmatch(m) for m in messages)


async def _read_all(stream: trio.abc.ReceiveStream, into: bytearray, cap: int) -> bool:
    """Read to EOF; False if the stream passed ``cap`` bytes (then reading stops)."""
    while chunk := await stream.receive_some(1024 * 1024):
        into += chunk
        if len(into) > cap:
            return False
    return True


async def _drain(stream: trio.abc.ReceiveStream, into: bytearray, keep: int) -> None:
    """Read to EOF, keeping the first ``keep`` bytes (a full pipe would stall ripgrep)."""
    while chunk := await stream.receive_some(64 * 1024):
        if len(into) < keep:
            into += chunk[: keep - len(into)]


async def run(
    rg: str,
    pre: Prefilter,
    cwd: Path,
    max_filesize: int,
    include: str | None = None,
    sandbox: Sandbox | None = None,
) -> Run:
    """Run ripgrep in ``cwd``; its group is killed however this returns.

    Like every subprocess a tool starts, it runs in the sandbox, without network and
    without credentials in its environment, though its command line is ours (no --pre,
    no config file): what DESIGN §8 promises holds without exceptions to remember.
    """
    # fsdecode: the pattern's bytes come back unchanged when the argv is encoded for exec.
    argv = [os.fsdecode(arg) for arg in command(rg, pre, max_filesize, include)]
    launch = (sandbox or Sandbox()).command(argv, cwd, network=False)
    try:
        proc = await trio.lowlevel.open_process(
            launch.argv,
            cwd=cwd,
            env=launch.env,
            start_new_session=True,  # its own process group, killed as one
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as error:
        return Run(b"", f"could not start {rg}: {error.strerror or error}")
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    out, err = bytearray(), bytearray()
    failure: str | None = None
    # Not reported to the ledger as bash's groups are: if the harness dies, the pipe has
    # no reader and ripgrep dies of SIGPIPE at its next write.
    try:
        with trio.move_on_after(TIMEOUT_SECONDS) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain, stderr, err, 64 * 1024)
                if not await _read_all(stdout, out, OUTPUT_CAP):
                    failure = "more output than it saves"
                    nursery.cancel_scope.cancel()
                else:
                    await proc.wait()
        if deadline.cancelled_caught:
            failure = f"timed out after {TIMEOUT_SECONDS:.0f} s"
    finally:
        with trio.CancelScope(shield=True):
            await kill_process_group(proc.pid)
            with trio.move_on_after(REAP_SECONDS):
                await proc.wait()
            await stdout.aclose()
            await stderr.aclose()
    if failure is None and not _whole_answer(proc.returncode, bytes(err)):
        failure = f"exit status {proc.returncode}: {bytes(err[:200]).decode(errors='replace')}"
    return Run(bytes(out), failure)


def counts(stdout: bytes) -> dict[str, int]:
    """``--count --null`` output: relative path -> number of matching lines."""
    found: dict[str, int] = {}
    pos, end = 0, len(stdout)
    while pos < end:
        nul = stdout.index(b"\0", pos)
        newline = stdout.index(b"\n", nul)
        found[_relative(stdout[pos:nul])] = int(stdout[nul + 1 : newline])
        pos = newline + 1
    return found


def lines(stdout: bytes) -> dict[str, list[tuple[int, bytes]]]:
    """``--line-number --null`` output: relative path -> [(line number, line bytes)].

    A record is ``./path NUL number : line LF``; a path may hold a newline and a line a
    NUL, but a path holds no NUL and a line no newline, so each is read up to its end.
    """
    found: dict[str, list[tuple[int, bytes]]] = {}
    pos, end = 0, len(stdout)
    while pos < end:
        nul = stdout.index(b"\0", pos)
        colon = stdout.index(b":", nul)
        newline = stdout.find(b"\n", colon)
        if newline < 0:
            newline = end
        rel = _relative(stdout[pos:nul])
        number = int(stdout[nul + 1 : colon])
        found.setdefault(rel, []).append((number, stdout[colon + 1 : newline]))
        pos = newline + 1
    return found


def _relative(raw: bytes) -> str:
    # Searched as "." from the root, every path starts "./"; as a walk names it after that.
    return os.fsdecode(raw[2:] if raw.startswith(b"./") else raw)



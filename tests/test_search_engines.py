"""grep answers the same with ripgrep as with the Python scan, and ripgrep stays harmless.

Every grep case runs on both engines (``HARNESS_RIPGREP=0`` forces the Python scan) over
one fixture tree that holds what the two could disagree on: ignored and hidden paths, a
.gitignore, binary files by NUL and by control characters, a NUL past the binary test's
head, a name and a line that are not UTF-8, CRLF and byte-order marks, a file over the
size limit, links in and out of the workspace, an ``.env`` the rules keep out, equal
modification times and more matches than are shown.
"""

from __future__ import annotations

import os
import re
import shutil
import string
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from procs import live_processes

from harness.permissions.ruleset import DEFAULT_RULES, decide
from harness.tools import ripgrep
from harness.tools.base import ToolContext
from harness.tools.glob import GlobParams, GlobTool, list_tree, walk_files
from harness.tools.grep import GrepParams, GrepTool

if TYPE_CHECKING:
    from conftest import ToolContextFactory

needs_rg = pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")
ENGINES = ["python", pytest.param("ripgrep", marks=needs_rg)]


@pytest.fixture
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name: str = request.param
    if name == "python":
        monkeypatch.setenv(ripgrep.DISABLE_ENV, "0")
    else:
        monkeypatch.delenv(ripgrep.DISABLE_ENV, raising=False)
    return name


def _write(path: Path, data: bytes, when: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (when, when))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("needle outside\n")
    root = tmp_path / "work"
    t = 1_000_000.0
    _write(root / "src" / "app.py", b"import os\ndef needle_config():\n    return 1\n", t + 9)
    _write(root / "src" / "deep" / "view.ts", b"const needle = 1;\n// Needle\n", t + 8)
    _write(root / "notes.md", b"a needle here\nNEEDLE there\ncaf\xc3\xa9 needle\n", t + 7)
    _write(root / "same-a.txt", b"needle a\n", t + 5)  # equal times: ordered by name
    _write(root / "same-b.txt", b"needle b\n", t + 5)
    _write(root / ".hidden" / "h.txt", b"needle hidden\n", t + 4)
    _write(root / ".dotfile", b"needle dot\n", t + 4)
    _write(root / "build" / "out.js", b"needle built\n", t + 3)
    _write(root / ".gitignore", b"build/\n*.log\n", t)
    _write(root / "x.log", b"needle logged\n", t + 3)
    _write(root / ".git" / "config", b"needle git\n", t)
    _write(root / ".git" / "HEAD", b"ref: refs/heads/main\n", t)
    _write(root / "node_modules" / "m.js", b"needle module\n", t)
    _write(root / "__pycache__" / "c.txt", b"needle cache\n", t)
    _write(root / ".venv" / "v.txt", b"needle venv\n", t)
    _write(root / "lib" / "node_modules", b"needle file named like a pruned dir\n", t + 2)
    _write(root / "blob.bin", b"needle\0\0\0binary\n", t + 6)
    _write(root / "control.dat", b"needle\n" + bytes(range(1, 9)) * 40, t + 6)
    _write(root / "late-nul.txt", b"x" * 5000 + b"\nneedle after\0nul\n", t + 2)
    _write(root / "crlf.txt", b"needle crlf\r\nneedle\r\n", t + 2)
    _write(root / "bom8.txt", b"\xef\xbb\xbfneedle bom\n", t + 2)
    _write(root / "bom16.txt", "needle utf16\n".encode("utf-16"), t + 2)
    _write(root / "latin1.txt", b"caf\xe9 needle\n", t + 1)
    odd = Path(os.fsdecode(os.path.join(os.fsencode(root), b"bad\xffname.txt")))
    _write(odd, b"needle odd\n", t + 1)
    _write(root / "many.txt", b"needle many\n" * 150, t)
    _write(root / "huge.txt", b"needle\n" + b"x" * (5 * 1024 * 1024), t + 9)
    _write(root / ".env", b"needle=secret\n", t + 9)
    _write(root / "sub" / "prod.env", b"needle=secret\n", t + 9)
    (root / "inside-link.txt").symlink_to("notes.md")
    (root / "outside-link.txt").symlink_to(outside / "secret.txt")
    (root / "dir-link").symlink_to(outside)
    (root / "broken-link").symlink_to(root / "missing")
    return root.resolve()


@pytest.fixture
def ctx(tree: Path, tmp_path: Path, tool_context: ToolContextFactory) -> ToolContext:
    return tool_context(
        tree,
        output_dir=tmp_path / "tool-output",
        check=lambda permission, pattern: decide(permission, pattern, [DEFAULT_RULES])[0],
    )


CASES: list[dict[str, str]] = [
    {"pattern": "needle"},  # a literal: ripgrep's counts
    {"pattern": "NEEDLE"},
    {"pattern": r"\bneedle\b"},
    {"pattern": "(?i)needle"},
    {"pattern": "need(le|ful)"},
    {"pattern": "needle$"},  # CRLF: the \r is not part of the line
    {"pattern": "^needle"},  # a byte-order mark is part of the first line
    {"pattern": "café needle"},
    {"pattern": "caf. needle"},  # . matches what stood for an invalid byte
    {"pattern": r"\w+ = \d"},
    {"pattern": r"[a-z]+\("},  # no required literal: the Python scan
    {"pattern": "needle", "include": "*.py"},
    {"pattern": "needle", "include": "*.{ts,txt}"},
    {"pattern": "needle", "include": "src/**"},
    {"pattern": "needle", "path": "src"},
    {"pattern": "needle", "path": "node_modules"},  # pruned below the root, not as it
    {"pattern": "needle", "path": ".hidden"},
    {"pattern": "needle", "path": "notes.md"},
    {"pattern": "absent-literal"},
]


async def _grep(ctx: ToolContext, **args: str) -> tuple[str, dict[str, Any]]:
    out = await GrepTool().execute(GrepParams.model_validate(args), ctx)
    return out.output, out.metadata


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_grep_finds_what_the_file_rules_say(engine: str, ctx: ToolContext) -> None:
    output, meta = await _grep(ctx, pattern="needle")
    assert meta["engine"] == engine
    names = [n[:-1] for n in output.split("\n") if n.endswith(":") and not n.startswith(" ")]
    # Newest first, equal times by name; the first 100 lines only.
    assert names == [
        "src/app.py",
        "src/deep/view.ts",
        "inside-link.txt",  # a link is as new as what it points to
        "notes.md",
        "same-a.txt",
        "same-b.txt",
        ".dotfile",
        ".hidden/h.txt",
        "build/out.js",  # .gitignore is not grep's business
        "x.log",
        "bom8.txt",
        "crlf.txt",
        "late-nul.txt",
        "lib/node_modules",
        "bad\udcffname.txt",  # shown as bad\xffname.txt once it leaves the tool
        "latin1.txt",
        "many.txt",
    ]
    absent = ["blob.bin", "control.dat", "huge.txt", ".git/", "node_modules/m", "__pycache__"]
    absent += [".venv", "dir-link", "outside", "secret", "bom16"]
    for name in absent:
        assert name not in output
    assert "  Line 2: needle after\0nul" in output  # past the binary test's head
    assert "  Line 3: café needle" in output and "  Line 1: caf\ufffd needle" in output
    assert output.startswith(f"Found {meta['matches']} matches")
    assert meta["matches"] == 19 + 150 and "(Showing 100 of 169 matches." in output
    # .env, sub/prod.env and the link out; the broken link is not a file to count.
    assert output.endswith("(3 files skipped: not allowed by the read rules)")


@pytest.mark.parametrize("args", CASES, ids=[str(c) for c in CASES])
@needs_rg
async def test_both_engines_give_the_same_result(
    args: dict[str, str], ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ripgrep.DISABLE_ENV, "0")
    expected, expected_meta = await _grep(ctx, **args)
    monkeypatch.delenv(ripgrep.DISABLE_ENV)
    got, meta = await _grep(ctx, **args)
    assert got == expected
    assert {**meta, "engine": "python"} == expected_meta


@needs_rg
async def test_ripgrep_answers_every_pattern_with_a_literal(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback is for what ripgrep cannot do, not a silent default."""
    monkeypatch.delenv(ripgrep.DISABLE_ENV, raising=False)
    for args in CASES:
        _, meta = await _grep(ctx, **args)
        dir_search = (ctx.directory / args.get("path", ".")).is_dir()
        has_literal = ripgrep.prefilter(args["pattern"]) is not None
        assert meta["engine"] == ("ripgrep" if dir_search and has_literal else "python"), args


@needs_rg
async def test_names_with_a_newline_or_a_colon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "work"
    for name in ["new\nline.txt", "a:1:b.txt", "-e", "--pre=x"]:
        _write(root / name, b"x needle\nneedle: 2\n", 1.0)
    ctx = ToolContext("s", "m", "c", root.resolve(), tmp_path / "out", check=lambda p, a: "allow")
    for pattern in ["needle", "needle:"]:
        monkeypatch.setenv(ripgrep.DISABLE_ENV, "0")
        expected, _ = await _grep(ctx, pattern=pattern)
        monkeypatch.delenv(ripgrep.DISABLE_ENV)
        got, meta = await _grep(ctx, pattern=pattern)
        assert meta["engine"] == "ripgrep" and got == expected
        assert "new\nline.txt:" in got and "a:1:b.txt:" in got and "--pre=x:" in got


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_glob_lists_the_same_files_either_way(engine: str, ctx: ToolContext) -> None:
    out = await GlobTool().execute(GlobParams(pattern="**/*"), ctx)
    listed = set(out.output.split("\n"))
    walked = {rel for rel, _ in walk_files(ctx.directory)}
    assert len(listed) == 100 or listed == walked
    assert {f.rel for f in list_tree(ctx.directory)} == walked
    assert "inside-link.txt" in walked and "broken-link" in walked and "dir-link" not in walked


def test_prefilter_reads_the_required_literal() -> None:
    assert ripgrep.prefilter("needle") == ripgrep.Prefilter("needle", exact=True)
    assert ripgrep.prefilter(r"def \w+\(") == ripgrep.Prefilter(r"def\x{20}", exact=False)
    assert ripgrep.prefilter("foo|bar") == ripgrep.Prefilter("bar|foo", exact=False)
    assert ripgrep.prefilter("(?i)ok") == ripgrep.Prefilter("[oO][kK\\x{212A}]", exact=False)
    for none in [r"\w+", "a*", "(a|)b*", "(?i)é", "a\\nb", "\ufffd", "x|y*"]:
        assert ripgrep.prefilter(none) is None, none


def test_case_folds_are_the_ones_python_makes() -> None:
    """Every character re.IGNORECASE matches for an ASCII letter is in the prefilter's class.

    The basic plane only, to stay quick: no character beyond it folds to ASCII (checked once
    over all of Unicode through lower(), upper() and casefold())."""
    for letter in string.ascii_lowercase:
        regex = re.compile(letter, re.IGNORECASE)
        found = {
            chr(code)
            for code in range(0x80, 0x10000)
            if not 0xD800 <= code <= 0xDFFF and regex.fullmatch(chr(code))
        }
        assert found == set(ripgrep._EXTRA_FOLDS.get(letter, "")), letter


# --- a hostile pattern ---------------------------------------------------------------


@needs_rg
async def test_a_pattern_or_include_never_becomes_a_ripgrep_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ripgrep.DISABLE_ENV, raising=False)
    root = tmp_path / "work"
    root.mkdir()
    marker = tmp_path / "ran"
    evil = root / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\ncat \"$1\"\n")
    evil.chmod(0o755)
    (root / "a.txt").write_text("say --pre=./evil.sh here\n-z\n--files\n")
    ctx = ToolContext(
        "s", "m", "c", root.resolve(), tmp_path / "out",
        check=lambda p, pat: decide(p, pat, [DEFAULT_RULES])[0],
    )
    for pattern, include in [
        ("--pre=./evil.sh", None),
        ("--pre=./evil.sh", "--pre=./evil.sh"),
        ("-z", None),
        ("--files", "*.txt"),
        ("needle", "--pre=./evil.sh"),
    ]:
        args = {"pattern": pattern} | ({"include": include} if include else {})
        output, meta = await _grep(ctx, **args)
        assert meta["engine"] == "ripgrep"
        line = {"--pre=./evil.sh": 1, "-z": 2, "--files": 3}.get(pattern)
        if line is not None and include in (None, "*.txt"):
            assert f"a.txt:\n  Line {line}: " in output
        else:
            assert output == "No matches found"
    assert not marker.exists()
    pre = ripgrep.prefilter("--pre=sh")
    assert pre is not None
    argv = ripgrep.command("rg", pre, 1, "--pre=sh")
    assert argv[-4:] == [b"--regexp", b"\\x{2D}\\x{2D}pre\\x{3D}sh", b"--", b"."]
    assert not any(arg.startswith(b"--pre") for arg in argv)


# --- cancel and time limit -------------------------------------------------------------


def _stall_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """ripgrep's output is not read, so it fills the pipe and blocks mid-search: it is
    certainly running when the call is cancelled or times out."""

    async def never(stream: Any, into: bytearray, cap: int) -> bool:
        await trio.sleep_forever()
        return True

    monkeypatch.setattr(ripgrep, "_read_all", never)


def _big_tree(tmp_path: Path, marker: str) -> Path:
    root = tmp_path / "big"
    for i in range(20):
        _write(root / f"d{i}" / "f.txt", f"{marker} line\n".encode() * 20_000, 1.0)
    return root.resolve()


@needs_rg
async def test_a_cancelled_grep_leaves_no_ripgrep_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ripgrep.DISABLE_ENV, raising=False)
    marker = "cancelmarker8c1f"
    root = _big_tree(tmp_path, marker)
    ctx = ToolContext("s", "m", "c", root, tmp_path / "out", check=lambda p, pat: "allow")
    _stall_reading(monkeypatch)
    seen: dict[int, int] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(_grep, ctx, pattern=f"{marker} \\w+"))
            while not (seen := live_processes(marker)):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert seen and all(pgid == pid for pid, pgid in seen.items())  # its own group
    assert live_processes(marker) == {}


@needs_rg
async def test_ripgrep_past_its_time_limit_is_killed_and_python_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ripgrep.DISABLE_ENV, raising=False)
    marker = "timeoutmarker3b7d"
    root = _big_tree(tmp_path, marker)
    ctx = ToolContext("s", "m", "c", root, tmp_path / "out", check=lambda p, pat: "allow")
    _stall_reading(monkeypatch)
    monkeypatch.setattr(ripgrep, "TIMEOUT_SECONDS", 0.3)
    with trio.fail_after(20):
        _, meta = await _grep(ctx, pattern=f"{marker} l")
    assert meta["engine"] == "python" and meta["matches"] == 20 * 20_000
    assert live_processes(marker) == {}


@needs_rg
async def test_ripgrep_output_it_cannot_read_falls_back_to_python(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another ripgrep version printing records differently must not become a traceback."""
    monkeypatch.setenv(ripgrep.DISABLE_ENV, "0")
    expected, _ = await _grep(ctx, pattern="needle")
    monkeypatch.delenv(ripgrep.DISABLE_ENV)
    command = ripgrep.command

    def without_null(*args: Any) -> list[bytes]:
        return [arg for arg in command(*args) if arg != b"--null"]

    monkeypatch.setattr(ripgrep, "command", without_null)
    got, meta = await _grep(ctx, pattern="needle")
    assert meta["engine"] == "python" and got == expected

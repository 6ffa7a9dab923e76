"""The file tools (read, write, edit, glob, grep, list) against real files in tmp_path."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from harness.permissions.ruleset import DEFAULT_RULES, decide
from harness.tools.base import ToolContext, ToolFailure
from harness.tools.edit import EditParams, EditTool
from harness.tools.glob import GlobParams, GlobTool, compile_glob
from harness.tools.grep import GrepParams, GrepTool
from harness.tools.list import ListParams, ListTool
from harness.tools.paths import display_path, external_need, real_path, resolve_path
from harness.tools.read import ReadParams, ReadTool
from harness.tools.threads import run_file_change
from harness.tools.truncate import truncate_output
from harness.tools.write import WriteParams, WriteTool

if TYPE_CHECKING:
    from conftest import ToolContextFactory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work.resolve()


@pytest.fixture
def ctx(
    root: Path, tmp_path_factory: pytest.TempPathFactory, tool_context: ToolContextFactory
) -> ToolContext:
    return tool_context(
        root,
        output_dir=tmp_path_factory.mktemp("tool-output"),
        # The gate's answer under the default rules, as the executor gives it.
        check=lambda permission, pattern: decide(permission, pattern, [DEFAULT_RULES])[0],
    )


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))


# --- paths -----------------------------------------------------------------------------


def test_resolve_relative_absolute_and_home(
    root: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_path("a/b.txt", ctx) == root / "a" / "b.txt"
    assert resolve_path(str(root / "c.txt"), ctx) == root / "c.txt"
    monkeypatch.setenv("HOME", str(root))
    assert resolve_path("~/d.txt", ctx) == root / "d.txt"


def test_inside_path_needs_nothing(root: Path, ctx: ToolContext) -> None:
    (root / "sub").mkdir()
    path = resolve_path("sub/../sub/x.py", ctx)
    assert external_need(path, ctx) is None
    assert display_path(path, ctx) == "sub/x.py"
    assert display_path(root, ctx) == "."


def test_dotdot_escape_needs_external_directory(root: Path, ctx: ToolContext) -> None:
    outside = root.parent / "secret.txt"
    outside.write_text("x")
    path = resolve_path("../secret.txt", ctx)
    need = external_need(path, ctx)
    assert need is not None
    assert need.permission == "external_directory"
    assert need.pattern == need.always == f"{root.parent}/*"
    assert need.metadata == {"path": str(outside)}
    assert display_path(path, ctx) == str(outside)


def test_symlink_escape_needs_external_directory(root: Path, ctx: ToolContext) -> None:
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.txt").write_text("x")
    (root / "link").symlink_to(elsewhere)
    path = resolve_path("link/f.txt", ctx)
    assert path == elsewhere / "f.txt"
    need = external_need(path, ctx)
    assert need is not None
    assert need.pattern == f"{elsewhere}/*"
    # The target directory itself is its own containing directory.
    dir_need = external_need(resolve_path("link", ctx), ctx)
    assert dir_need is not None
    assert dir_need.pattern == f"{elsewhere}/*"


def test_real_path_answers_as_realpath(root: Path) -> None:
    """The kernel's resolution (``O_PATH``) and Python's agree on every kind of path:
    links relative and absolute, chained, ``..`` after a link, loops, missing parts,
    a file taken for a directory, doubled slashes, a pipe's /proc name."""
    elsewhere = root.parent / "away"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "f.txt").write_text("x")
    (root / "sub").mkdir()
    (root / "sub" / "g.txt").write_text("y")
    (root / "abs").symlink_to(elsewhere / "deep")
    (root / "rel").symlink_to("sub")
    (root / "chain").symlink_to("abs")
    (root / "file_link").symlink_to(elsewhere / "deep" / "f.txt")
    (root / "dangling").symlink_to("nowhere")
    (root / "loop_a").symlink_to("loop_b")
    (root / "loop_b").symlink_to("loop_a")
    names = [
        "", ".", "sub", "sub/", "sub/g.txt", "sub/../sub/g.txt", "abs", "abs/f.txt",
        "abs/..", "abs/../deep/f.txt", "rel/g.txt", "chain/f.txt", "chain/..",
        "file_link", "file_link/x", "dangling", "dangling/more", "loop_a", "loop_a/x",
        "missing", "missing/deeper/f.txt", "sub/g.txt/", "sub//g.txt", "../away/deep",
    ]
    for name in names:
        path = f"{root}/{name}"
        assert real_path(path) == os.path.realpath(path), name
    assert real_path("//" + str(root)[1:]) == os.path.realpath("//" + str(root)[1:])
    read_end, write_end = os.pipe()
    try:
        pipe = f"/proc/self/fd/{read_end}"
        assert real_path(pipe) == os.path.realpath(pipe)
    finally:
        os.close(read_end)
        os.close(write_end)
    with pytest.raises(ValueError):
        real_path(f"{root}/nul\0byte")


def test_read_permissions_order(root: Path, ctx: ToolContext) -> None:
    tool = ReadTool()
    inside = tool.permissions(ReadParams(path="a.txt"), ctx)
    assert [(n.permission, n.pattern, n.always) for n in inside] == [
        ("read", str(root / "a.txt"), str(root / "a.txt"))
    ]
    outside = tool.permissions(ReadParams(path="../b.txt"), ctx)
    assert [n.permission for n in outside] == ["external_directory", "read"]
    assert outside[1].pattern == str(root.parent / "b.txt")


# --- truncate --------------------------------------------------------------------------


def test_truncate_leaves_small_output_alone(tmp_path: Path) -> None:
    text = "a\nb\n"
    assert truncate_output(text, output_dir=tmp_path / "out", call_id="c1") == (text, {})
    assert not (tmp_path / "out").exists()


def test_truncate_by_lines_saves_full_text(tmp_path: Path) -> None:
    text = "".join(f"line {i}\n" for i in range(30))
    out, meta = truncate_output(text, output_dir=tmp_path / "out", call_id="c2", max_lines=10)
    saved = tmp_path / "out" / "c2.txt"
    assert meta == {"truncated": True, "output_path": str(saved)}
    assert saved.read_text() == text
    head, _, note = out.partition("\n\n")
    assert head.split("\n") == [f"line {i}" for i in range(10)]
    assert note.startswith("...20 lines truncated...")
    assert f"Full output saved to: {saved}" in out
    assert "read with offset/limit" in out


def test_truncate_by_bytes_cuts_on_line_boundary(tmp_path: Path) -> None:
    text = "\n".join("x" * 9 for _ in range(10))  # 10 bytes per line with its newline
    out, meta = truncate_output(text, output_dir=tmp_path, call_id="c3", max_bytes=35)
    assert meta["truncated"] is True
    assert out.split("\n\n")[0] == "\n".join(["x" * 9] * 3)
    assert "...7 lines truncated..." in out


def test_truncate_never_splits_utf8(tmp_path: Path) -> None:
    text = "é" * 100  # two bytes each, one line
    out, _ = truncate_output(text, output_dir=tmp_path, call_id="c4", max_bytes=11)
    assert out.split("\n\n")[0] == "é" * 5
    assert (tmp_path / "c4.txt").read_text() == text



@pytest.mark.parametrize(
    ("text", "fits"),
    [
        ("a\nb\nc", True),  # three lines, the last without a newline
        ("a\nb\nc\n", True),  # the same three lines
        ("a\nb\nc\nd", False),
        ("\n\n\n", True),  # three empty lines
        ("\n\n\n\n", False),
        ("é" * 5, True),  # 10 bytes: non-ASCII is sized in UTF-8, not in characters
        ("é" * 5 + "x", False),
    ],
)
def test_truncate_limits_are_exact(tmp_path: Path, text: str, fits: bool) -> None:
    # The size check counts lines and bytes without splitting: the edges must agree with
    # what the cut itself counts (3 lines, 10 bytes).
    out, meta = truncate_output(text, output_dir=tmp_path, call_id="c5", max_lines=3, max_bytes=10)
    assert (out, meta) == (text, {}) if fits else meta["truncated"] is True


# --- read ------------------------------------------------------------------------------


async def test_read_numbers_lines(root: Path, ctx: ToolContext) -> None:
    (root / "a.py").write_text("one\ntwo\r\nthree\n")
    out = await ReadTool().execute(ReadParams(path="a.py"), ctx)
    assert out.output == "     1\tone\n     2\ttwo\n     3\tthree\n\n(End of file - total 3 lines)"
    assert out.title == "read a.py"
    assert out.metadata["lines"] == 3
    (root / "empty.txt").write_text("")
    empty = await ReadTool().execute(ReadParams(path="empty.txt"), ctx)
    assert empty.output == "(End of file - total 0 lines)"


async def test_read_offset_limit_and_continue_hint(root: Path, ctx: ToolContext) -> None:
    (root / "a.txt").write_text("".join(f"l{i}\n" for i in range(1, 11)))
    out = await ReadTool().execute(ReadParams(path="a.txt", offset=3, limit=2), ctx)
    assert out.output.splitlines()[:2] == ["     3\tl3", "     4\tl4"]
    assert out.output.endswith("(File has more lines. Use offset=5 to continue.)")
    last = await ReadTool().execute(ReadParams(path="a.txt", offset=9), ctx)
    assert last.output.endswith("(End of file - total 10 lines)")
    with pytest.raises(ToolFailure, match="past the end"):
        await ReadTool().execute(ReadParams(path="a.txt", offset=50), ctx)


async def test_read_cuts_long_lines_and_caps_page(root: Path, ctx: ToolContext) -> None:
    (root / "long.txt").write_text("y" * 5000 + "\n" + ("z" * 1000 + "\n") * 100)
    out = await ReadTool().execute(ReadParams(path="long.txt"), ctx)
    first = out.output.split("\n")[0]
    assert first == "     1\t" + "y" * 2000 + "... (line truncated to 2000 chars)"
    assert "Output capped at 50 KB" in out.output
    assert out.metadata["more"] is True
    assert "Use offset=" in out.output
    # The page and its footer fit the executor's limits, so it never truncates a read.
    _, extra = truncate_output(out.output, output_dir=ctx.output_dir, call_id="r")
    assert extra == {}


def test_read_page_in_memory_is_the_streamed_page() -> None:
    """The page of a file held in memory is the page streamed line by line: CRLF and
    lone CR line ends, non-ASCII and bad UTF-8, cut long lines, the byte cap."""
    import io

    from harness.tools.read import _PAGE_BYTES, MAX_LINE_CHARS, _page_of, _page_streamed

    wide = "é" * (MAX_LINE_CHARS + 5)
    files = [
        b"",
        b"one\ntwo\nthree",
        b"dos\r\nline\r\n\r\nend\r\r\n",
        b"a\rb\nc\r",
        "caf\u00e9\n\u65e5\u672c\nplain\n".encode(),
        b"bad \xff byte\n\xc3\n",
        ("x" * (MAX_LINE_CHARS + 1) + "\n" + wide + "\r\nshort\n").encode(),
        ("\n".join("\u00e9" * 900 for _ in range(_PAGE_BYTES // 1500))).encode(),
        ("\n".join("a" * 900 for _ in range(_PAGE_BYTES // 700))).encode(),
    ]
    for data in files:
        for offset, limit in ((1, 2000), (2, 3), (1, 1)):
            assert _page_of(data, offset, limit) == _page_streamed(
                io.BytesIO(data), offset, limit
            ), (data[:40], offset, limit)


async def test_read_default_page_fits_executor_limits(root: Path, ctx: ToolContext) -> None:
    (root / "many.txt").write_text("".join(f"{i}\n" for i in range(5000)))
    out = await ReadTool().execute(ReadParams(path="many.txt"), ctx)
    assert truncate_output(out.output, output_dir=ctx.output_dir, call_id="r")[1] == {}
    assert out.output.endswith(f"Use offset={out.metadata['lines'] + 1} to continue.)")


async def test_read_large_file_in_thread(root: Path, ctx: ToolContext) -> None:
    (root / "big.log").write_text("".join(f"row {i}\n" for i in range(200_000)))
    assert (root / "big.log").stat().st_size > 1024 * 1024
    out = await ReadTool().execute(ReadParams(path="big.log", offset=199_999), ctx)
    assert "199999\trow 199998" in out.output
    assert out.output.endswith("(End of file - total 200000 lines)")
    head = await ReadTool().execute(ReadParams(path="big.log", limit=5), ctx)
    assert head.metadata["total_lines"] == 200_000


async def test_read_directory(root: Path, ctx: ToolContext) -> None:
    (root / "b.txt").write_text("")
    (root / "a_dir").mkdir()
    (root / "c.txt").write_text("")
    out = await ReadTool().execute(ReadParams(path="."), ctx)
    assert out.output.split("\n")[:3] == ["a_dir/", "b.txt", "c.txt"]


async def test_read_refuses_binary(root: Path, ctx: ToolContext) -> None:
    (root / "img.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    with pytest.raises(ToolFailure, match="binary"):
        await ReadTool().execute(ReadParams(path="img.bin"), ctx)
    (root / "ctl.dat").write_bytes(bytes([1, 2, 3, 4, 5, 6, 65]) * 100)
    with pytest.raises(ToolFailure, match="binary"):
        await ReadTool().execute(ReadParams(path="ctl.dat"), ctx)
    (root / "utf8.txt").write_text("日本語のテキスト\n" * 50)
    out = await ReadTool().execute(ReadParams(path="utf8.txt"), ctx)
    assert "日本語" in out.output


async def test_read_missing_suggests_names(root: Path, ctx: ToolContext) -> None:
    (root / "config.py").write_text("")
    (root / "configs.yaml").write_text("")
    (root / "unrelated.md").write_text("")
    with pytest.raises(ToolFailure) as info:
        await ReadTool().execute(ReadParams(path="confg.py"), ctx)
    message = str(info.value)
    assert message.startswith("File not found: confg.py")
    assert "config.py" in message
    assert "unrelated.md" not in message


# --- write -----------------------------------------------------------------------------


async def test_write_creates_then_overwrites(root: Path, ctx: ToolContext) -> None:
    tool = WriteTool()
    out = await tool.execute(WriteParams(path="deep/new/f.txt", content="héllo\n"), ctx)
    assert (root / "deep/new/f.txt").read_text() == "héllo\n"
    assert out.output == "Created deep/new/f.txt (7 bytes)."
    again = await tool.execute(WriteParams(path="deep/new/f.txt", content="x"), ctx)
    assert again.output == "Overwrote deep/new/f.txt (1 bytes)."
    assert tool.read_only is False
    needs = tool.permissions(WriteParams(path="../out.txt", content=""), ctx)
    assert [n.permission for n in needs] == ["external_directory", "edit"]


async def test_write_to_directory_fails(root: Path, ctx: ToolContext) -> None:
    (root / "d").mkdir()
    with pytest.raises(ToolFailure, match="directory"):
        await WriteTool().execute(WriteParams(path="d", content="x"), ctx)


# --- edit ------------------------------------------------------------------------------


async def test_edit_exact_unique(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text("def f():\n    return 1\n")
    params = EditParams(path="m.py", old_string="return 1", new_string="return 2")
    out = await EditTool().execute(params, ctx)
    assert (root / "m.py").read_text() == "def f():\n    return 2\n"
    assert "1 replacement" in out.output
    assert "-    return 1" in out.metadata["diff"]
    assert "+    return 2" in out.metadata["diff"]
    needs = EditTool().permissions(params, ctx)
    assert [(n.permission, n.pattern) for n in needs] == [("edit", str(root / "m.py"))]


async def test_edit_ambiguous_and_replace_all(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text("x = 1\ny = x\nz = x\n")
    with pytest.raises(ToolFailure, match=r"matches 3 places.*replace_all"):
        await EditTool().execute(EditParams(path="m.py", old_string="x", new_string="w"), ctx)
    assert (root / "m.py").read_text() == "x = 1\ny = x\nz = x\n"
    out = await EditTool().execute(
        EditParams(path="m.py", old_string="x", new_string="w", replace_all=True), ctx
    )
    assert (root / "m.py").read_text() == "w = 1\ny = w\nz = w\n"
    assert "3 replacements" in out.output


async def test_edit_whitespace_tolerant_fallback(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text("class A:\n    def f(self):\n        return 1\n\nafter\n")
    params = EditParams(
        path="m.py",
        old_string="def f(self):\n    return 1",  # indentation lost when copied
        new_string="    def g(self):\n        return 2",
    )
    out = await EditTool().execute(params, ctx)
    assert (root / "m.py").read_text() == "class A:\n    def g(self):\n        return 2\n\nafter\n"
    assert out.metadata["fuzzy"] is True


async def test_edit_fallback_must_be_unique(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text("  a\n  b\nmid\n a \n b\n")
    params = EditParams(path="m.py", old_string="a\nb\n", new_string="c\n")
    with pytest.raises(ToolFailure, match="matches 2 places"):
        await EditTool().execute(params, ctx)
    await EditTool().execute(
        EditParams(path="m.py", old_string="a\nb\n", new_string="c\n", replace_all=True), ctx
    )
    assert (root / "m.py").read_text() == "c\nmid\nc\n"


async def test_edit_keeps_crlf(root: Path, ctx: ToolContext) -> None:
    (root / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    params = EditParams(path="w.txt", old_string="one\ntwo", new_string="1\n2")
    await EditTool().execute(params, ctx)
    assert (root / "w.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


async def test_edit_errors(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text("abc\n")
    with pytest.raises(ToolFailure, match="identical"):
        await EditTool().execute(EditParams(path="m.py", old_string="a", new_string="a"), ctx)
    with pytest.raises(ToolFailure, match=r"not found in m\.py"):
        await EditTool().execute(EditParams(path="m.py", old_string="zzz", new_string="y"), ctx)
    with pytest.raises(ToolFailure, match="File not found"):
        await EditTool().execute(EditParams(path="no.py", old_string="a", new_string="b"), ctx)
    with pytest.raises(ToolFailure, match="already exists"):
        await EditTool().execute(EditParams(path="m.py", old_string="", new_string="b"), ctx)


async def test_edit_empty_old_string_creates_file(root: Path, ctx: ToolContext) -> None:
    out = await EditTool().execute(
        EditParams(path="pkg/new.py", old_string="", new_string="print(1)\n"), ctx
    )
    assert (root / "pkg/new.py").read_text() == "print(1)\n"
    assert out.metadata["created"] is True


async def test_edit_diff_is_capped(root: Path, ctx: ToolContext) -> None:
    (root / "big.txt").write_text("".join(f"{i}\n" for i in range(500)))
    out = await EditTool().execute(
        EditParams(path="big.txt", old_string="0\n", new_string="", replace_all=True), ctx
    )
    diff_lines = out.metadata["diff"].splitlines()
    assert len(diff_lines) == 201
    assert diff_lines[-1].startswith("... (")


# --- glob ------------------------------------------------------------------------------


def test_compile_glob() -> None:
    assert compile_glob("*.py")("a/b/c.py")
    assert not compile_glob("*.py")("a/b/c.pyc")
    assert compile_glob("**/*.py")("c.py")
    assert compile_glob("src/**/*.{ts,tsx}")("src/x/y/z.tsx")
    assert not compile_glob("src/*.ts")("src/x/z.ts")
    assert compile_glob("file?.[ch]")("file1.c")
    assert compile_glob("[!a]*")("bcd")


async def test_glob_newest_first_skipping_ignored(root: Path, ctx: ToolContext) -> None:
    for i, name in enumerate(["a.py", "src/b.py", "src/deep/c.py", "notes.txt"]):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        set_mtime(path, 1_000_000 + i)
    for ignored in [".git", "node_modules/pkg", "__pycache__", ".venv/lib"]:
        (root / ignored).mkdir(parents=True)
        (root / ignored / "skip.py").write_text("")
    out = await GlobTool().execute(GlobParams(pattern="**/*.py"), ctx)
    assert out.output.split("\n") == ["src/deep/c.py", "src/b.py", "a.py"]
    sub = await GlobTool().execute(GlobParams(pattern="*.py", path="src"), ctx)
    assert sub.output.split("\n") == ["deep/c.py", "b.py"]
    none = await GlobTool().execute(GlobParams(pattern="*.rs"), ctx)
    assert none.output == "No files found"


async def test_glob_caps_results(root: Path, ctx: ToolContext) -> None:
    for i in range(120):
        (root / f"f{i:03}.txt").write_text("")
    out = await GlobTool().execute(GlobParams(pattern="*.txt"), ctx)
    lines = out.output.split("\n")
    assert len([line for line in lines if line.endswith(".txt")]) == 100
    assert "100 most recently modified of 120 files" in lines[-1]


async def test_glob_permissions(root: Path, ctx: ToolContext) -> None:
    tool = GlobTool()
    needs = tool.permissions(GlobParams(pattern="*.py", path="/"), ctx)
    assert [(n.permission, n.pattern) for n in needs] == [
        ("external_directory", "/*"),
        ("glob", "*.py"),
    ]
    with pytest.raises(ToolFailure, match="does not exist"):
        await tool.execute(GlobParams(pattern="*", path="missing"), ctx)


# --- grep ------------------------------------------------------------------------------


async def test_grep_groups_matches_by_file(root: Path, ctx: ToolContext) -> None:
    (root / "old.py").write_text("def alpha():\n    pass\n")
    (root / "pkg").mkdir()
    (root / "pkg/new.py").write_text("x = 1\ndef beta():\n")
    (root / "notes.md").write_text("def in markdown\n")
    (root / "blob.bin").write_bytes(b"def \0\0\0")
    set_mtime(root / "old.py", 1_000_000)
    set_mtime(root / "pkg/new.py", 2_000_000)
    out = await GrepTool().execute(GrepParams(pattern=r"def \w+\(", include="*.py"), ctx)
    assert out.output == (
        "Found 2 matches\n\npkg/new.py:\n  Line 2: def beta():\n\nold.py:\n  Line 1: def alpha():"
    )
    everything = await GrepTool().execute(GrepParams(pattern="def"), ctx)
    assert "notes.md:" in everything.output
    assert "blob.bin" not in everything.output


async def test_grep_include_braces_and_single_file(root: Path, ctx: ToolContext) -> None:
    for name in ["a.ts", "b.tsx", "c.js"]:
        (root / name).write_text("needle\n")
    out = await GrepTool().execute(GrepParams(pattern="needle", include="*.{ts,tsx}"), ctx)
    assert out.output.startswith("Found 2 matches")
    assert "c.js" not in out.output
    one = await GrepTool().execute(GrepParams(pattern="needle", path="c.js"), ctx)
    assert one.output == "Found 1 matches\n\nc.js:\n  Line 1: needle"


async def test_grep_caps_matches(root: Path, ctx: ToolContext) -> None:
    (root / "many.txt").write_text("hit\n" * 150)
    out = await GrepTool().execute(GrepParams(pattern="hit"), ctx)
    assert out.output.startswith("Found 150 matches")
    assert out.output.count("  Line ") == 100
    assert "Showing 100 of 150 matches" in out.output


async def test_grep_invalid_regex_and_no_match(root: Path, ctx: ToolContext) -> None:
    (root / "a.txt").write_text("text\n")
    with pytest.raises(ToolFailure, match=r"Invalid regex '\(unclosed': missing \)"):
        await GrepTool().execute(GrepParams(pattern="(unclosed"), ctx)
    out = await GrepTool().execute(GrepParams(pattern="absent"), ctx)
    assert out.output == "No matches found"
    needs = GrepTool().permissions(GrepParams(pattern="a+b"), ctx)
    assert [(n.permission, n.pattern) for n in needs] == [("grep", "a+b")]


# --- list ------------------------------------------------------------------------------


async def test_list_tree(root: Path, ctx: ToolContext) -> None:
    (root / "src/pkg").mkdir(parents=True)
    (root / "src/pkg/mod.py").write_text("")
    (root / "src/main.py").write_text("")
    (root / "README.md").write_text("")
    (root / "app.log").write_text("")
    for ignored in ["node_modules/x", ".git", "dist"]:
        (root / ignored).mkdir(parents=True)
    out = await ListTool().execute(ListParams(ignore=["*.log"]), ctx)
    assert out.output == "\n".join(
        [
            f"{root}/",
            "  src/",
            "    pkg/",
            "      mod.py",
            "    main.py",
            "  README.md",
        ]
    )
    assert out.title == "list ."


async def test_list_caps_entries(root: Path, ctx: ToolContext) -> None:
    (root / "zzz").mkdir()
    for i in range(60):
        (root / f"f{i:02}").write_text("")
        (root / "zzz" / f"g{i:02}").write_text("")
    out = await ListTool().execute(ListParams(), ctx)
    lines = out.output.split("\n")
    # Breadth first: every top-level entry survives the cap before nested ones.
    assert "  zzz/" in lines and "  f59" in lines
    assert sum(1 for line in lines if line.startswith("    g")) == 39
    assert "first 100 entries" in lines[-1]


async def test_list_errors_and_permissions(root: Path, ctx: ToolContext) -> None:
    (root / "f.txt").write_text("")
    with pytest.raises(ToolFailure, match="not a directory"):
        await ListTool().execute(ListParams(path="f.txt"), ctx)
    needs = ListTool().permissions(ListParams(path=".."), ctx)
    assert [(n.permission, n.pattern) for n in needs] == [
        ("external_directory", f"{root.parent}/*"),
        ("list", str(root.parent)),
    ]


# --- file changes off the event loop (harness/tools/threads.py) -------------------------


def test_write_leaves_the_event_loop_free_while_the_disk_blocks(
    root: Path, ctx: ToolContext
) -> None:
    # Opening a FIFO for writing blocks until a reader comes: a write done on the event
    # loop would stall every task, so the reader below (a task of the same loop) could
    # never start. The watchdog thread unblocks such a stuck write so the test fails
    # instead of hanging.
    fifo = root / "pipe"
    os.mkfifo(fifo)
    loop_free, fired = threading.Event(), threading.Event()

    def drain() -> bytes:
        with open(fifo, "rb") as pipe:
            return pipe.read()

    def watchdog() -> None:
        if not loop_free.wait(10):
            fired.set()
            drain()

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    read: list[bytes] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(WriteTool().execute, WriteParams(path="pipe", content="hi"), ctx)
            await trio.sleep(0.1)
            loop_free.set()
            if not fired.is_set():
                read.append(await trio.to_thread.run_sync(drain))

    trio.run(main)
    guard.join()
    assert not fired.is_set(), "the write blocked the event loop"
    assert read == [b"hi"]


def test_a_file_change_is_finished_even_when_the_call_is_cancelled(tmp_path: Path) -> None:
    target = tmp_path / "slow.txt"
    started = threading.Event()

    def slow_write() -> None:
        started.set()
        time.sleep(0.3)
        target.write_text("done")

    async def main() -> None:
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_file_change, slow_write)
                await trio.to_thread.run_sync(started.wait)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        # The cancel waited for the change: the file is complete the moment it returns.
        assert target.read_text() == "done"

    trio.run(main)

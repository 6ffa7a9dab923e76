"""The apply_patch tool against real files in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.tools.apply_patch import ApplyPatchParams, ApplyPatchTool, parse_patch
from harness.tools.base import ToolContext, ToolFailure, ToolOutput

if TYPE_CHECKING:
    from conftest import ToolContextFactory

tool = ApplyPatchTool()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work.resolve()


@pytest.fixture
def ctx(root: Path, tool_context: ToolContextFactory) -> ToolContext:
    return tool_context(root)


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


async def apply(text: str, ctx: ToolContext) -> ToolOutput:
    return await tool.execute(ApplyPatchParams(patch=text), ctx)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


APP = (
    "import os\n\n\ndef main():\n    print('hello')\n    return 0\n\n\n"
    "def helper():\n    return 1\n"
)


async def test_add_update_delete_across_three_files(root: Path, ctx: ToolContext) -> None:
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text(APP)
    (root / "old.py").write_text("gone\nsoon\n")
    out = await apply(
        patch(
            "*** Add File: docs/new.md",
            "+# New",
            "+",
            "+text",
            "*** Update File: src/app.py",
            "@@ def main():",
            "-    print('hello')",
            "+    print('hello, world')",
            "+    print('again')",
            "     return 0",
            "*** Delete File: old.py",
        ),
        ctx,
    )
    assert out.output == "Applied patch: A docs/new.md, M src/app.py, D old.py"
    assert (root / "docs" / "new.md").read_text() == "# New\n\ntext\n"
    assert (root / "src" / "app.py").read_text() == APP.replace(
        "    print('hello')\n", "    print('hello, world')\n    print('again')\n"
    )
    assert not (root / "old.py").exists()
    assert out.metadata["files"] == [
        {"path": "docs/new.md", "action": "add", "added": 3, "removed": 0},
        {"path": "src/app.py", "action": "update", "added": 2, "removed": 1},
        {"path": "old.py", "action": "delete", "added": 0, "removed": 2},
    ]
    assert "+    print('again')" in out.metadata["diff"]
    # No temporary files left behind.
    assert sorted(snapshot(root)) == ["docs/new.md", "src/app.py"]


async def test_failing_hunk_in_second_file_writes_nothing(root: Path, ctx: ToolContext) -> None:
    (root / "a.py").write_text("alpha = 1\nbeta = 2\n")
    (root / "b.py").write_text(APP)
    (root / "c.py").write_text("delete me\n")
    before = snapshot(root)
    text = patch(
        "*** Update File: a.py",
        "@@",
        "-alpha = 1",
        "+alpha = 10",
        " beta = 2",
        "*** Update File: b.py",
        "@@ def main():",
        "     print('hello')",
        "-    return 42",
        "+    return 43",
        "*** Delete File: c.py",
        "*** Add File: d.py",
        "+new",
    )
    with pytest.raises(ToolFailure) as caught:
        await apply(text, ctx)
    message = str(caught.value)
    assert "hunk 1 of b.py did not match" in message
    assert "     print('hello')\n    -    return 42" in message
    assert "Nothing was written" in message
    assert snapshot(root) == before


async def test_missing_header_context_is_named(root: Path, ctx: ToolContext) -> None:
    (root / "app.py").write_text(APP)
    with pytest.raises(ToolFailure, match=r"the context line '@@ def nowhere\(\):' was not found"):
        await apply(patch("*** Update File: app.py", "@@ def nowhere():", "-x", "+y"), ctx)


async def test_move_with_update(root: Path, ctx: ToolContext) -> None:
    source = root / "a.py"
    source.write_text("one\ntwo\nthree\n")
    source.chmod(0o755)
    out = await apply(
        patch(
            "*** Update File: a.py",
            "*** Move to: pkg/b.py",
            "@@",
            " one",
            "-two",
            "+TWO",
            " three",
        ),
        ctx,
    )
    assert out.output == "Applied patch: R a.py -> pkg/b.py"
    assert not source.exists()
    moved = root / "pkg" / "b.py"
    assert moved.read_text() == "one\nTWO\nthree\n"
    assert moved.stat().st_mode & 0o777 == 0o755
    assert out.metadata["files"] == [
        {"path": "a.py", "action": "move", "move_to": "pkg/b.py", "added": 1, "removed": 1}
    ]


async def test_pure_move(root: Path, ctx: ToolContext) -> None:
    (root / "a.txt").write_text("same\n")
    out = await apply(patch("*** Update File: a.txt", "*** Move to: b.txt"), ctx)
    assert out.output == "Applied patch: R a.txt -> b.txt"
    assert (root / "b.txt").read_text() == "same\n"
    assert not (root / "a.txt").exists()


async def test_whitespace_tolerant_context_keeps_the_files_indentation(
    root: Path, ctx: ToolContext
) -> None:
    (root / "app.py").write_text("def f():\n    x = 1\n    y = 2\n    return x + y\n")
    out = await apply(
        patch(
            "*** Update File: app.py",
            "@@",
            " def f():",
            "  x = 1  ",
            "-  y = 2",
            "+    y = 3",
            "   return x + y",
        ),
        ctx,
    )
    assert (root / "app.py").read_text() == "def f():\n    x = 1\n    y = 3\n    return x + y\n"
    assert "matched only with surrounding whitespace ignored" in out.output


async def test_hunks_apply_in_order_and_at_end_of_file(root: Path, ctx: ToolContext) -> None:
    (root / "f.txt").write_text("x\nend\nx\nend\n")
    await apply(
        patch(
            "*** Update File: f.txt",
            "@@",
            " x",
            "-end",
            "+first",
            "@@",
            " x",
            "-end",
            "+last",
            "*** End of File",
        ),
        ctx,
    )
    assert (root / "f.txt").read_text() == "x\nfirst\nx\nlast\n"


async def test_end_of_file_marker_prefers_the_last_match(root: Path, ctx: ToolContext) -> None:
    (root / "f.txt").write_text("a\nb\na\nb\n")
    await apply(patch("*** Update File: f.txt", "@@", " a", "-b", "+B", "*** End of File"), ctx)
    assert (root / "f.txt").read_text() == "a\nb\na\nB\n"


async def test_lenient_hunk_forms(root: Path, ctx: ToolContext) -> None:
    # No "@@" before the first hunk, an empty line for a blank context line, a unified-diff
    # style "@@ -1,4 +1,4 @@" line, and blank spacing lines before the next header.
    (root / "f.py").write_text("a = 1\n\nb = 2\nc = 3\n")
    (root / "g.py").write_text("x\n")
    await apply(
        patch(
            "*** Update File: f.py",
            " a = 1",
            "",
            "-b = 2",
            "+b = 20",
            "@@ -4,1 +4,1 @@",
            "-c = 3",
            "+c = 30",
            "",
            "",
            "*** Update File: g.py",
            "-x",
            "+y",
        ),
        ctx,
    )
    assert (root / "f.py").read_text() == "a = 1\n\nb = 20\nc = 30\n"
    assert (root / "g.py").read_text() == "y\n"


async def test_insertion_after_header_and_at_end(root: Path, ctx: ToolContext) -> None:
    (root / "f.py").write_text("class A:\n    pass\n")
    await apply(patch("*** Update File: f.py", "@@ class A:", "+    x = 1"), ctx)
    assert (root / "f.py").read_text() == "class A:\n    x = 1\n    pass\n"
    await apply(patch("*** Update File: f.py", "@@", "+# end"), ctx)
    assert (root / "f.py").read_text() == "class A:\n    x = 1\n    pass\n# end\n"


async def test_crlf_and_missing_final_newline_are_kept(root: Path, ctx: ToolContext) -> None:
    (root / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / "bare.txt").write_bytes(b"one\ntwo")
    await apply(
        patch(
            "*** Update File: win.txt",
            "-two",
            "+2",
            "*** Update File: bare.txt",
            "-two",
            "+2",
        ),
        ctx,
    )
    assert (root / "win.txt").read_bytes() == b"one\r\n2\r\n"
    assert (root / "bare.txt").read_bytes() == b"one\n2"


async def test_write_failure_leaves_everything_as_it_was(root: Path, ctx: ToolContext) -> None:
    (root / "a.txt").write_text("a\n")
    (root / "blocker").write_text("a file where a directory is needed\n")
    before = snapshot(root)
    text = patch(
        "*** Update File: a.txt", "-a", "+A", "*** Add File: newdir/x.txt", "+x",
        "*** Add File: blocker/y.txt", "+y",
    )  # fmt: skip
    with pytest.raises(ToolFailure, match=r"cannot write blocker/y.txt: .*Nothing was written"):
        await apply(text, ctx)
    assert snapshot(root) == before
    assert not (root / "newdir").exists()


@pytest.mark.parametrize(
    ("files", "body", "message"),
    [
        ({"a.py": "x\n"}, ["*** Add File: a.py", "+y"], "cannot add a.py: it already exists"),
        ({}, ["*** Delete File: nope.py"], "nope.py does not exist"),
        ({}, ["*** Update File: nope.py", "-a", "+b"], "nope.py does not exist"),
        (
            {"a.py": "x\n", "b.py": "y\n"},
            ["*** Update File: a.py", "*** Move to: b.py"],
            "cannot move a.py to b.py: it already exists",
        ),
        (
            {"a.py": "x\n"},
            ["*** Update File: a.py", "-x", "+y", "*** Delete File: a.py"],
            "a.py appears more than once",
        ),
        ({"d/f": "x\n"}, ["*** Delete File: d"], "d is a directory"),
    ],
)
async def test_file_checks(
    root: Path, ctx: ToolContext, files: dict[str, str], body: list[str], message: str
) -> None:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    before = snapshot(root)
    with pytest.raises(ToolFailure, match=message):
        await apply(patch(*body), ctx)
    assert snapshot(root) == before


async def test_binary_file_is_refused(root: Path, ctx: ToolContext) -> None:
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ToolFailure, match="not a UTF-8 text file"):
        await apply(patch("*** Update File: blob.bin", "-a", "+b"), ctx)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "must start with the line '\\*\\*\\* Begin Patch'"),
        ("*** Add File: a\n+x\n*** End Patch", "must start with"),
        ("*** Begin Patch\n*** Add File: a\n+x", "must end with the line"),
        ("*** Begin Patch\n*** End Patch", "changes no files"),
        ("*** Begin Patch\n*** Frobnicate: a\n*** End Patch", "Expected a file header at line 2"),
        ("*** Begin Patch\n*** Add File: a\nno plus\n*** End Patch", "does not start with '\\+'"),
        ("*** Begin Patch\n*** Update File: a\n*** End Patch", "has no hunks"),
        ("*** Begin Patch\n*** Update File: a\n@@\n~x\n*** End Patch", "should start with ' '"),
        ("*** Begin Patch\n*** Add File:   \n+x\n*** End Patch", "has no path"),
        ("*** Begin Patch\n*** Update File: a\n*** End of File\n*** End Patch", "before any hunk"),
    ],
)
async def test_malformed_envelope(text: str, message: str, ctx: ToolContext) -> None:
    with pytest.raises(ToolFailure, match=message):
        parse_patch(text)
    # The executor calls permissions() first: a malformed patch fails there, before any ask.
    with pytest.raises(ToolFailure, match=message):
        tool.permissions(ApplyPatchParams(patch=text), ctx)


def test_blank_lines_between_sections_are_spacing() -> None:
    ops = parse_patch(patch("*** Add File: a.txt", "+one", "+", "", "", "*** Delete File: b.txt"))
    assert ops[0].content == ["one", ""]
    assert ops[1].path == "b.txt"
    with pytest.raises(ToolFailure, match="does not start with"):
        parse_patch(patch("*** Add File: a.txt", "+one", "", "+two"))


def test_surrounding_whitespace_and_crlf_in_the_envelope_are_tolerated() -> None:
    text = "\n\r\n*** Begin Patch\r\n*** Delete File: a.py\r\n*** End Patch  \r\n\n"
    ops = parse_patch(text)
    assert [(op.action, op.path) for op in ops] == [("delete", "a.py")]


def test_permissions_ask_edit_per_path(root: Path, ctx: ToolContext) -> None:
    text = patch(
        "*** Add File: new.py",
        "+x",
        "*** Update File: a.py",
        "*** Move to: b.py",
        "*** Delete File: c.py",
    )
    needs = tool.permissions(ApplyPatchParams(patch=text), ctx)
    assert [(n.permission, n.pattern, n.always) for n in needs] == [
        ("edit", str(root / name), str(root / name)) for name in ("new.py", "a.py", "b.py", "c.py")
    ]


def test_path_escape_needs_external_directory(root: Path, ctx: ToolContext) -> None:
    outside = root.parent / "elsewhere"
    outside.mkdir()
    text = patch(
        "*** Add File: ../elsewhere/x.py",
        "+x",
        "*** Add File: ../elsewhere/y.py",
        "+y",
        "*** Add File: inside.py",
        "+z",
    )
    needs = tool.permissions(ApplyPatchParams(patch=text), ctx)
    assert [(n.permission, n.pattern) for n in needs] == [
        ("external_directory", f"{outside}/*"),
        ("edit", str(outside / "x.py")),
        ("edit", str(outside / "y.py")),
        ("edit", str(root / "inside.py")),
    ]


def test_symlink_out_of_the_directory_counts_as_outside(root: Path, ctx: ToolContext) -> None:
    outside = root.parent / "target"
    outside.mkdir()
    os.symlink(outside, root / "link")
    text = patch("*** Add File: link/x.py", "+x")
    needs = tool.permissions(ApplyPatchParams(patch=text), ctx)
    assert needs[0].permission == "external_directory"
    assert needs[1].pattern == str(outside / "x.py")


def test_title_names_the_first_file() -> None:
    text = patch("*** Delete File: a.py", "*** Delete File: b.py", "*** Delete File: c.py")
    assert tool.title(ApplyPatchParams(patch=text)) == "apply_patch a.py (+2 more)"
    assert tool.title(ApplyPatchParams(patch="garbage")) == "apply_patch"


async def test_header_may_be_indented_or_a_line_prefix(root: Path, ctx: ToolContext) -> None:
    (root / "m.py").write_text(
        "class A:\n    def run(self, x):\n        return x\n\n"
        "    def stop(self):\n        return 0\n"
    )
    out = await apply(
        patch(
            "*** Update File: m.py",
            "@@ def stop",
            "-        return 0",
            "+        return 1",
        ),
        ctx,
    )
    assert (root / "m.py").read_text().endswith("    def stop(self):\n        return 1\n")
    assert "whitespace ignored" not in out.output

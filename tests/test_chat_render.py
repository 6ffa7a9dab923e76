"""The chat's rendering pieces, on their own: blocks cut from a stream, the live tail, the
tool lines and the plain/rich choice."""

from __future__ import annotations

import re

import pytest

from harness.commands.chat.render import BlockSplitter, Renderer, tool_line, wants_plain
from harness.commands.chat.screen import live_tail


def test_blocks_end_at_blank_lines_outside_fences_whatever_the_chunks() -> None:
    text = "# Title\n\nSome *text*\nmore\n\n```py\nx = 1\n\ny = 2\n```\n\nlast"
    for size in (1, 3, 7, len(text)):
        splitter = BlockSplitter()
        blocks: list[str] = []
        for start in range(0, len(text), size):
            blocks += splitter.feed(text[start : start + size])
        blocks.append(splitter.flush())
        fenced = "```py\nx = 1\n\ny = 2\n```\n"
        assert blocks == ["# Title\n", "Some *text*\nmore\n", fenced, "last"]


def test_the_pending_tail_is_what_is_not_finished() -> None:
    splitter = BlockSplitter()
    assert splitter.feed("one\n\ntw") == ["one\n"]
    assert splitter.pending == "tw"


def test_the_live_tail_fits_its_rows() -> None:
    assert live_tail("a" * 25, 10, 2) == "a" * 15  # the last two wrapped rows
    assert live_tail("1\n2\n3\n4", 10, 2) == "3\n4"
    assert live_tail("short", 80, 12) == "short"
    long = "word " * 4000
    assert len(live_tail(long, 100, 12)) <= 1200


def test_tool_lines() -> None:
    running = {"tool": "bash", "state": {"status": "running", "title": "pytest -x"}}
    assert tool_line(running) == "→ bash pytest -x"
    read = {"tool": "read", "state": {"status": "running", "title": "read a.py"}}
    assert tool_line(read) == "→ read a.py"
    done = {
        "tool": "bash",
        "state": {"status": "completed", "output": "a\nb\nc", "metadata": {"exit": 1}},
    }
    assert tool_line(done) == "✓ bash (exit 1, 3 lines)"
    failed = {"tool": "edit", "state": {"status": "error", "error": "no match\ndetails"}}
    assert tool_line(failed) == "✗ edit: no match"
    assert tool_line({"tool": "bash", "state": {"status": "pending"}}) is None


@pytest.mark.parametrize(
    ("term", "no_color", "tty", "plain"),
    [
        ("xterm-256color", "", True, False),
        ("dumb", "", True, True),
        ("", "", True, True),
        ("xterm", "1", True, True),
        ("xterm", "", False, True),
    ],
)
def test_plain_when_the_terminal_cannot_or_should_not(
    term: str, no_color: str, tty: bool, plain: bool
) -> None:
    assert wants_plain(term, no_color, tty) is plain


def test_markdown_is_rendered_or_left_as_written() -> None:
    rich = Renderer(plain=False).markdown("some **bold** text", 80)
    assert "\x1b[1m" in rich and "**" not in rich
    assert Renderer(plain=True).markdown("some **bold** text\n", 80) == "some **bold** text"
    coloured = Renderer(plain=False).diff("--- a\n+++ b\n-old\n+new", 80)
    assert "\x1b[31m-old" in coloured and "\x1b[32m+new" in coloured


def test_control_characters_never_reach_the_terminal() -> None:
    from harness.commands.chat.render import clean, clean_data

    hostile = "ok\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\x9b31m\x7fend\ttab\nline"
    shown = clean(hostile)
    assert not any(c in shown for c in "\x1b\x07\r\x9b\x7f")
    assert shown == "ok^[]52;c;ZXZpbA==^G^[[2J^M\ufffd31m^?end\ttab\nline"
    data = clean_data({"state": {"title": "rm \x1b[8m", "n": 3}, "list": ["\x1b"]})
    assert data == {"state": {"title": "rm ^[[8m", "n": 3}, "list": ["^["]}
    # Rendered Markdown of cleaned text holds only the renderer's own escapes.
    rendered = Renderer(plain=False).markdown(clean("**x**\x1b]0;title\x07"), 80)
    assert "]0;title" in rendered and "\x07" not in rendered


def test_a_rendered_block_carries_no_blank_lines_of_its_own() -> None:
    for block in ("- one\n- two\n", "```py\nx = 1\n```\n", "## Title\n", "text\n"):
        lines = Renderer(plain=False).markdown(block, 60).split("\n")
        visible = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in lines]
        assert visible[0] and visible[-1], (block, lines)

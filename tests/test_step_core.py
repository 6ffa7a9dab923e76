"""The core of a step made cheaper, with its guarantees kept (issue 14, fifth pass).

The workspace root is resolved once a turn (not on every check), every call's target
still through every link; a tool's arguments are copied only as deeply as they need.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import Field

from harness.config import Config
from harness.messages.model import Rule, ToolCompleted, ToolError
from harness.messages.provider import ProviderRequest
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness
from harness.tools.base import ToolContext, ToolFailure, ToolParams, parse_arguments
from harness.tools.paths import display_path, external_need, is_inside, resolve_path

if TYPE_CHECKING:
    from conftest import ToolContextFactory, ToolParts


class SwapBeforeSecondRequest:
    """The scripted provider, which replaces the project by a link to ``outside`` just
    before the turn's second request: between two steps of one turn."""

    def __init__(self, inner: ScriptedProvider, project: Path, outside: Path) -> None:
        self._inner = inner
        self._project = project
        self._outside = outside
        self.requests = 0
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def stream(self, request: ProviderRequest) -> Any:
        self.requests += 1
        if self.requests == 2:
            self._project.rename(self._project.with_name("project.old"))
            self._project.symlink_to(self._outside, target_is_directory=True)
        return self._inner.stream(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_project_swapped_for_a_link_mid_turn_stays_the_boundary(
    tmp_path: Path, project: Path, tool_parts: ToolParts
) -> None:
    """The root resolved at the turn's start is the boundary for the whole turn: a read
    that reaches ``outside`` through the swapped link needs ``external_directory`` (asked,
    so refused without a terminal), where resolving the root again on each call would
    have taken ``outside`` for the workspace and read its secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET-5e1d\n")
    turns = [
        {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}, "id": "callOne"}]},
        {"tool_calls": [{"name": "read", "arguments": {"path": "secret.txt"}, "id": "callTwo"}]},
        {"text": "done"},
    ]
    provider = SwapBeforeSecondRequest(
        ScriptedProvider.from_turns(turns, record=True), project, outside
    )
    config = Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'unused-script.json'}",
        provider_factory=lambda model: provider,  # type: ignore[arg-type,return-value]
        interactive=False,
        # Reads allowed anywhere: only the workspace boundary stands in the way.
        rules=[Rule(permission="read", pattern="*", action="allow")],
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        result = await h.run(session.id, "read")
        assert provider.requests >= 2 and project.is_symlink()
        parts = tool_parts(h, session.id)
    first, second = parts
    assert isinstance(first.state, ToolCompleted) and "marker-7f3a" in first.state.output
    assert isinstance(second.state, ToolError), second.state
    assert "external_directory" in second.state.error
    assert "TOPSECRET" not in second.state.error
    assert result.reason == "denied"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    return root.resolve()


def test_root_given_by_the_turn_judges_as_a_fresh_resolution_does(
    work: Path, tmp_path: Path, tool_context: ToolContextFactory
) -> None:
    """The same answers with the turn's root as with one resolved on each call, for paths
    inside, outside, through a link, the root itself, and names that share its prefix."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / "link").symlink_to(elsewhere)
    (tmp_path / "work-sibling").mkdir()
    fresh = tool_context(work)
    cached = tool_context(work, root=os.path.realpath(work))
    for raw in [
        ".", "", "sub", "sub/../sub/x.py", "./sub/", "../work-sibling/f", "..", "link",
        "link/f.txt", str(work), str(work) + "/", "/", "/etc/passwd", "~", "sub//x",
        # hostile: a prefix-sharing sibling named absolutely, out and back in, ".." after a
        # link (resolved from the link's target, so outside), padding the tool strips
        str(work) + "-sibling/f", "sub/../../work-sibling", "../work/sub", "link/../work",
        "  ../work-sibling/f  ", "sub/./../../work",
    ]:
        path = resolve_path(raw, cached)
        assert path == resolve_path(raw, fresh), raw
        # pathlib's own answer, what the string checks replaced.
        inside = path.is_relative_to(work)
        assert is_inside(path, cached) is is_inside(path, fresh) is inside, raw
        shown = (str(path.relative_to(work)) or ".") if inside else str(path)
        assert display_path(path, cached) == display_path(path, fresh) == shown, raw
        assert (external_need(path, cached) is None) is inside, raw


def test_a_workspace_at_the_filesystem_root(tool_context: ToolContextFactory) -> None:
    ctx = tool_context(Path("/"), root="/")
    assert is_inside(Path("/etc/passwd"), ctx)
    assert display_path(Path("/etc/passwd"), ctx) == "etc/passwd"
    assert display_path(Path("/"), ctx) == "."


class Nested(ToolParams):
    path: str
    items: list[list[int]] = Field(default_factory=list)


def test_arguments_parsed_never_share_what_the_ledger_keeps() -> None:
    """Flat arguments are copied shallowly, nested ones deeply: whatever the tool does
    with its parsed arguments, and whatever unknown ones are dropped, ``raw`` is intact."""
    raw: dict[str, Any] = {"path": "a", "items": [[1, 2]], "extra": {"deep": [1]}}
    args, ignored = parse_arguments(Nested, raw)
    assert ignored == ["extra"]
    args.items[0].append(3)
    assert raw == {"path": "a", "items": [[1, 2]], "extra": {"deep": [1]}}
    flat: dict[str, Any] = {"path": "b", "unknown": 1}
    args, ignored = parse_arguments(Nested, flat)
    assert (args.path, ignored) == ("b", ["unknown"])
    assert flat == {"path": "b", "unknown": 1}


def test_tool_context_root_defaults_to_a_fresh_resolution(
    tmp_path: Path, tool_context: ToolContextFactory
) -> None:
    """A context without the turn's root (a tool run on its own) resolves the directory
    on each use, so a symlinked directory given to it is judged by its target."""
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "alias"
    link.symlink_to(target)
    ctx: ToolContext = tool_context(link)
    assert ctx.root is None
    assert is_inside(resolve_path("f.txt", ctx), ctx)
    assert display_path(resolve_path("f.txt", ctx), ctx) == "f.txt"


# A line of every kind the page must number the same way whichever path reads it.
_LINES = [
    b"plain",
    b"",
    b"crlf\r",
    b"two cr\r\r",
    b"caf\xc3\xa9 \xe2\x82\xac",
    b"bad \xff byte",
    b"cut sequence \xe2\x82",
    b"\xf0\x9f\x98",
    b"x" * 2500,
    ("é" * 2100).encode(),
    b"tab\tand \x0bvt",
]


@pytest.mark.parametrize("ending", [b"", b"\n"])
def test_a_page_read_from_memory_is_the_streamed_page(tmp_path: Path, ending: bytes) -> None:
    """Files up to 1 MB are paged from one read; the page, the line count and the cap are
    those of the line-by-line reading larger files take, for every offset and limit."""
    import io
    import random

    from harness.tools.read import _page_of, _page_streamed, _paged

    chooser = random.Random(14)
    files = [b"", b"\n", b"\n\n", b"one", b"\r\n"]
    for size in (3, 17, 40):
        files.append(b"\n".join(chooser.choice(_LINES) for _ in range(size)) + ending)
    # Long enough for the 50 KB cap to cut the page before the line limit.
    files.append(b"\n".join([b"y" * 900] * 120) + ending)
    files.append(b"\n".join([("ü" * 450).encode()] * 120) + ending)
    for data in files:
        total_lines = data.count(b"\n") + 2
        for offset in sorted({1, 2, 3, total_lines // 2 or 1, total_lines - 1, total_lines, 99}):
            for limit in (1, 2, 5, 2000):
                if offset < 1:
                    continue
                streamed = _page_streamed(io.BytesIO(data), offset, limit)
                assert _page_of(data, offset, limit) == streamed, (data[:40], offset, limit)
                try:
                    expected: object = _paged(*streamed, offset)
                except ToolFailure as error:  # the same failure both ways
                    expected = str(error)
                try:
                    got: object = _paged(*_page_of(data, offset, limit), offset)
                except ToolFailure as error:
                    got = str(error)
                assert got == expected


async def test_read_pages_files_the_size_does_not_describe(
    tmp_path: Path, tool_context: ToolContextFactory
) -> None:
    """A file whose size says 0 (a /proc file) is read to its end; a device that never
    ends is refused on its binary sample, as before the one-read paging."""
    from harness.tools.read import ReadParams, ReadTool

    ctx = tool_context(tmp_path, check=lambda permission, pattern: "allow")
    status = await ReadTool().execute(ReadParams(path="/proc/self/status"), ctx)
    assert "Pid:" in status.output and status.metadata["total_lines"] > 5
    with pytest.raises(ToolFailure, match="binary"):
        await ReadTool().execute(ReadParams(path="/dev/zero"), ctx)
    small = tmp_path / "small.txt"
    small.write_text("a\nb")
    page = await ReadTool().execute(ReadParams(path="small.txt"), ctx)
    assert page.output == "     1\ta\n     2\tb\n\n(End of file - total 2 lines)"


def test_wildcard_match_without_a_regex_answers_as_the_regex() -> None:
    """Plain names and ``*`` are answered by comparison; the regex agrees on every one."""
    from harness.permissions.wildcard import _compile, match

    patterns = ["*", "read", "", "bash", "git status", "git status *", "a?c", "/x/*", ".", "a.b"]
    texts = ["", "read", "reads", "bash", "git status", "git status -s", "abc", "/x/y", "x",
             "a.b", "axb", "line\nbreak", "*", "?"]
    for pattern in patterns:
        for text in texts:
            expected = _compile(pattern).fullmatch(text) is not None
            assert match(pattern, text) is expected, (pattern, text)

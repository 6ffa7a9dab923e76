"""A file name that is not UTF-8 (issue 12, item 11), through every file tool of the real
loop: the names are carried with ``surrogateescape`` on the filesystem side and shown with
``backslashreplace`` wherever they become text (results, ledger, events, API), so nothing
crashes and the model gets its listing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_loop import open_loop

from harness.messages.model import Rule, ToolCompleted

BAD = b"bad\xffname.txt"
SHOWN = "bad\\xffname.txt"  # how the model sees it, and may send it back


@pytest.fixture
def odd_project(project: Path) -> Path:
    with open(os.path.join(os.fsencode(project), BAD), "wb") as handle:
        handle.write(b"hello marker-odd\n")
    os.mkdir(os.path.join(os.fsencode(project), b"dir\xfe"))
    return project


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def test_a_name_that_is_not_utf8_goes_through_every_file_tool(
    tmp_path: Path, odd_project: Path
) -> None:
    patch = (
        "*** Begin Patch\n"
        f"*** Update File: {SHOWN}\n"
        "@@\n"
        "-hello marker-odd\n"
        "+hello marker-patched\n"
        "*** End Patch"
    )
    turns = [
        call("list", path="."),
        call("glob", pattern="*.txt"),
        call("grep", pattern="marker-odd"),
        call("read", path=SHOWN),
        call("edit", path=SHOWN, old_string="hello", new_string="hi"),
        call("apply_patch", patch=patch.replace("hello marker-odd", "hi marker-odd").replace(
            "hello marker-patched", "hi marker-patched"
        )),
        call("write", path="dir\\xfe/new\\x80.txt", content="written\n"),
        call("read", path="dir\\xfe/new\\x80.txt"),
        {"text": "done"},
    ]
    rules = [Rule(permission="*", pattern="*", action="allow")]
    async with open_loop(tmp_path, odd_project, turns, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "look at the odd file")
        parts = await lp.tool_parts()
        events = [e.data for e in lp.h.ledger.events_after(0, limit=100_000)]
    assert (result.reason, result.answer) == ("answered", "done")
    states = {}
    for part in parts:
        assert isinstance(part.state, ToolCompleted), (part.tool, part.state)
        states.setdefault(part.tool, []).append(part.state.output)
    assert SHOWN in states["list"][0] and "dir\\xfe/" in states["list"][0]
    assert SHOWN in states["glob"][0]
    assert SHOWN in states["grep"][0] and "marker-odd" in states["grep"][0]
    assert "hello marker-odd" in states["read"][0]
    raw = os.fsencode(odd_project)
    assert Path(os.fsdecode(os.path.join(raw, BAD))).read_bytes() == b"hi marker-patched\n"
    written = Path(os.fsdecode(os.path.join(raw, b"dir\xfe", b"new\x80.txt")))
    assert written.read_bytes() == b"written\n"
    assert "written" in states["read"][1]
    # Every event is plain text: JSON without a lone surrogate anywhere.
    text = json.dumps(events, ensure_ascii=False)
    text.encode("utf-8")
    assert "\udcff" not in text


async def test_a_lone_surrogate_in_a_models_arguments_reaches_no_reader(
    tmp_path: Path, project: Path
) -> None:
    """JSON may escape a lone surrogate; the ledger cannot store one. A hostile model's
    call is recorded as shown, and the loop carries on."""
    raw = '{"path": "no\\ud800such.txt"}'
    turns = [{"tool_calls": [{"name": "read", "arguments": raw}]}, {"text": "done"}]
    async with open_loop(tmp_path, project, turns) as lp:
        result = await lp.h.run(lp.sid, "read it")
        [part] = await lp.tool_parts()
    assert (result.reason, result.answer) == ("answered", "done")
    assert part.state.input == {"path": "no\\ud800such.txt"}
    assert part.state.status == "error"

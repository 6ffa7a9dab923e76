"""grep opens only what read may open; glob and list never walk out of the workspace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import Config, open_harness
from harness.messages.model import Rule, ToolPart
from harness.permissions.ruleset import parse_rule_flag
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness

if TYPE_CHECKING:
    from conftest import ScriptedHarness, ToolParts

PASSWD = "root:x:0:0:root:/root:/bin/bash"
TOKEN = "TOKEN=tok-7c1e9a55d2b4f0"


def _workspace(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(PASSWD + "\n")
    (outside / "secret-dir").mkdir()
    (outside / "secret-dir" / "inner.txt").write_text(f"{PASSWD}\n{TOKEN}\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "passwd-link").symlink_to(outside / "passwd")
    (work / "dir-link").symlink_to(outside / "secret-dir")
    if Path("/etc/passwd").is_file():
        (work / "etc-link").symlink_to("/etc/passwd")
    (work / ".env").write_text(TOKEN + "\n")
    (work / "sub").mkdir()
    (work / "sub" / "prod.env").write_text(TOKEN + "\n")
    (work / "notes.txt").write_text("root: the notes are allowed\nTOKEN docs are allowed\n")
    return work


def _grep(pattern: str, **extra: Any) -> dict[str, Any]:
    return {"name": "grep", "arguments": {"pattern": pattern, **extra}}


def _outputs(h: Harness, session_id: str) -> list[str]:
    parts = [p for m in h.ledger.messages(session_id) for p in m.parts if isinstance(p, ToolPart)]
    outputs = []
    for part in parts:
        assert part.state.status == "completed", part.state
        outputs.append(part.state.output)  # type: ignore[union-attr]
    return outputs


DENY = [
    parse_rule_flag("external_directory", "deny"),
    parse_rule_flag("read:*.env", "deny"),
]
ALLOW = [
    parse_rule_flag("external_directory", "allow"),
    parse_rule_flag("read", "allow"),
]


@pytest.mark.parametrize("rules", [DENY, []], ids=["denied", "defaults"])
async def test_grep_skips_what_read_may_not_open(
    tmp_path: Path, rules: list[Rule], scripted_harness: ScriptedHarness
) -> None:
    work = _workspace(tmp_path)
    skipped = 4 if (work / "etc-link").exists() else 3  # 2 links out, .env and sub/prod.env
    turns = [{"tool_calls": [_grep("root:"), _grep("TOKEN")]}, {"text": "done"}]
    async with scripted_harness(turns, rules=rules) as (h, _):
        session = await h.create_session(work)
        result = await h.run(session.id, "find secrets")
        assert result.reason == "answered"
        root, token = _outputs(h, session.id)
    assert "notes.txt" in root and "root:x:0:0" not in root
    assert f"({skipped} files skipped: not allowed by the read rules)" in root
    assert "notes.txt" in token and "tok-7c1e9a55d2b4f0" not in token


@pytest.mark.parametrize("rules", [DENY, []], ids=["denied", "defaults"])
async def test_grep_of_one_named_file_needs_read_on_it(
    tmp_path: Path, rules: list[Rule], scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    work = _workspace(tmp_path)
    turns = [{"tool_calls": [_grep("TOKEN", path=".env")]}, {"text": "done"}]
    async with scripted_harness(turns, rules=rules) as (h, _):
        session = await h.create_session(work)
        result = await h.run(session.id, "find secrets")
        parts = tool_parts(h, session.id)
    assert result.reason == "denied"  # asked like read (rejected: no terminal) or denied
    (state,) = (p.state for p in parts)
    assert state.status == "error" and "read" in state.error
    assert "tok-7c1e9a55d2b4f0" not in state.error


async def test_a_search_the_user_approved_may_open_what_it_was_approved_for(
    tmp_path: Path,
) -> None:
    work = _workspace(tmp_path)
    outside = tmp_path / "outside"
    turns = [{"tool_calls": [_grep("root:", path=str(outside))]}, {"text": "done"}]
    provider = ScriptedProvider.from_turns(turns)
    config = Config(
        home=tmp_path / "home",
        model="scripted:x",
        provider_factory=lambda model: provider,
        interactive=True,  # asks wait for a reply through the API
        rules=[parse_rule_flag("read:*inner.txt", "deny")],
    )
    asked: list[str] = []
    async with open_harness(config) as h:
        session = await h.create_session(work)
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "look outside")
            async for event in events:
                if event.type == "permission.asked":
                    asked.append(event.data["permission"])
                    assert await h.reply_permission(event.data["id"], "once")
                elif event.type == "turn.finished":
                    reason = event.data["reason"]
                    break
        (output,) = _outputs(h, session.id)
    assert reason == "answered" and asked == ["external_directory"]
    # Approved once for outside/*: its files are read; a deny still holds within it.
    assert "passwd:" in output and "root:x:0:0" in output and "inner.txt" not in output
    assert "(1 file skipped: not allowed by the read rules)" in output


async def test_the_same_files_are_found_when_the_rules_allow_them(
    tmp_path: Path, scripted_harness: ScriptedHarness
) -> None:
    work = _workspace(tmp_path)
    turns = [{"tool_calls": [_grep("root:"), _grep("TOKEN")]}, {"text": "done"}]
    async with scripted_harness(turns, rules=ALLOW) as (h, _):
        session = await h.create_session(work)
        await h.run(session.id, "find")
        root, token = _outputs(h, session.id)
    assert "passwd-link:" in root and "root:x:0:0" in root and "skipped" not in root
    assert ".env:" in token and "sub/prod.env:" in token and "tok-7c1e9a55d2b4f0" in token


async def test_a_task_child_is_held_to_the_parents_rules(
    tmp_path: Path, scripted_harness: ScriptedHarness
) -> None:
    work = _workspace(tmp_path)
    turns = [
        {"tool_calls": [{"name": "task", "arguments": {"description": "d", "prompt": "dig"}}]},
        {"text": "parent done"},
    ]
    subtasks = {"dig": [{"tool_calls": [_grep("root:"), _grep("TOKEN")]}, {"text": "dug"}]}
    async with scripted_harness(turns, subtasks, rules=DENY) as (h, _):
        session = await h.create_session(work)
        result = await h.run(session.id, "delegate")
        assert result.reason == "answered"
        (child,) = h.ledger.children(session.id)
        root, token = _outputs(h, child.id)
    assert "notes.txt" in root and "root:x:0:0" not in root and "skipped" in root
    assert "notes.txt" in token and "tok-7c1e9a55d2b4f0" not in token


async def test_glob_and_list_never_follow_a_link_out_of_the_workspace(
    tmp_path: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    work = _workspace(tmp_path)
    turns = [
        {
            "tool_calls": [
                {"name": "glob", "arguments": {"pattern": "**/*"}},
                {"name": "list", "arguments": {}},
                _grep("TOKEN", path="dir-link"),
            ]
        },
        {"text": "done"},
    ]
    async with scripted_harness(turns, rules=DENY) as (h, _):
        session = await h.create_session(work)
        await h.run(session.id, "look")
        parts = tool_parts(h, session.id)
    glob, listing, into_link = (p.state for p in parts)
    assert glob.status == "completed" and listing.status == "completed"
    # Names inside the workspace are listed; nothing behind the directory link is.
    assert "notes.txt" in glob.output and "inner.txt" not in glob.output
    assert "dir-link/" in listing.output and "inner.txt" not in listing.output
    # Naming the link as the search root is a path outside: external_directory, denied.
    assert into_link.status == "error" and "external_directory" in into_link.error

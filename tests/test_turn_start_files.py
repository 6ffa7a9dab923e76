"""A turn's look at the project's files (issue 18, turn start): AGENTS.md, ``.git`` and
the skills folders from the session directory up, found without asking the filesystem
again what it answered before, and without a worker thread when there is no skill.

Real folders in temporary directories and the real loop with a scripted model. What is
remembered (a name a folder was seen without) holds only while the folder's stat is the
same and the folder was not changed just before the look (``RACY_NS``): these tests move
that bound to zero where they need a folder "old", and wait out the clock's tick before
changing it, as a user editing between two turns would.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from harness import project as project_files
from harness.actors import turn_builder
from harness.context.system import assemble_system
from harness.project import FolderLook
from harness.skills import has_skill_folders

if TYPE_CHECKING:
    from conftest import ScriptedHarness

TICK = 0.05  # longer than a kernel tick: a change after it moves the folder's ctime


@pytest.fixture
def trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders count as old at once (they were all made by this test, just now)."""
    monkeypatch.setattr(project_files, "RACY_NS", 0)
    monkeypatch.setattr(project_files, "_missing", {})
    time.sleep(TICK)


def _counting_lstat(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = os.lstat

    def counted(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(project_files.os, "lstat", counted)
    return seen


def test_a_name_seen_missing_is_not_looked_up_again_while_the_folder_holds_still(
    tmp_path: Path, trusted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = str(tmp_path)
    assert FolderLook().missing(folder, ("AGENTS.md", ".git"))
    lookups = _counting_lstat(monkeypatch)
    assert FolderLook().missing(folder, ("AGENTS.md", ".git"))
    assert lookups == []  # one stat of the folder, no look for either name
    # A file made in it moves the folder's stat: the name is looked up, and found.
    time.sleep(TICK)
    (tmp_path / "AGENTS.md").write_text("rule\n")
    assert not FolderLook().missing(folder, ("AGENTS.md",))
    assert lookups == [os.path.join(folder, "AGENTS.md")]


def test_a_folder_changed_just_before_the_look_is_not_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(project_files, "_missing", {})
    (tmp_path / "other").write_text("x")  # the folder changed now: within RACY_NS
    assert FolderLook().missing(str(tmp_path), ("AGENTS.md",))
    lookups = _counting_lstat(monkeypatch)
    assert FolderLook().missing(str(tmp_path), ("AGENTS.md",))
    assert lookups == [str(tmp_path / "AGENTS.md")]  # asked again: a second change in the
    # same clock tick would have left the folder's stat as it was


def test_an_existing_name_is_always_looked_at_again(
    tmp_path: Path, trusted: None
) -> None:
    # A link whose target appears later: the folder holding the link does not change.
    target = tmp_path / "elsewhere"
    target.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / ".harness").symlink_to(target)
    time.sleep(TICK)
    assert not has_skill_folders(str(project), FolderLook(), {"XDG_CONFIG_HOME": str(tmp_path)})
    (target / "skills").mkdir()
    assert has_skill_folders(str(project), FolderLook(), {"XDG_CONFIG_HOME": str(tmp_path)})


async def test_agents_md_written_between_two_looks_is_in_the_next_system_prompt(
    tmp_path: Path, trusted: None
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    await trio.sleep(TICK)
    blocks = await assemble_system("agent", repo / "src", home, FolderLook())
    assert [b.source for b in blocks] == ["agent", "environment"]
    again = await assemble_system("agent", repo / "src", home, FolderLook())
    assert [b.source for b in again] == ["agent", "environment"]
    await trio.sleep(TICK)
    (repo / "AGENTS.md").write_text("Use tabs.\n")
    (home / "AGENTS.md").write_text("Short answers.\n")
    blocks = await assemble_system("agent", repo / "src", home, FolderLook())
    assert [b.source for b in blocks][2:] == [
        f"AGENTS.md: {repo / 'AGENTS.md'}",
        f"global: {home / 'AGENTS.md'}",
    ]
    # Above the repository root nothing counts, remembered or not.
    (tmp_path / "AGENTS.md").write_text("outside\n")
    (repo / "AGENTS.md").unlink()
    blocks = await assemble_system("agent", repo / "src", home, FolderLook())
    assert [b.source for b in blocks][2:] == [f"global: {home / 'AGENTS.md'}"]


async def test_a_turn_without_skills_folders_makes_no_discovery_and_a_new_one_is_seen(
    tmp_path: Path,
    project: Path,
    trusted: None,
    scripted_harness: ScriptedHarness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    discoveries: list[Path] = []
    real = turn_builder.discover

    def counted(directory: Path, environ: Any = None) -> Any:
        discoveries.append(directory)
        return real(directory, environ)

    monkeypatch.setattr(turn_builder, "discover", counted)
    turns = [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    async with scripted_harness(turns) as (h, provider):
        session = await h.create_session(project)
        await h.run(session.id, "first")
        await h.run(session.id, "second")
        assert discoveries == []  # no skills folder: no read in a worker thread, twice
        await trio.sleep(TICK)
        skill = project / ".claude" / "skills" / "release"
        skill.mkdir(parents=True)
        (skill / "SKILL.md").write_text("---\nname: release\ndescription: Cut one\n---\nDo.\n")
        await h.run(session.id, "third")
    assert len(discoveries) == 1
    names = [[t.name for t in request.tools] for request in provider.requests]
    assert "skill" not in names[0] and "skill" not in names[1] and "skill" in names[2]


def test_a_script_file_is_parsed_once_while_it_holds_still_and_again_once_edited(
    tmp_path: Path, trusted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.providers import scripted

    monkeypatch.setattr(scripted, "_SCRIPTS", {})
    path = tmp_path / "model.json"
    path.write_text(json.dumps([{"text": "first"}]))
    time.sleep(TICK)
    parsed: list[Path] = []
    real = scripted._parse_script

    def counted(where: Path) -> Any:
        parsed.append(where)
        return real(where)

    monkeypatch.setattr(scripted, "_parse_script", counted)
    one = scripted.ScriptedProvider.from_file(path)
    two = scripted.ScriptedProvider.from_file(path)
    assert len(parsed) == 1 and one is not two and one.turns[0].text == "first"
    path.write_text(json.dumps([{"text": "second"}]))  # edited
    assert scripted.ScriptedProvider.from_file(path).turns[0].text == "second"
    assert len(parsed) == 2
    path.unlink()
    with pytest.raises(scripted.ScriptError, match="script not found"):
        scripted.ScriptedProvider.from_file(path)


def test_a_script_written_just_now_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.providers import scripted

    monkeypatch.setattr(scripted, "_SCRIPTS", {})
    path = tmp_path / "model.json"
    path.write_text(json.dumps([{"text": "first"}]))
    scripted.ScriptedProvider.from_file(path)
    assert scripted._SCRIPTS == {}  # within RACY_NS of its change: a second edit in the
    # same clock tick would leave its stat as it was

"""Skills (issue 15, item 6; DESIGN §12): the four folders, the skill tool, its permission.

Real folders in temporary directories, the real loop with a scripted model, and one real
``harness run``: discovery nearest first, a bad SKILL.md skipped with an event, the tool's
description and result, permission ``skill`` by name, and what a hostile model or
repository could try (``../`` names, names not listed, symlinks out of the project).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.messages.model import Rule
from harness.skills import discover


def _skill(folder: Path, name: str | None, description: str | None, body: str = "") -> Path:
    lines = ["---"]
    if name is not None:
        lines.append(f"name: {name}")
    if description is not None:
        lines.append(f"description: {description}")
    lines += ["---", body or f"Instructions of {name}."]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "SKILL.md"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "src").mkdir()
    return root


def _call(name: str, call_id: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "skill", "arguments": {"name": name}, "id": call_id}]}


def test_skills_from_each_folder_nearest_first(tmp_path: Path, repo: Path) -> None:
    _skill(repo / ".harness" / "skills" / "alpha", "alpha", "from .harness")
    _skill(repo / ".agents" / "skills" / "beta", "beta", "from .agents")
    _skill(repo / ".claude" / "skills" / "gamma", "gamma", "from .claude")
    _skill(tmp_path / "xdg" / "harness" / "skills" / "delta", "delta", "from the global folder")
    # Nearer than the repository root's: wins by name; the global one loses to any project's.
    _skill(repo / "src" / ".claude" / "skills" / "alpha", "alpha", "nearest alpha")
    _skill(tmp_path / "xdg" / "harness" / "skills" / "beta", "beta", "global beta")
    skills, problems = discover(repo / "src")
    assert problems == []
    assert [(s.name, s.description, s.scope) for s in skills] == [
        ("alpha", "nearest alpha", "project"),
        ("beta", "from .agents", "project"),
        ("delta", "from the global folder", "global"),
        ("gamma", "from .claude", "project"),
    ]
    assert skills[0].folder == str((repo / "src" / ".claude" / "skills" / "alpha").resolve())
    # Above the repository root nothing counts; outside one, only the directory's own.
    _skill(tmp_path / ".harness" / "skills" / "outer", "outer", "above the repository")
    assert "outer" not in {s.name for s in discover(repo / "src")[0]}
    assert "outer" in {s.name for s in discover(tmp_path)[0]}


async def test_the_skill_tool_lists_loads_and_refuses_by_the_list(
    repo: Path, scripted_harness: Any, tool_parts: Any
) -> None:
    _skill(
        repo / ".claude" / "skills" / "release",
        "release",
        '"Cut a release: bump, tag, changelog"',  # quoted: ': ' is YAML syntax
        "Run scripts/bump.sh first. marker-9e2",
    )
    (repo / ".claude" / "skills" / "release" / "scripts").mkdir()
    _skill(repo / ".agents" / "skills" / "lint", "lint", "Lint the code")
    turns = [
        _call("release", "callRel1"),
        _call("../release", "callDot1"),
        _call("nope", "callNope"),
        {"text": "done"},
    ]
    async with scripted_harness(turns) as (h, provider):
        session = await h.create_session(repo / "src")
        result = await h.run(session.id, "ship it")
        assert result.reason == "answered", result
        loaded, dotted, unknown = tool_parts(h, session.id)
        assert loaded.state.status == "completed", loaded.state
        assert "marker-9e2" in loaded.state.output
        folder = (repo / ".claude" / "skills" / "release").resolve()
        assert f"The skill's folder: {folder}" in loaded.state.output
        for refused, name in ((dotted, "../release"), (unknown, "nope")):
            assert refused.state.status == "error"
            assert f"unknown skill {name!r}; available skills: lint, release" in refused.state.error
        [spec] = [t for t in provider.requests[0].tools if t.name == "skill"]
        assert "- lint: Lint the code" in spec.description
        assert "- release: Cut a release: bump, tag, changelog" in spec.description
        # Allowed by default, decided per skill name.
        decided = [
            e.data for e in h.ledger.events_after(0, session_ids=[session.id], limit=1000)
            if e.type == "permission.decided"
        ]
        assert [(d["pattern"], d["allowed"]) for d in decided] == [
            ("release", True), ("../release", True), ("nope", True)
        ]


async def test_permission_skill_is_checked_by_name(
    repo: Path, scripted_harness: Any, tool_parts: Any
) -> None:
    _skill(repo / ".harness" / "skills" / "open", "open", "Anyone may load this")
    _skill(repo / ".harness" / "skills" / "secret", "secret", "Not for this model")
    turns = [_call("open", "callOpen"), _call("secret", "callSec1"), {"text": "never"}]
    rules = [Rule(permission="skill", pattern="secret", action="deny")]
    async with scripted_harness(turns, rules=rules) as (h, _):
        session = await h.create_session(repo)
        result = await h.run(session.id, "load them")
        assert result.reason == "denied", result
        opened, secret = tool_parts(h, session.id)
        assert opened.state.status == "completed"
        assert secret.state.status == "error" and "denies" in secret.state.error
        assert "Not for this model" not in json.dumps(secret.state.model_dump())


async def test_a_bad_skill_is_skipped_with_an_event_never_fatal(
    repo: Path, scripted_harness: Any, tmp_path: Path
) -> None:
    good = _skill(repo / ".harness" / "skills" / "good", "good", "Works")
    no_description = _skill(repo / ".harness" / "skills" / "half", "half", None)
    no_name = _skill(repo / ".agents" / "skills" / "anon", None, "No name")
    broken = repo / ".claude" / "skills" / "broken" / "SKILL.md"
    broken.parent.mkdir(parents=True)
    broken.write_text("---\nname: broken\ndescription: [unclosed\n---\nx\n")
    async with scripted_harness([{"text": "one"}, {"text": "two"}]) as (h, provider):
        session = await h.create_session(repo)
        assert (await h.run(session.id, "hi")).reason == "answered"
        assert (await h.run(session.id, "again")).reason == "answered"
        events = [
            e.data for e in h.ledger.events_after(0, session_ids=[session.id], limit=1000)
            if e.type == "skill.invalid"
        ]
        [spec] = [t for t in provider.requests[0].tools if t.name == "skill"]
    # Once per session and file, not once per turn.
    reasons = {Path(e["file"]).parent.name: e["reason"] for e in events}
    assert len(events) == 3 and set(reasons) == {"half", "anon", "broken"}, events
    assert "no 'description'" in reasons["half"] and "no 'name'" in reasons["anon"]
    assert "not valid YAML" in reasons["broken"]
    assert str(no_description) in {e["file"] for e in events}
    assert str(no_name) in {e["file"] for e in events}
    assert "- good: Works" in spec.description and "half" not in spec.description
    assert good.exists()
    log = (tmp_path / "home" / "logs" / "test.jsonl").read_text()
    assert "skill skipped" in log and "broken" in log


def test_symlinks_out_of_the_project_are_skipped_but_global_ones_are_the_users(
    tmp_path: Path, repo: Path
) -> None:
    outside = tmp_path / "elsewhere"
    _skill(outside / "stolen", "stolen", "Points out of the repository")
    _skill(outside / "mine", "mine", "The user's own, linked into the global folder")
    skills_dir = repo / ".harness" / "skills"
    skills_dir.mkdir(parents=True)
    (skills_dir / "stolen").symlink_to(outside / "stolen")
    _skill(skills_dir / "linked-file", "linked-file", "x")
    (skills_dir / "linked-file" / "SKILL.md").unlink()
    (skills_dir / "linked-file" / "SKILL.md").symlink_to(outside / "stolen" / "SKILL.md")
    inside = repo / "shared" / "inside"
    _skill(inside, "inside", "A link that stays in the repository")
    (skills_dir / "inside").symlink_to(inside)
    (skills_dir / "dangling").symlink_to(tmp_path / "no-such-folder")
    global_dir = tmp_path / "xdg" / "harness" / "skills"
    global_dir.mkdir(parents=True)
    (global_dir / "mine").symlink_to(outside / "mine")
    skills, problems = discover(repo)
    assert sorted(s.name for s in skills) == ["inside", "mine"]
    assert sorted(Path(p.file).parent.name for p in problems) == ["linked-file", "stolen"]
    assert all("resolves outside the project" in p.reason for p in problems)


def test_no_skills_no_skill_tool_and_a_real_run_loads_one(tmp_path: Path, repo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.update(
        HARNESS_HOME=str(tmp_path / "home"),
        HARNESS_SOCKET=str(tmp_path / "none.sock"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
    )
    script = tmp_path / "s.json"
    script.write_text(json.dumps([_call("deploy", "callDep1"), {"text": "deployed"}]))

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harness", "run", "--embedded", "--model", f"scripted:{script}",
             "--dir", str(repo / "src"), *extra, "go"],
            capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL,
        )

    bare = run("--show-request")
    assert bare.returncode == 0, bare.stderr
    assert "Load a skill" not in bare.stderr, "the tool is not offered"
    assert "unknown tool 'skill'" in json.dumps(
        _tool_outputs(env)
    )
    _skill(tmp_path / "xdg" / "harness" / "skills" / "deploy", "deploy", "Deploy", "marker-d3")
    done = run()
    assert done.returncode == 0 and done.stdout.strip() == "deployed", done.stderr
    assert any("marker-d3" in output for output in _tool_outputs(env))


def _tool_outputs(env: dict[str, str]) -> list[str]:
    import sqlite3

    with sqlite3.connect(Path(env["HARNESS_HOME"]) / "ledger.db") as db:
        rows = db.execute("SELECT data FROM parts").fetchall()
    outputs = []
    for (text,) in rows:
        state = json.loads(text).get("state") or {}
        outputs.append(state.get("output") or state.get("error") or "")
    return outputs

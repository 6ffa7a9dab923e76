"""Custom agents and the decision's source (issue 15, items 3 and 4; DESIGN §11, §12).

Real files in temporary directories and real ``harness`` subprocesses: a rule from a
project file names that file in the ledger's decision; agents from ``[agents.NAME]``
tables and ``agents/NAME.md`` files, project over global, the table over the file, a
built-in agent changed field by field; ``--agent`` refusing what it cannot run; a
``task`` child restricted by its agent's ``tools`` and ``permission``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_runs import isolated_env as _env
from cli_runs import run_harness as _harness


def _script(path: Path, *turns: dict[str, Any], subtasks: dict[str, Any] | None = None) -> str:
    path.write_text(json.dumps({"turns": list(turns), "subtasks": subtasks or {}}))
    return f"scripted:{path}"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    work = repo / "src"
    work.mkdir(parents=True)
    return repo, work


def _trace(env: dict[str, str]) -> dict[str, Any]:
    listed = json.loads(_harness(env, "sessions", "--json").stdout)
    roots = [s for s in listed if s.get("parent_id") is None]
    assert len(roots) == 1, listed
    done = _harness(env, "trace", roots[0]["id"], "--json")
    assert done.returncode == 0, done.stderr
    trace: dict[str, Any] = json.loads(done.stdout)
    return trace


def _decisions(env: dict[str, str]) -> list[dict[str, Any]]:
    """Every permission.decided event of the ledger, read with sqlite3 (not harness)."""
    import sqlite3

    with sqlite3.connect(Path(env["HARNESS_HOME"]) / "ledger.db") as db:
        rows = db.execute("SELECT data FROM events WHERE type = 'permission.decided'")
        return [json.loads(row[0]) for row in rows]


def test_a_project_rule_denying_bash_names_its_file_in_the_decision(tmp_path: Path) -> None:
    repo, work = _repo(tmp_path)
    rules = '[permission]\nbash = { "*" = "allow", "rm *" = "deny" }\n'
    config = _write(repo / ".harness" / "config.toml", rules)
    victim = _write(work / "keep.txt", "data")
    call = {"tool_calls": [{"name": "bash", "arguments": {"command": "rm keep.txt"}}]}
    model = _script(tmp_path / "bash.json", call, {"text": "ran it"})
    env = _env(tmp_path)
    done = _harness(env, "run", "--embedded", "--model", model, "--dir", str(work), "go")
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and victim.exists()
    [decision] = [d for d in _decisions(env) if d["permission"] == "bash"]
    assert decision["allowed"] is False
    assert decision["rule"] == {
        "permission": "bash",
        "pattern": "rm *",
        "action": "deny",
        "source": str(config.resolve()),
    }
    [tool] = _trace(env)["steps"][0]["tools"]
    assert tool["permissions"][0]["file"] == str(config.resolve())


def test_through_the_daemon_the_decision_names_the_project_file(
    tmp_path: Path, socket_dir: Path
) -> None:
    from test_client import start_daemon, stop

    repo, work = _repo(tmp_path)
    config = _write(repo / ".harness" / "config.toml", '[permission]\nbash = { "rm *" = "deny" }\n')
    victim = _write(work / "keep.txt", "data")
    rm = {"tool_calls": [{"name": "bash", "arguments": {"command": "rm keep.txt"}}]}
    model = _script(tmp_path / "rm.json", rm, {"text": "removed"})
    env = _env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    daemon = start_daemon(env, tmp_path / "daemon.log")
    try:
        done = _harness(env, "run", "--model", model, "--dir", str(work), "clean up")
        assert done.returncode == 4, done.stderr
        assert victim.exists()
    finally:
        assert stop(daemon) == 0
    [decision] = [d for d in _decisions(env) if d["permission"] == "bash"]
    assert decision["rule"]["source"] == str(config.resolve())


# --- custom agents ---------------------------------------------------------------------


def test_table_file_global_and_built_in_merge_field_by_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness import global_catalog, project_catalog

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo, work = _repo(tmp_path)
    xdg = tmp_path / "xdg" / "harness"
    g_file = _write(
        xdg / "agents" / "review.md",
        "---\ndescription: from the global file\nmode: subagent\nsteps: 3\n"
        "permission:\n  bash: ask\n---\nThe global prompt.\n",
    )
    table = '[agents.review]\ndescription = "from the global table"\n'
    g_table = _write(xdg / "config.toml", table)
    p_file = _write(
        repo / ".harness" / "agents" / "review.md",
        "---\npermission:\n  edit: deny\ntools:\n  bash: false\n---\nThe project prompt.\n",
    )
    p_table = _write(
        repo / ".harness" / "config.toml",
        '[agents.review]\nsteps = 9\ntools = { bash = true, webfetch = false }\n'
        '[agents.plan]\ndescription = "our planner"\n'
        '[agents.build]\npermission = { bash = { "rm *" = "deny" } }\n',
    )
    base = global_catalog()
    assert base["review"].description == "from the global table", "table over file"
    assert base["review"].prompt == "The global prompt."
    agents = project_catalog(base, work)
    review = agents["review"]
    # Project over global, table over file, each field on its own.
    assert review.description == "from the global table"  # no project layer sets it
    assert review.prompt == "The project prompt."  # the project file's body
    assert (review.mode, review.steps) == ("subagent", 9)
    assert dict(review.tools) == {"bash": True, "webfetch": False}
    assert [(r.permission, r.action, r.source) for r in review.rules] == [
        ("bash", "ask", str(g_file.resolve())),
        ("edit", "deny", str(p_file.resolve())),
    ]
    assert str(g_table.resolve()) in review.source and str(p_table.resolve()) in review.source
    # A built-in agent keeps every field the files do not set.
    from harness.agents import AGENTS

    plan = agents["plan"]
    assert plan.description == "our planner"
    assert (plan.prompt, plan.rules, plan.mode) == (
        AGENTS["plan"].prompt,
        AGENTS["plan"].rules,
        "primary",
    )
    build = agents["build"]
    assert build.rules[-1].pattern == "rm *" and build.rules[-1].source == str(p_table.resolve())
    # Outside the repository the project level does not apply.
    assert project_catalog(base, tmp_path)["review"].prompt == "The global prompt."


def test_run_with_a_project_agent_uses_its_prompt_and_model(tmp_path: Path) -> None:
    repo, work = _repo(tmp_path)
    model = _script(tmp_path / "agent-model.json", {"text": "reviewed by the agent's model"})
    _write(
        repo / ".harness" / "agents" / "review.md",
        f"---\ndescription: Reviews a diff\nmode: primary\nmodel: {model}\n---\n"
        "You review code. marker-5c1d\n",
    )
    other = _script(tmp_path / "default.json", {"text": "default model"})
    env = _env(tmp_path)
    done = _harness(
        env, "run", "--embedded", "--show-request", "--agent", "review", "--dir", str(work), "go"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reviewed by the agent's model"
    assert "marker-5c1d" in done.stderr, "the agent's body is its system prompt"
    # A model named on the command line wins over the agent's.
    flagged = _harness(
        env, "run", "--embedded", "--agent", "review", "--model", other, "--dir", str(work), "go"
    )
    assert flagged.returncode == 0 and flagged.stdout.strip() == "default model", flagged.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("---\ndescription: [unclosed\n---\nbody\n", "not valid YAML"),
        ("---\ndescription: x\ntemperature: 0.2\n---\nbody\n", "temperature: unknown key"),
        ("---\nsteps: many\n---\nbody\n", "steps:"),
        ("---\nmode: boss\n---\nbody\n", "mode:"),
        ("---\n- a list\n---\nbody\n", "not a mapping"),
        ("---\ndescription: never closed\n", "never closed"),
    ],
)
def test_bad_front_matter_is_one_line_naming_the_file_and_exit_1(
    tmp_path: Path, text: str, message: str
) -> None:
    repo, work = _repo(tmp_path)
    bad = _write(repo / ".harness" / "agents" / "broken.md", text)
    model = _script(tmp_path / "m.json", {"text": "never"})
    done = _harness(_env(tmp_path), "run", "--model", model, "--dir", str(work), "go")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert str(bad.resolve()) in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_bad_global_agent_file_also_stops_a_run(tmp_path: Path) -> None:
    bad = _write(tmp_path / "xdg" / "harness" / "agents" / "x.md", "---\nsteps: 0\n---\n")
    model = _script(tmp_path / "m.json", {"text": "never"})
    done = _harness(_env(tmp_path), "run", "--model", model, "--dir", str(tmp_path), "go")
    assert done.returncode == 1 and str(bad) in done.stderr and "steps" in done.stderr
    assert "Traceback" not in done.stderr


def test_agent_flag_refuses_unknown_and_subagent_only_agents_listing_the_choices(
    tmp_path: Path,
) -> None:
    repo, work = _repo(tmp_path)
    _write(repo / ".harness" / "agents" / "helper.md", "---\nmode: subagent\n---\nHelp.\n")
    _write(repo / ".harness" / "agents" / "both.md", "---\ndescription: either way\n---\nHi.\n")
    model = _script(tmp_path / "m.json", {"text": "never"})
    env = _env(tmp_path)
    unknown = _harness(env, "run", "--agent", "nobody", "--model", model, "--dir", str(work), "x")
    assert unknown.returncode == 2, unknown.stderr
    assert "unknown agent 'nobody'" in unknown.stderr
    assert "primary agents: both, build, plan" in unknown.stderr, unknown.stderr
    helper = _harness(env, "run", "--agent", "helper", "--model", model, "--dir", str(work), "x")
    assert helper.returncode == 2, helper.stderr
    assert "'helper' is a subagent" in helper.stderr and "both, build, plan" in helper.stderr
    assert "Traceback" not in unknown.stderr + helper.stderr


async def test_an_agent_file_restricts_a_task_child(
    tmp_path: Path, scripted_harness: Any, tool_parts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo, work = _repo(tmp_path)
    agent_file = _write(
        repo / ".harness" / "agents" / "auditor.md",
        "---\ndescription: Audits files without touching them\nmode: subagent\n"
        "tools:\n  bash: false\npermission:\n  edit:\n    '*.txt': deny\n"
        "---\nYou audit. marker-a7\n",
    )
    task = {
        "name": "task",
        "arguments": {"description": "audit", "prompt": "audit it", "agent": "auditor"},
        "id": "callAud1",
    }
    bogus = {
        "name": "task",
        "arguments": {"description": "x", "prompt": "p", "agent": "../nobody"},
        "id": "callBog1",
    }
    child = [
        {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "x"}}]},
        {"text": "could not write"},
    ]
    turns = [{"tool_calls": [bogus]}, {"tool_calls": [task]}, {"text": "done"}]
    async with scripted_harness(turns, {"audit it": child}, agent_files=True) as (h, provider):
        session = await h.create_session(work)
        result = await h.run(session.id, "audit the project")
        assert result.reason == "answered", result
        [unknown, audited] = tool_parts(h, session.id)
        assert unknown.state.status == "error"
        assert "unknown agent '../nobody'" in unknown.state.error
        assert "available agents: auditor, general" in unknown.state.error
        # The denial stops the child, and its result says so.
        assert audited.state.status == "error" and "denied" in audited.state.error
        [kid] = h.ledger.children(session.id)
        assert kid.agent == "auditor"
        [write] = tool_parts(h, kid.id)
        assert write.state.status == "error" and "denies" in write.state.error
        assert not (work / "a.txt").exists()
        first = provider.requests[0]
        [task_spec] = [t for t in first.tools if t.name == "task"]
        assert "- auditor: Audits files without touching them" in task_spec.description
        assert "- general:" in task_spec.description and "- build:" not in task_spec.description
        [child_request] = [r for r in provider.requests if r.session_id == kid.id][:1]
        names = {t.name for t in child_request.tools}
        assert "bash" not in names and "read" in names, names
        assert any("marker-a7" in block for block in child_request.system)
        decisions = [
            e.data for e in h.ledger.events_after(0, session_ids=[kid.id], limit=1000)
            if e.type == "permission.decided"
        ]
        assert decisions[-1]["rule"]["source"] == str(agent_file.resolve())


def test_daemon_reads_project_agents_at_session_creation(tmp_path: Path, socket_dir: Path) -> None:
    from test_client import start_daemon, stop

    from harness.client import ApiError, Client

    repo, work = _repo(tmp_path)
    model = _script(tmp_path / "r.json", {"text": "from review"})
    env = _env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    daemon = start_daemon(env, tmp_path / "daemon.log")
    try:
        client = Client(Path(env["HARNESS_SOCKET"]))
        # Written after the daemon started: read when the session is created.
        _write(
            repo / ".harness" / "agents" / "review.md",
            f"---\nmode: primary\nmodel: {model}\n---\nReview.\n",
        )
        done = _harness(env, "run", "--agent", "review", "--dir", str(work), "go")
        assert done.returncode == 0 and done.stdout.strip() == "from review", done.stderr
        assert len(client.sessions()) == 1, "the run went through the daemon"
        bad = _write(repo / ".harness" / "agents" / "bad.md", "---\nsteps: [\n---\n")
        with pytest.raises(ApiError) as refused:
            client.create_session(directory=str(work))
        assert refused.value.status == 422 and str(bad.resolve()) in refused.value.message
    finally:
        assert stop(daemon) == 0


def test_daemon_refuses_to_start_on_a_bad_global_agent_file(
    tmp_path: Path, socket_dir: Path
) -> None:
    bad = _write(tmp_path / "xdg" / "harness" / "agents" / "x.md", "---\nsteps: x\n---\n")
    env = _env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    done = _harness(env, "serve")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert str(bad) in done.stderr and "steps" in done.stderr and "Traceback" not in done.stderr


def test_config_lists_agents_with_their_files_and_skills_with_the_skipped_ones(
    tmp_path: Path,
) -> None:
    repo, work = _repo(tmp_path)
    env = _env(tmp_path)
    global_file = _write(
        Path(env["XDG_CONFIG_HOME"]) / "harness" / "agents" / "reviewer.md",
        "---\ndescription: reviews\nmode: subagent\n---\nReview.\n",
    )
    project_file = _write(repo / ".harness" / "agents" / "reviewer.md", "---\nsteps: 3\n---\n")
    table = _write(repo / ".harness" / "config.toml", '[agents.tester]\ndescription = "tests"\n')
    skill = _write(
        repo / ".harness" / "skills" / "lint" / "SKILL.md",
        "---\nname: lint\ndescription: run the linter\n---\nbody\n",
    )
    broken = _write(repo / ".harness" / "skills" / "broken" / "SKILL.md", "no front matter\n")
    # A name a hostile file could choose, with a terminal escape: refused, and its reason
    # shown as text, never obeyed.
    odd = _write(repo / ".harness" / "skills" / "odd" / "SKILL.md",
           "---\nname: \"odd\\e[2J\"\ndescription: x\n---\n")

    shown = _harness(env, "config", "--dir", str(work), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["agents"] == {
        "reviewer": [str(global_file), str(project_file.resolve())],
        "tester": [str(table.resolve())],
    }
    assert report["skills"]["lint"] == str(skill.resolve())
    assert [p["file"] for p in report["skills_skipped"]] == [str(broken), str(odd)]

    text = _harness(env, "config", "--dir", str(work))
    assert text.returncode == 0, text.stderr
    assert f"agent reviewer  ({global_file}, {project_file.resolve()})" in text.stdout
    assert f"skill lint  ({skill.resolve()})" in text.stdout
    assert f"skill skipped: {broken}: " in text.stdout
    assert "\x1b" not in text.stdout

"""``--yes`` answers asks, never denials (DESIGN §8, §11; issue 11 item 7).

Embedded (Config.yes, the Permission actor) and through the daemon (the client answers
each ask of its session tree with "once"): a deny from the defaults, the agent, the flags
or a parent session stays a deny.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from test_client import daemon, env, harness  # noqa: F401 - fixtures

from harness.client import Client
from harness.config import Config
from harness.messages.model import Rule
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def _run(
    project: Path, home: Path, turns: list[dict[str, Any]], **config: Any
) -> tuple[str, list[dict[str, Any]]]:
    provider = ScriptedProvider.from_turns(turns, subtasks=config.pop("subtasks", None))
    cfg = Config(
        home=home,
        model=f"scripted:{home / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        **config,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        with trio.fail_after(20):
            result = await h.run(session.id, "go")
        events = h.ledger.events_after(0, limit=100_000)
    return result.reason, [e.data for e in events if e.type == "permission.decided"]


async def test_yes_allows_what_asks(tmp_path: Path, project: Path) -> None:
    turns = [_call("bash", command="touch made.txt"), _call("write", path="w.txt", content="x")]
    reason, decided = await _run(project, tmp_path / "home", [*turns, {"text": "ok"}], yes=True)
    assert reason == "answered"
    assert (project / "made.txt").exists() and (project / "w.txt").read_text() == "x"
    assert {d["source"] for d in decided} == {"yes"}


async def test_yes_never_lifts_the_plan_agents_denials(tmp_path: Path, project: Path) -> None:
    for i, turn in enumerate(
        [
            _call("write", path="plan.txt", content="x"),
            _call("edit", path="notes.txt", old="line one", new="changed"),
            _call("apply_patch", patch="*** Begin Patch\n*** Add File: p.txt\n+x\n*** End Patch"),
            _call("bash", command="touch plan.txt"),
        ]
    ):
        home = tmp_path / f"home-{i}"
        reason, _ = await _run(project, home, [turn, {"text": "done"}], agent="plan", yes=True)
        assert reason == "denied", turn
    assert not (project / "plan.txt").exists() and not (project / "p.txt").exists()
    assert "line one" in (project / "notes.txt").read_text()


async def test_yes_keeps_a_deny_rule_and_a_parent_sessions_deny(
    tmp_path: Path, project: Path
) -> None:
    (project / "victim.txt").write_text("keep")
    deny_rm = [Rule(permission="bash", pattern="rm *", action="deny")]
    turns = [_call("bash", command="X=rm; $X victim.txt"), {"text": "done"}]
    reason, decided = await _run(project, tmp_path / "h1", turns, yes=True, rules=deny_rm)
    assert reason == "denied" and (project / "victim.txt").exists()
    assert [d["source"] for d in decided if not d["allowed"]] == ["rule"]
    # In a child session too: its asks are answered, the deny still binds it.
    task = _call("task", description="child", prompt="child go")
    subtasks = {"child go": [_call("bash", command="rm victim.txt"), {"text": "child done"}]}
    reason, decided = await _run(
        project, tmp_path / "h2", [task, {"text": "done"}], yes=True, rules=deny_rm,
        subtasks=subtasks,
    )  # fmt: skip
    assert (project / "victim.txt").exists()
    assert any(d["source"] == "rule" and not d["allowed"] for d in decided)


# --- through the daemon ------------------------------------------------------------------------


def _script(tmp_path: Path, name: str, body: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return f"scripted:{path}"


def test_run_yes_through_the_daemon_answers_asks_of_the_whole_tree(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    project: Path,
    daemon: Client,  # noqa: F811
) -> None:
    model = _script(
        tmp_path,
        "tree.json",
        {
            "turns": [
                _call("bash", command="touch parent.txt"),
                _call("task", description="child", prompt="child go"),
                {"text": "all done"},
            ],
            "subtasks": {
                "child go": [_call("bash", command="touch child.txt"), {"text": "child done"}]
            },
        },
    )
    result = harness(env, "run", "--yes", "--model", model, "--dir", str(project), "go")
    assert result.returncode == 0, result.stderr
    assert (project / "parent.txt").exists() and (project / "child.txt").exists()
    assert [s for s in daemon.sessions() if s["model"] == model], "it ran through the daemon"
    # --yes is not a rule stored on the session: it was the client's answer.
    for session in daemon.sessions():
        assert session.get("permission", []) == []


def test_run_yes_through_the_daemon_never_lifts_a_deny(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    project: Path,
    daemon: Client,  # noqa: F811
) -> None:
    (project / "victim.txt").write_text("keep")
    plan = _script(tmp_path, "plan.json", [_call("write", path="plan.txt", content="x")])
    args = ("run", "--yes", "--model", plan, "--dir", str(project))
    result = harness(env, *args, "--agent", "plan", "go")
    assert result.returncode == 4, result.stderr  # denied
    assert not (project / "plan.txt").exists()
    rm = _script(tmp_path, "rm.json", [_call("bash", command="/bin/rm victim.txt")])
    args = ("run", "--yes", "--deny", "bash:rm *", "--model", rm, "--dir", str(project))
    result = harness(env, *args, "go")
    assert result.returncode == 4, result.stderr
    assert (project / "victim.txt").exists()
    assert len([s for s in daemon.sessions() if s["model"] in (plan, rm)]) == 2


def test_run_yes_embedded_never_lifts_the_plan_agents_deny(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    project: Path,
) -> None:
    plan = _script(tmp_path, "plan.json", [_call("write", path="plan.txt", content="x")])
    args = ("run", "--embedded", "--yes", "--agent", "plan", "--model", plan)
    result = harness(env, *args, "--dir", str(project), "go")
    assert result.returncode == 4, result.stderr
    assert not (project / "plan.txt").exists()

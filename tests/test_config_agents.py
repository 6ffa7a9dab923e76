"""Custom agents and the decision's source (issue 15, items 3 and 4; DESIGN §11, §12).

Real files in temporary directories and real ``harness`` subprocesses: a rule from a
project file names that file in the ledger's decision; agents from ``[agents.NAME]``
tables and ``agents/NAME.md`` files, project over global, the table over the file, a
built-in agent changed field by field; ``--agent`` refusing what it cannot run; a
``task`` child restricted by its agent's ``tools`` and ``permission``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(tmp_path / "no-daemon.sock")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


def _harness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


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

"""``harness run`` flags that used to make it refuse a running daemon (issue 12, item 4).

A real ``harness serve`` process and the CLI as a user runs it: ``--base-url``,
``--max-steps`` and rules with ``--session`` go through the daemon and do what they do
embedded; the lock message says who holds the ledger and what to do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from test_client import env as env  # the fixture, shared
from test_client import harness, start_daemon, stop
from wire_server import Reply, chunk, wire_server

from harness.client import Client


@pytest.fixture
def served(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Client, subprocess.Popen[bytes]]]:
    process = start_daemon(env, tmp_path / "daemon.log")
    yield Client(Path(env["HARNESS_SOCKET"])), process
    if process.poll() is None:
        assert stop(process) == 0


def _script(tmp_path: Path, turns: list[dict[str, Any]], name: str) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


READ = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
TOUCH = {"tool_calls": [{"name": "bash", "arguments": {"command": "touch made-it"}}]}


def test_max_steps_goes_through_the_daemon_and_limits_that_turn(
    env: dict[str, str], tmp_path: Path, project: Path, served: Any
) -> None:
    client, _ = served
    model = _script(tmp_path, [READ, READ, READ, READ, {"text": "done"}], "s.json")
    limited = harness(env, "run", "--model", model, "--dir", str(project), "--max-steps", "2", "go")
    assert limited.returncode == 3, limited.stderr
    assert "in use" not in limited.stderr
    assert "stopped (max_steps)" in limited.stderr
    (session,) = client.sessions()
    messages = client.messages(session["id"])
    user = [m["info"] for m in messages if m["info"]["role"] == "user"]
    assert user[0]["max_steps"] == 2, "the limit is recorded with the turn (a resume keeps it)"
    # The next turn of the same session takes 3 steps: max-steps was for one turn only.
    free = harness(env, "run", "--session", session["id"], "again")
    assert free.returncode == 0, free.stderr
    assert free.stdout.strip() == "done"


def test_rules_with_session_go_through_the_daemon_and_stay_with_the_session(
    env: dict[str, str], tmp_path: Path, project: Path, served: Any
) -> None:
    client, _ = served
    model = _script(tmp_path, [TOUCH, TOUCH, {"text": "touched"}], "t.json")
    first = harness(env, "run", "--model", model, "--dir", str(project), "touch it")
    assert first.returncode == 4 and "rejected" in first.stderr, first.stderr
    assert not (project / "made-it").exists()
    (session,) = client.sessions()
    again = harness(env, "run", "--session", session["id"], "--allow", "bash:touch *", "now")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "touched"
    assert (project / "made-it").exists()
    rules = client.session(session["id"])["permission"]
    assert {"permission": "bash", "pattern": "touch *", "action": "allow"} in rules
    bad = harness(env, "run", "--session", session["id"], "--allow", "bash:" + "x" * 5000, "hi")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_rules_with_session_embedded_are_kept_the_same_way(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    model = _script(tmp_path, [{"text": "one"}, {"text": "two"}], "e.json")
    assert harness(env, "run", "--model", model, "--dir", str(project), "hi").returncode == 0
    listed = json.loads(harness(env, "sessions", "--json").stdout)
    session_id = listed[0]["id"]
    again = harness(env, "run", "--session", session_id, "--deny", "edit", "hi")
    assert again.returncode == 0, again.stderr
    shown = json.loads(harness(env, "show", session_id, "--json").stdout)
    assert {"permission": "edit", "pattern": "*", "action": "deny"} in shown["session"][
        "permission"
    ]


def _answer(text: str) -> Reply:
    return Reply(events=[chunk(text), chunk(finish="stop")])


async def test_base_url_goes_through_the_daemon_to_that_server(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    process = await trio.to_thread.run_sync(start_daemon, env, tmp_path / "daemon.log")
    try:
        async with wire_server(_answer("from the wire")) as server:
            result = await trio.run_process(
                [sys.executable, "-m", "harness", "run", "--model", "openai/qwen2.5-coder",
                 "--base-url", server.url, "--dir", str(project), "hello"],
                capture_stdout=True, capture_stderr=True, check=False, env=env,
            )
            assert result.returncode == 0, result.stderr.decode()
            assert result.stdout.decode().strip() == "from the wire"
            assert len(server.requests) == 1, "the daemon called the server the flag named"
        client = Client(Path(env["HARNESS_SOCKET"]))
        (session,) = await trio.to_thread.run_sync(client.sessions)
        assert session["base_url"] == server.url
    finally:
        assert await trio.to_thread.run_sync(stop, process) == 0


# --- who holds the ledger ------------------------------------------------------------------


def test_the_lock_message_names_the_daemon_and_what_to_do(
    env: dict[str, str], tmp_path: Path, project: Path, served: Any
) -> None:
    _, process = served
    model = _script(tmp_path, [{"text": "hi"}], "l.json")
    result = harness(env, "run", "--embedded", "--model", model, "--dir", str(project), "hi")
    assert result.returncode == 1
    line = result.stderr.strip()
    assert f"the harness daemon (pid {process.pid}, socket {env['HARNESS_SOCKET']})" in line
    assert "without --embedded" not in line and "Traceback" not in line


def test_the_lock_message_names_another_embedded_run(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    slow = _script(tmp_path, [{"text": "slow", "delay": 30}], "slow.json")
    first = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "--model", slow, "--dir", str(project), "wait"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        lock = Path(env["HARNESS_HOME"]) / "ledger.db.lock"
        deadline = time.monotonic() + 15
        while not (lock.exists() and str(first.pid) in lock.read_text()):
            assert time.monotonic() < deadline, "the first run never took the ledger"
            time.sleep(0.05)
        second = harness(env, "run", "--model", slow, "--dir", str(project), "me too")
        assert second.returncode == 1
        line = second.stderr.strip()
        assert f"another `harness run` (pid {first.pid})" in line
        assert "wait for it to finish" in line
        assert "--embedded" not in line, "following that advice would fail the same way"
    finally:
        first.terminate()
        first.wait(timeout=15)


def test_rules_for_a_busy_session_are_refused_with_exit_1(
    env: dict[str, str], tmp_path: Path, project: Path, served: Any
) -> None:
    client, _ = served
    slow = _script(tmp_path, [{"text": "slow", "delay": 30}], "busy.json")
    session = client.create_session(directory=str(project), model=slow)
    client.prompt(session["id"], "wait")
    result = harness(env, "run", "--session", session["id"], "--allow", "edit", "more")
    assert result.returncode == 1 and "busy" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert client.session(session["id"])["permission"] == []
    client.cancel(session["id"])

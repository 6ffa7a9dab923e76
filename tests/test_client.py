"""The daemon as a user runs it: ``harness serve`` as a process, the CLI as a client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons import wait_for_daemon

from harness.client import Client


@pytest.fixture
def env(tmp_path: Path, socket_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(socket_dir / "h.sock")
    return env


def harness(
    env: dict[str, str], *args: str, stdin: str = "", python: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python, "-m", "harness", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def start_daemon(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "harness", "serve"], stderr=out, env=env)
    wait_for_daemon(process, Path(env["HARNESS_SOCKET"]), log)
    return process


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=15)


@pytest.fixture
def daemon(env: dict[str, str], tmp_path: Path) -> Iterator[Client]:
    process = start_daemon(env, tmp_path / "daemon.log")
    yield Client(Path(env["HARNESS_SOCKET"]))
    if process.poll() is None:
        assert stop(process) == 0


def _script(tmp_path: Path, turns: list[dict[str, Any]]) -> str:
    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.json"
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _log_lines(path: Path) -> list[dict[str, Any]]:
    # Every line of the daemon's stderr is one JSON object.
    return [json.loads(line) for line in path.read_text().splitlines()]


READ_THEN_ANSWER = [
    {"tool_calls": [{"name": "read", "arguments": {"path": "package.json"}}]},
    {"text": "It uses pnpm."},
]
TOUCH = [{"tool_calls": [{"name": "bash", "arguments": {"command": "touch made-it"}}]}]


@pytest.mark.parametrize(("turns", "code"), [(READ_THEN_ANSWER, 0), (TOUCH, 4)])
def test_run_through_the_daemon_prints_what_embedded_prints(
    env: dict[str, str], tmp_path: Path, project: Path, daemon: Client, turns: Any, code: int
) -> None:
    model = _script(tmp_path, turns)
    args = ("run", "--model", model, "--dir", str(project), "go")
    through = harness(env, *args)
    # Embedded on a home of its own: the daemon holds its ledger while it runs.
    alone = {**env, "HARNESS_HOME": str(tmp_path / "embedded-home")}
    embedded = harness(alone, *args, "--embedded")
    assert through.returncode == embedded.returncode == code, through.stderr
    assert through.stdout == embedded.stdout
    assert through.stderr == embedded.stderr
    assert not (project / "made-it").exists()
    served = [s for s in daemon.sessions() if s["model"] == model]
    assert len(served) == 1, "one session through the daemon (the other ran embedded)"
    # The records agree too: a call rejected for want of a terminal says so, with the flag.
    tools = [
        p for m in daemon.messages(served[0]["id"]) for p in m["parts"] if p["type"] == "tool"
    ]
    if code == 4:
        [rejected] = tools
        assert "there is no terminal to ask" in rejected["state"]["error"]
        assert "--allow 'bash:touch *'" in rejected["state"]["error"]
    requests = [line for line in _log_lines(tmp_path / "daemon.log") if line["event"] == "request"]
    assert any(r["path"].endswith("/prompt") and r["status"] == 202 for r in requests)


def test_run_json_and_usage_errors_through_the_daemon(
    env: dict[str, str], tmp_path: Path, project: Path, daemon: Client
) -> None:
    model = _script(tmp_path, [{"text": "hello", "chunks": 3}])
    result = harness(env, "run", "--json", "--model", model, "--dir", str(project), "hi")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-1]["type"] == "turn.finished" and events[-1]["data"]["answer"] == "hello"
    assert any(e["type"] == "part.delta" for e in events)
    for args, message in [
        (["run", "--model", "nope", "hi"], "unknown model"),
        (["run", "--session", "ses_missing", "hi"], "no session ses_missing"),
        (["run", "--agent", "nobody", "--model", model, "hi"], "nobody"),
    ]:
        refused = harness(env, *args)
        assert refused.returncode == 2, refused.stderr
        assert message in refused.stderr and "Traceback" not in refused.stderr


def test_sessions_show_and_events_through_the_daemon(
    env: dict[str, str], tmp_path: Path, project: Path, daemon: Client
) -> None:
    model = _script(tmp_path, READ_THEN_ANSWER)
    assert harness(env, "run", "--model", model, "--dir", str(project), "which pm?").returncode == 0
    listing = harness(env, "sessions")
    assert listing.returncode == 0 and "which pm?" in listing.stdout
    session_id = listing.stdout.splitlines()[1].split()[0]
    assert json.loads(harness(env, "sessions", "--json").stdout)[0]["id"] == session_id
    shown = harness(env, "show", session_id)
    assert "[read completed]" in shown.stdout and "It uses pnpm." in shown.stdout
    assert (
        json.loads(harness(env, "show", "--json", session_id).stdout)["session"]["id"] == session_id
    )
    missing = harness(env, "show", "ses_missing")
    assert missing.returncode == 2 and "no session ses_missing" in missing.stderr

    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "events",
            "--json",
            "--session",
            session_id,
            "--after",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert follower.stdout is not None
    seqs = []
    for line in follower.stdout:
        event = json.loads(line)
        seqs.append(event["seq"])
        if event["type"] == "turn.finished":
            break
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=10) == 130
    durable = [s for s in seqs if s is not None]
    assert durable == sorted(set(durable)) and durable[0] == 1


def test_sessions_and_help_import_no_heavy_module(env: dict[str, str], daemon: Client) -> None:
    for args in (["sessions"], ["--help"]):
        result = harness(env, *args, python=("-X", "importtime"))
        assert result.returncode == 0, result.stderr
        imported = {
            line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()
        }
        assert not imported & {"trio", "httpx", "pydantic", "mistralai", "apsw"}, args


def test_cancel_approve_and_deny_from_the_command_line(
    env: dict[str, str], tmp_path: Path, project: Path, daemon: Client
) -> None:
    bash = {"tool_calls": [{"name": "bash", "arguments": {"command": "touch approved"}}]}
    slow = {"text": "late", "delay": 30}
    model = _script(tmp_path, [bash, {"text": "done"}, slow])
    session_id = daemon.create_session(directory=str(project), model=model)["id"]

    def pending() -> list[dict[str, Any]]:
        deadline = time.monotonic() + 10
        while not (asks := daemon.permissions(session_id)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return asks

    daemon.prompt(session_id, "touch it")
    approved = harness(env, "approve", pending()[0]["id"])
    assert approved.returncode == 0, approved.stderr
    again = harness(env, "approve", "per_unknown")
    assert again.returncode == 2 and "no pending permission per_unknown" in again.stderr
    deadline = time.monotonic() + 10
    while daemon.session(session_id)["status"] != "idle" or not (project / "approved").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    daemon.prompt(session_id, "now wait")
    time.sleep(0.2)
    cancelled = harness(env, "cancel", "--json", session_id)
    assert json.loads(cancelled.stdout) == {"session_id": session_id, "cancelled": True}
    assert harness(env, "cancel", "ses_missing").returncode == 2

    other = daemon.create_session(directory=str(project), model=_script(tmp_path, TOUCH))["id"]
    daemon.prompt(other, "touch it")
    deadline = time.monotonic() + 10
    while not (asks := daemon.permissions(other)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    denied = harness(env, "deny", asks[0]["id"], "--message", "use git status instead")
    assert denied.returncode == 0, denied.stderr


def test_a_second_daemon_is_refused_and_sigterm_removes_the_socket(
    env: dict[str, str], tmp_path: Path
) -> None:
    path = Path(env["HARNESS_SOCKET"])
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file left by a daemon that died: replaced
    first = start_daemon(env, tmp_path / "first.log")
    second = harness(env, "serve")
    assert second.returncode == 1
    refusal = [json.loads(line) for line in second.stderr.splitlines()]
    assert any("already listening" in line.get("error", "") for line in refusal), second.stderr
    assert Client(path).alive(), "the first daemon still serves"
    assert stop(first) == 0
    assert not path.exists()
    lines = _log_lines(tmp_path / "first.log")
    assert any(line["event"] == "removing a stale socket" for line in lines)
    assert lines[-1]["event"] == "daemon stopped"


def test_commands_that_need_the_daemon_say_so(env: dict[str, str]) -> None:
    for args in (["events"], ["cancel", "ses_x"], ["approve", "per_x"]):
        result = harness(env, *args)
        assert result.returncode == 1
        assert "no daemon answers" in result.stderr and "harness serve" in result.stderr

"""`harness run` as a user runs it: a real process, real files, the exit codes of DESIGN §9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from procs import alive_with


def _script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    return env


def harness(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=30,
    )


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = harness(tmp_path, "--help")
    assert result.returncode == 0
    for command in ("run", "sessions", "show"):
        assert command in result.stdout


def test_run_prints_the_answer_on_stdout_and_steps_on_stderr(tmp_path: Path, project: Path) -> None:
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "read", "arguments": {"path": "package.json"}}]},
            {"text": "It uses pnpm."},
        ],
    )
    result = harness(tmp_path, "run", "--model", model, "--dir", str(project), "which pm?")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "It uses pnpm.\n"
    assert "→ read package.json" in result.stderr
    assert "✓ read (" in result.stderr
    assert (tmp_path / "home" / "ledger.db").exists()

    listing = harness(tmp_path, "sessions")
    assert listing.returncode == 0 and "which pm?" in listing.stdout
    session_id = listing.stdout.splitlines()[1].split()[0]
    shown = harness(tmp_path, "show", session_id)
    assert shown.returncode == 0
    assert "[read completed]" in shown.stdout and "It uses pnpm." in shown.stdout


def test_json_prints_one_event_per_line(tmp_path: Path, project: Path) -> None:
    model = _script(tmp_path, [{"text": "hello"}])
    result = harness(tmp_path, "run", "--json", "--model", model, "--dir", str(project), "hi")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert all("type" in e and "session_id" in e for e in events)
    assert events[-1]["type"] == "turn.finished"
    assert events[-1]["data"]["answer"] == "hello"
    assert any(e["type"] == "part.delta" for e in events)


def test_an_ask_without_a_terminal_is_rejected_and_names_the_flag(
    tmp_path: Path, project: Path
) -> None:
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "touch made-it"}}]}],
    )
    result = harness(tmp_path, "run", "--model", model, "--dir", str(project), "touch it")
    assert result.returncode == 4, result.stderr
    assert "--allow 'bash:touch *'" in result.stderr
    assert not (project / "made-it").exists()


def test_allow_flag_lets_the_command_run(tmp_path: Path, project: Path) -> None:
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "touch made-it"}}]},
            {"text": "done"},
        ],
    )
    result = harness(
        tmp_path, "run", "--allow", "bash:touch *", "--model", model, "--dir", str(project), "go"
    )
    assert result.returncode == 0, result.stderr
    assert (project / "made-it").exists()


def test_max_steps_exits_3(tmp_path: Path, project: Path) -> None:
    read = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
    model = _script(tmp_path, [read, read, {"text": "summary: limit reached"}])
    result = harness(
        tmp_path, "run", "--max-steps", "2", "--model", model, "--dir", str(project), "go"
    )
    assert result.returncode == 3, result.stderr
    assert "max_steps" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--model", "nope", "hi"], "unknown model"),
        (["run", "--dir", "/no/such/dir", "hi"], "no such directory"),
        (["run", "--max-steps", "0", "hi"], "--max-steps"),
        (["run", "--allow", ":x", "hi"], "no permission name"),
        (["run", "--agent", "nobody", "--model", "scripted:/dev/null", "hi"], "nobody"),
        (["show", "ses_missing"], "no ledger"),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = harness(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_provider_error_exits_1_with_a_clear_message(tmp_path: Path, project: Path) -> None:
    result = harness(
        tmp_path, "run", "--model", "mistral/devstral-small-latest", "--dir", str(project), "hi"
    )
    assert result.returncode == 1
    assert "MISTRAL_API_KEY" in result.stderr
    assert "Traceback" not in result.stderr


def test_ctrl_c_cancels_cleanly_and_leaves_no_process(tmp_path: Path, project: Path) -> None:
    marker = "sleep 300.5151"
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "bash", "arguments": {"command": f"{marker} & {marker}"}}]}],
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--yes",
            "--model",
            model,
            "--dir",
            str(project),
            "go",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    deadline = time.monotonic() + 20
    while len(alive_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_with(marker), "the command never started"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 130, stderr
    assert alive_with(marker) == []
    shown = harness(tmp_path, "sessions", "--json")
    session = json.loads(shown.stdout)[0]
    transcript = json.loads(harness(tmp_path, "show", "--json", session["id"]).stdout)
    tool = next(p for m in transcript["messages"] for p in m["parts"] if p["type"] == "tool")
    assert tool["state"] == {**tool["state"], "status": "error", "error": "cancelled"}


def test_trace_draws_the_tree_and_prints_json(tmp_path: Path, project: Path) -> None:
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "task", "arguments": {"description": "sub", "prompt": "p"}}]},
            {"text": "done"},
        ],
    )
    script = json.loads((tmp_path / "script.json").read_text())
    (tmp_path / "script.json").write_text(
        json.dumps({"turns": script, "subtasks": {"p": [{"text": "sub answer"}]}})
    )
    assert harness(tmp_path, "run", "--model", model, "--dir", str(project), "go").returncode == 0
    sessions = json.loads(harness(tmp_path, "sessions", "--json").stdout)
    root = next(s for s in sessions if s["parent_id"] is None)
    child = next(s for s in sessions if s["parent_id"] == root["id"])
    drawn = harness(tmp_path, "trace", root["id"])
    assert drawn.returncode == 0
    assert f"{child['id']} (child)" in drawn.stdout and "task sub" in drawn.stdout
    data = json.loads(harness(tmp_path, "trace", "--json", root["id"]).stdout)
    assert data["steps"][0]["tools"][0]["children"][0]["session_id"] == child["id"]
    assert harness(tmp_path, "trace", "ses_missing").returncode == 2


def test_budget_flags_stop_the_run_with_exit_3(tmp_path: Path, project: Path) -> None:
    read = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
    model = _script(
        tmp_path,
        [
            {**read, "usage": {"input": 40, "output": 20}},
            {"text": "budget summary", "usage": {"input": 1, "output": 1}},
        ],
    )
    result = harness(
        tmp_path, "run", "--budget-tokens", "50", "--model", model, "--dir", str(project), "go"
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "budget summary\n"
    assert "stopped (budget)" in result.stderr


def test_show_request_prints_each_request_with_its_sources(tmp_path: Path, project: Path) -> None:
    (project / "AGENTS.md").write_text("Use tabs.\n")
    model = _script(tmp_path, [{"text": "ok"}])
    result = harness(
        tmp_path, "run", "--show-request", "--model", model, "--dir", str(project), "hi"
    )
    assert result.returncode == 0, result.stderr
    assert '"source": "environment"' in result.stderr
    assert "Use tabs." in result.stderr and "AGENTS.md" in result.stderr


_COLLECTOR_PROBE = """
import gc, sys
import harness.commands.run as run
seen = []
real = run.resume_collector
def resume():  # what the collector is doing when start-up hands over
    seen.append(gc.isenabled())
    real()
run.resume_collector = resume
try:
    from harness.cli import main
    main(sys.argv[1:])
except SystemExit as done:
    print(done.code, seen[:1], gc.isenabled(), gc.get_freeze_count() > 1000)
"""


def test_run_starts_up_without_the_collector_and_turns_it_back_on(
    tmp_path: Path, project: Path
) -> None:
    model = _script(tmp_path, [{"text": "hello"}])
    arguments = ["run", "--model", model, "--dir", str(project), "hi"]
    done = subprocess.run(
        [sys.executable, "-c", _COLLECTOR_PROBE, *arguments],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    # Off while start-up imports and sets up; on (start-up's objects frozen) for the turn.
    assert done.stdout.split()[-4:] == ["0", "[False]", "True", "True"], done.stderr

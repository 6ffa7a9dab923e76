"""``harness acp`` end to end under a real ACP client nobody here wrote: npm ``acpx``.

``.ci/run`` installs the pinned acpx into ``.ci/node/acpx``; without it these tests skip,
except under ``CI=true``, where a missing acpx is a failure.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acp_client import agent_env, harness_cli

ACPX = Path(__file__).resolve().parent.parent / ".ci" / "node" / "acpx" / "node_modules" / ".bin"


@pytest.fixture
def acpx() -> Path:
    path = ACPX / "acpx"
    if not os.access(path, os.X_OK):
        reason = f"acpx is not installed at {path} (.ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the acpx tests, but {reason}")
        pytest.skip(reason)
    return path


def _run_acpx(
    acpx: Path,
    tmp_path: Path,
    project: Path,
    model: str,
    *flags: str,
    prompt: str,
    command: tuple[str, ...] = ("exec",),
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    agent = shlex.join([sys.executable, "-m", "harness", "acp", "--model", model])
    env = agent_env(tmp_path / "home")
    env["HOME"] = str(tmp_path / "user")  # acpx keeps its own state under ~/.acpx
    (tmp_path / "user").mkdir(exist_ok=True)
    result = subprocess.run(
        [str(acpx), "--agent", agent, *flags, "--format", "json", "--cwd", str(project),
         *command, *([prompt] if prompt else [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    messages = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result, messages


def _script(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    turns = [
        {
            "reasoning": "a docstring goes in main.py",
            "tool_calls": [
                {"name": "edit", "arguments": {
                    "path": "main.py",
                    "old_string": "def main():\n",
                    "new_string": 'def main():\n    """Print a greeting."""\n',
                }}
            ],
        },
        {"text": "Added a docstring to main().", "chunks": 3},
    ]
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]


def test_acpx_approves_an_edit_and_gets_the_answer(
    acpx: Path, tmp_path: Path, project: Path
) -> None:
    (project / "main.py").write_text('def main():\n    print("hi")\n')
    result, messages = _run_acpx(
        acpx, tmp_path, project, _script(tmp_path), "--approve-all",
        prompt="add a docstring to main()",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"""Print a greeting."""' in (project / "main.py").read_text()
    methods = [m.get("method") for m in messages if "method" in m]
    assert methods[:3] == ["initialize", "session/new", "session/prompt"]
    assert "session/request_permission" in methods
    [final] = [m for m in messages if m.get("result", {}).get("stopReason")]
    assert final["result"]["stopReason"] == "end_turn"
    updates = _updates(messages)
    kinds = [u["sessionUpdate"] for u in updates]
    assert kinds.index("agent_thought_chunk") < kinds.index("tool_call")
    assert kinds.index("tool_call") < kinds.index("agent_message_chunk")
    chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
    answer = "".join(u["content"]["text"] for u in chunks)
    assert answer == "Added a docstring to main()."
    [call] = [u for u in updates if u["sessionUpdate"] == "tool_call"]
    assert call["content"] == [  # the change to review, shown before it is allowed
        {
            "type": "diff",
            "path": str(project / "main.py"),
            "oldText": "def main():\n",
            "newText": 'def main():\n    """Print a greeting."""\n',
        }
    ]
    # The session acpx made is an ordinary one: `harness sessions` lists it.
    results = [m["result"] for m in messages if "result" in m]
    [session_id] = [r["sessionId"] for r in results if "sessionId" in r]
    listed = harness_cli(tmp_path / "home", ["sessions", "--json"], tmp_path)
    assert session_id in listed.stdout


def test_acpx_denying_the_edit_leaves_the_file_alone(
    acpx: Path, tmp_path: Path, project: Path
) -> None:
    original = 'def main():\n    print("hi")\n'
    (project / "main.py").write_text(original)
    result, messages = _run_acpx(
        acpx, tmp_path, project, _script(tmp_path), "--deny-all",
        prompt="add a docstring to main()",
    )
    assert (project / "main.py").read_text() == original
    [final] = [m for m in messages if m.get("result", {}).get("stopReason")]
    assert final["result"]["stopReason"] == "refusal", result.stderr[-3000:]
    statuses = [u.get("status") for u in _updates(messages) if u.get("toolCallId")]
    assert statuses[-1] == "failed"


def test_acpx_reconnects_to_its_session_with_session_load(
    acpx: Path, tmp_path: Path, project: Path
) -> None:
    """acpx's persistent sessions: `sessions new`, then each `prompt` starts `harness acp`
    afresh (its queue owner gone) and takes the session up again with session/load."""
    path = tmp_path / "turns.json"
    path.write_text(json.dumps([{"text": "first answer"}, {"text": "second answer"}]))
    model = f"scripted:{path}"
    queues = tmp_path / "user" / ".acpx" / "queues"
    created, _ = _run_acpx(
        acpx, tmp_path, project, model, prompt="", command=("sessions", "new")
    )
    assert created.returncode == 0, created.stderr[-3000:]
    replies = []
    for text in ("one", "two"):
        result, messages = _run_acpx(
            acpx, tmp_path, project, model, "--ttl", "0.1", prompt=text, command=("prompt",)
        )
        assert result.returncode == 0, result.stderr[-3000:]
        replies.append(messages)
        deadline = time.monotonic() + 30
        while any(queues.glob("*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # until acpx's queue owner, and with it harness acp, is gone
    loads = [m["params"] for m in replies[1] if m.get("method") == "session/load"]
    assert len(loads) == 1
    session_id = loads[0]["sessionId"]
    chunks = [u for u in _updates(replies[1]) if u["sessionUpdate"] == "agent_message_chunk"]
    answer = "".join(u["content"]["text"] for u in chunks)
    assert answer.endswith("second answer")
    listed = json.loads(harness_cli(tmp_path / "home", ["sessions", "--json"], tmp_path).stdout)
    assert [s["id"] for s in listed] == [session_id]  # one session, prompted twice

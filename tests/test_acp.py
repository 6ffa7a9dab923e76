"""``harness acp`` over its real stdin/stdout: a subprocess per test, the scripted model.

Each test plays an editor: it sends JSON-RPC lines, answers the agent's permission
requests, and reads the ``session/update`` notifications in the order they came.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from harness.config import Config
from harness.reader import open_reader
from tests.acp_client import NO_ANSWER, AcpProcess, acp_agent, harness_cli
from tests.procs import alive_with


def _script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


async def _open(agent: AcpProcess, project: Path) -> str:
    init = await agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert init["result"]["protocolVersion"] == 1
    new = await agent.request("session/new", {"cwd": str(project), "mcpServers": []})
    session_id: str = new["result"]["sessionId"]
    return session_id


def _updates(agent: AcpProcess, kind: str) -> list[dict[str, Any]]:
    return [u["update"] for u in agent.updates if u["update"]["sessionUpdate"] == kind]


def _tool_statuses(home: Path, session_id: str) -> list[str]:
    """The session's tool calls as the ledger has them, read as `harness show` reads them."""
    reader = open_reader(Config(home=home))
    parts = [part for message in reader.messages(session_id) for part in message.parts]
    return [part.state.status for part in parts if part.type == "tool"]


def _prompt(session_id: str, text: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


async def test_initialize_says_what_the_agent_can_do(tmp_path: Path) -> None:
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        answer = await agent.request(
            "initialize",
            {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": True}}},
        )
    result = answer["result"]
    assert result["protocolVersion"] == 1
    capabilities = result["agentCapabilities"]
    assert capabilities["loadSession"] is True
    assert capabilities["promptCapabilities"]["embeddedContext"] is True
    assert result["agentInfo"]["name"] == "harness"
    assert result["authMethods"] == []


async def test_a_prompt_with_a_tool_call_streams_its_updates_in_order(
    tmp_path: Path, project: Path
) -> None:
    model = _script(
        tmp_path,
        [
            {
                "reasoning": "the notes file should say",
                "tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}],
            },
            {"text": "The notes mention marker-7f3a.", "chunks": 4},
        ],
    )
    async with acp_agent(tmp_path / "home", "--model", model) as agent:
        session_id = await _open(agent, project)
        question = _prompt(session_id, "what do the notes say?")
        answer = await agent.request("session/prompt", question)
    assert answer["result"]["stopReason"] == "end_turn"
    assert all(update["sessionId"] == session_id for update in agent.updates)
    kinds = agent.kinds()
    # thought, then the call announced and updated, then the answer
    assert kinds[0] == "agent_thought_chunk"
    first_call = kinds.index("tool_call")
    assert kinds[first_call + 1 :].count("tool_call") == 0
    last_update = len(kinds) - 1 - kinds[::-1].index("tool_call_update")
    first_text = kinds.index("agent_message_chunk")
    assert first_call < last_update < first_text
    assert agent.text("agent_thought_chunk") == "the notes file should say"
    assert agent.text() == "The notes mention marker-7f3a."
    call = next(u["update"] for u in agent.updates if u["update"]["sessionUpdate"] == "tool_call")
    assert call["kind"] == "read"
    assert call["locations"] == [{"path": str(project / "notes.txt")}]
    assert call["rawInput"] == {"path": "notes.txt"}
    updates = _updates(agent, "tool_call_update")
    assert [u["status"] for u in updates] == ["in_progress", "completed"]
    assert all(u["toolCallId"] == call["toolCallId"] for u in updates)
    output = updates[-1]["content"][0]["content"]["text"]
    assert "marker-7f3a line two" in output


async def test_a_session_is_an_ordinary_harness_session(tmp_path: Path, project: Path) -> None:
    """In the ledger, listed by `harness sessions` (while the agent runs, too), and
    resumable by `harness run --session` once the agent is gone."""
    home = tmp_path / "home"
    model = _script(tmp_path, [{"text": "first answer"}, {"text": "second answer"}])
    async with acp_agent(home, "--model", model) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "hello"))
        assert answer["result"]["stopReason"] == "end_turn"
        listed = await trio.to_thread.run_sync(
            harness_cli, home, ["sessions", "--json"], tmp_path
        )
        assert session_id in listed.stdout, listed.stderr
    resumed = harness_cli(
        home, ["run", "--embedded", "--session", session_id, "--model", model, "again"], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "second answer"


def _write_script(tmp_path: Path) -> str:
    return _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "write", "arguments": {"path": "new.txt", "content": "hi"}}]},
            {"text": "wrote it"},
        ],
    )


async def test_a_permission_allowed_once_by_the_client_lets_the_call_run(
    tmp_path: Path, project: Path
) -> None:
    async with acp_agent(tmp_path / "home", "--model", _write_script(tmp_path)) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "write new.txt"))
    assert answer["result"]["stopReason"] == "end_turn"
    assert (project / "new.txt").read_text() == "hi"
    [asked] = agent.permission_requests
    assert asked["sessionId"] == session_id
    assert {o["optionId"]: o["kind"] for o in asked["options"]} == {
        "allow_once": "allow_once",
        "allow_always": "allow_always",
        "reject_once": "reject_once",
    }
    assert asked["toolCall"]["kind"] == "edit"
    assert "new.txt" in asked["toolCall"]["title"]
    statuses = [
        u["update"].get("status")
        for u in agent.updates
        if u["update"]["sessionUpdate"] in ("tool_call", "tool_call_update")
    ]
    assert statuses[-1] == "completed"
    done = _updates(agent, "tool_call_update")[-1]
    assert done["content"][0] == {"type": "diff", "path": str(project / "new.txt"), "newText": "hi"}
    assert agent.text() == "wrote it"


async def test_a_permission_rejected_by_the_client_stops_the_turn_and_writes_nothing(
    tmp_path: Path, project: Path
) -> None:
    async with acp_agent(
        tmp_path / "home", "--model", _write_script(tmp_path), choose=lambda params: "reject_once"
    ) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "write new.txt"))
    assert answer["result"]["stopReason"] == "refusal"
    assert not (project / "new.txt").exists()
    assert len(agent.permission_requests) == 1
    last = _updates(agent, "tool_call_update")
    assert last[-1]["status"] == "failed"
    assert "rejected" in last[-1]["content"][0]["content"]["text"]


async def test_an_always_allow_is_kept_for_the_next_call(tmp_path: Path, project: Path) -> None:
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "a"}}]},
            {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "b"}}]},
            {"text": "written twice"},
        ],
    )
    async with acp_agent(
        tmp_path / "home", "--model", model, choose=lambda params: "allow_always"
    ) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "write a.txt twice"))
    assert answer["result"]["stopReason"] == "end_turn"
    assert (project / "a.txt").read_text() == "b"
    assert len(agent.permission_requests) == 1  # the second write was allowed by "always"


async def test_cancel_mid_turn_stops_the_running_command(tmp_path: Path, project: Path) -> None:
    marker = f"sleep 43.{os.getpid()}"
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": marker}}]},
            {"text": "never reached"},
        ],
    )
    async with acp_agent(tmp_path / "home", "--model", model, "--allow", "bash") as agent:
        session_id = await _open(agent, project)
        await agent.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/prompt",
                "params": _prompt(session_id, "sleep"),
            }
        )
        await agent.wait_for(
            lambda: any(u["update"].get("status") == "in_progress" for u in agent.updates)
        )
        assert alive_with(marker)
        started = trio.current_time()
        await agent.send(
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
        )
        answer = await agent.response(7, seconds=15)
        elapsed = trio.current_time() - started
        assert answer["result"]["stopReason"] == "cancelled"
        assert elapsed < 10
        assert not alive_with(marker)  # the command's process group is gone
        calls = [u["update"] for u in agent.updates if u["update"].get("toolCallId")]
        assert calls[-1]["status"] == "failed"
        # The session takes the next prompt: the agent is still serving.
        again = await agent.request("session/prompt", _prompt(session_id, "go on"))
        assert "result" in again


async def test_load_replays_an_earlier_session_and_continues_it(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
            {"text": "read the notes"},
            {"text": "still here"},
        ],
    )
    async with acp_agent(home, "--model", model) as first:
        session_id = await _open(first, project)
        await first.request("session/prompt", _prompt(session_id, "read the notes"))
    async with acp_agent(home, "--model", model) as second:
        await second.request("initialize", {"protocolVersion": 1})
        loaded = await second.request(
            "session/load", {"sessionId": session_id, "cwd": str(project), "mcpServers": []}
        )
        assert "result" in loaded, loaded
        replay = list(second.updates)
        answer = await second.request("session/prompt", _prompt(session_id, "are you there?"))
    assert [u["update"]["sessionUpdate"] for u in replay] == [
        "user_message_chunk",
        "tool_call",
        "agent_message_chunk",
    ]
    assert replay[0]["update"]["content"]["text"] == "read the notes"
    call = replay[1]["update"]
    assert call["status"] == "completed" and call["kind"] == "read"
    assert "marker-7f3a" in call["content"][0]["content"]["text"]
    assert replay[2]["update"]["content"]["text"] == "read the notes"
    assert answer["result"]["stopReason"] == "end_turn"
    assert second.text().endswith("still here")


async def test_load_of_an_unknown_session_is_an_error(tmp_path: Path, project: Path) -> None:
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        answer = await agent.request(
            "session/load", {"sessionId": "ses_nope", "cwd": str(project), "mcpServers": []}
        )
        prompt = await agent.request("session/prompt", _prompt("ses_nope", "hi"))
    assert answer["error"]["code"] == -32002
    assert prompt["error"]["code"] == -32002


async def test_the_todo_list_becomes_a_plan(tmp_path: Path, project: Path) -> None:
    todos = [
        {"content": "read the code", "status": "completed", "priority": "high"},
        {"content": "write the fix", "status": "in_progress"},
        {"content": "old idea", "status": "cancelled", "priority": "low"},
    ]
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "todowrite", "arguments": {"todos": todos}}]}, {"text": "ok"}],
    )
    async with acp_agent(tmp_path / "home", "--model", model) as agent:
        session_id = await _open(agent, project)
        await agent.request("session/prompt", _prompt(session_id, "plan it"))
    [plan] = [u["update"] for u in agent.updates if u["update"]["sessionUpdate"] == "plan"]
    assert plan["entries"] == [
        {"content": "read the code", "priority": "high", "status": "completed"},
        {"content": "write the fix", "priority": "medium", "status": "in_progress"},
        {"content": "old idea (cancelled)", "priority": "low", "status": "completed"},
    ]


async def test_mcp_servers_of_session_new_are_accepted(tmp_path: Path, project: Path) -> None:
    server = {"name": "files", "command": "/usr/bin/true", "args": [], "env": []}
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        answer = await agent.request(
            "session/new", {"cwd": str(project), "mcpServers": [server]}
        )
    assert answer["result"]["sessionId"].startswith("ses_")


async def test_a_failing_model_is_an_error_response_not_a_crash(
    tmp_path: Path, project: Path
) -> None:
    model = _script(tmp_path, [{"error": {"kind": "auth", "message": "bad key"}}, {"text": "ok"}])
    async with acp_agent(tmp_path / "home", "--model", model) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "hi"))
        assert answer["error"]["code"] == -32603
        assert "bad key" in answer["error"]["message"]
        assert "result" in await agent.request("initialize", {"protocolVersion": 1})


def _call(method: str, params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


BAD_LINES: list[tuple[bytes, int]] = [
    (b"this is not json", -32700),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"', -32700),  # cut short
    (b"\xff\xfe{}", -32700),  # not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, -32700),  # nested past any parser's depth
    (b"[]", -32600),  # a batch
    (b"42", -32600),
    (b'{"id": 1, "method": "initialize", "params": {}}', -32600),  # no jsonrpc
    (b'{"jsonrpc": "1.0", "id": 1, "method": "initialize"}', -32600),
    (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "initialize"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 12}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600),  # neither a request nor a response
    (_call("no/such/method", {}), -32601),
    (_call("session/new", [1, 2]), -32602),
    (_call("session/new", {}), -32602),
    (_call("session/new", {"cwd": 5}), -32602),
    (_call("session/new", {"cwd": "relative", "mcpServers": []}), -32602),
    (_call("session/new", {"cwd": "/no/such/dir", "mcpServers": []}), -32602),
    (_call("session/prompt", {"sessionId": 3}), -32602),
    (_call("session/prompt", {"sessionId": "x", "prompt": [{"type": "video"}]}), -32602),
    (_call("initialize", {"protocolVersion": -4}), -32602),
    (_call("session/load", {"sessionId": "x"}), -32602),
]


async def test_garbage_gets_a_json_rpc_error_and_the_agent_keeps_serving(
    tmp_path: Path, project: Path
) -> None:
    """Each bad line in turn, in one agent: its error code, then a request still served."""
    codes: list[int] = []
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        for line, _ in BAD_LINES:
            agent.unsolicited.clear()
            await agent.send_raw(line + b"\n")
            await agent.wait_for(lambda: bool(agent.unsolicited) or 1 in agent.responses)
            error = agent.unsolicited[0] if agent.unsolicited else agent.responses.pop(1)
            assert isinstance(error["error"]["message"], str) and error["error"]["message"]
            codes.append(error["error"]["code"])
            assert "result" in await agent.request("initialize", {"protocolVersion": 1})
    assert codes == [code for _, code in BAD_LINES]  # a mismatch's index names its line


async def test_a_huge_line_is_refused_and_the_next_one_served(tmp_path: Path) -> None:
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        huge = b'{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"x":"' + b"a" * (17 << 20)
        await agent.send_raw(huge + b'"}}\n')
        await agent.wait_for(lambda: bool(agent.unsolicited))
        assert agent.unsolicited[0]["error"]["code"] == -32600
        assert "longer than" in agent.unsolicited[0]["error"]["message"]
        assert 5 not in agent.responses
        assert "result" in await agent.request("initialize", {"protocolVersion": 1})


async def test_unknown_notifications_and_stray_responses_get_no_answer(tmp_path: Path) -> None:
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        await agent.send({"jsonrpc": "2.0", "method": "no/such/thing", "params": {}})
        await agent.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"x": 1}})
        await agent.send({"jsonrpc": "2.0", "id": 99999, "result": {"outcome": "whatever"}})
        assert "result" in await agent.request("initialize", {"protocolVersion": 1})
        assert agent.unsolicited == [] and list(agent.responses) == []


def _question_script(tmp_path: Path, options: list[dict[str, str]]) -> str:
    question = {"question": "Which database?", "header": "db", "options": options}
    return _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "question", "arguments": {"questions": [question]}}]},
            {"text": "noted"},
        ],
    )


async def test_a_question_with_options_is_a_choice_for_the_client(
    tmp_path: Path, project: Path
) -> None:
    model = _question_script(tmp_path, [{"label": "SQLite"}, {"label": "Postgres"}])
    async with acp_agent(
        tmp_path / "home", "--model", model, choose=lambda params: "option-1"
    ) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "pick one"))
    assert answer["result"]["stopReason"] == "end_turn"
    [asked] = agent.permission_requests
    assert asked["toolCall"]["title"] == "Which database?"
    assert [o["name"] for o in asked["options"]] == ["SQLite", "Postgres", "Dismiss"]
    done = _updates(agent, "tool_call_update")[-1]
    assert done["status"] == "completed"
    assert "Postgres" in done["content"][0]["content"]["text"]


async def test_a_free_text_question_tells_the_model_to_decide(
    tmp_path: Path, project: Path
) -> None:
    async with acp_agent(tmp_path / "home", "--model", _question_script(tmp_path, [])) as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "ask me"))
    assert answer["result"]["stopReason"] == "end_turn"  # the model carries on
    assert agent.permission_requests == []
    done = _updates(agent, "tool_call_update")[-1]
    assert "best judgement" in done["content"][0]["content"]["text"]
    assert agent.text() == "noted"


async def test_the_client_going_away_mid_turn_ends_the_agent_and_its_commands(
    tmp_path: Path, project: Path
) -> None:
    marker = f"sleep 41.{os.getpid()}"  # a command line no other test runs
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "bash", "arguments": {"command": marker}}]}, {"text": "x"}],
    )
    async with acp_agent(tmp_path / "home", "--model", model, "--allow", "bash") as agent:
        session_id = await _open(agent, project)
        await agent.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/prompt",
                "params": _prompt(session_id, "go"),
            }
        )
        await agent.wait_for(
            lambda: any(u["update"].get("status") == "in_progress" for u in agent.updates)
        )
        assert alive_with(marker)
        # Leaving the block closes the agent's stdin; it must exit 0 by itself (acp_agent).
    assert not alive_with(marker)
    assert _tool_statuses(tmp_path / "home", session_id) == ["error"]  # recorded as cancelled


async def test_a_sessions_model_and_rules_come_from_its_project_file(
    tmp_path: Path, project: Path
) -> None:
    """No --model: the project file of the session's cwd names the model and allows the
    edit, as it would for `harness run --dir`."""
    model = _write_script(tmp_path)
    (project / ".harness").mkdir()
    (project / ".harness" / "config.toml").write_text(
        f'model = "{model}"\n[permission]\nedit = "allow"\n'
    )
    async with acp_agent(tmp_path / "home") as agent:
        session_id = await _open(agent, project)
        answer = await agent.request("session/prompt", _prompt(session_id, "write new.txt"))
    assert answer["result"]["stopReason"] == "end_turn"
    assert agent.permission_requests == []
    assert (project / "new.txt").read_text() == "hi"


async def test_a_project_file_that_configures_the_harness_is_refused_elsewhere(
    tmp_path: Path, project: Path
) -> None:
    (project / ".harness").mkdir()
    (project / ".harness" / "config.toml").write_text('sandbox = "off"\n')
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        answer = await agent.request("session/new", {"cwd": str(project), "mcpServers": []})
    assert answer["error"]["code"] == -32602
    assert "sandbox" in answer["error"]["message"]


def test_a_terminal_is_left_blocking_as_it_was(tmp_path: Path) -> None:
    """Run by hand on a terminal, the agent must not leave the shell's terminal in
    non-blocking mode (Trio's FdStream sets it on the file the shell shares)."""
    import pty
    import subprocess
    import sys
    import time

    from tests.acp_client import agent_env

    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "acp", "--model", "scripted:/none"],
            stdin=follower,
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env=agent_env(tmp_path / "home"),
            cwd=tmp_path,
        )
        deadline = time.monotonic() + 30
        while os.get_blocking(follower) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the agent has taken the terminal
        assert not os.get_blocking(follower)
        os.write(leader, b"\x04")  # end of file on a terminal: the client is gone
        assert process.wait(timeout=30) == 0
        assert os.get_blocking(follower)
    finally:
        os.close(leader)
        os.close(follower)


async def test_sigterm_mid_turn_stops_cleanly(tmp_path: Path, project: Path) -> None:
    """What an editor does when it closes: the command is killed, the turn recorded as
    cancelled, and the agent exits 0."""
    import signal

    marker = f"sleep 42.{os.getpid()}"
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "bash", "arguments": {"command": marker}}]}, {"text": "x"}],
    )
    home = tmp_path / "home"
    async with acp_agent(home, "--model", model, "--allow", "bash") as agent:
        session_id = await _open(agent, project)
        await agent.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/prompt",
                "params": _prompt(session_id, "go"),
            }
        )
        await agent.wait_for(
            lambda: any(u["update"].get("status") == "in_progress" for u in agent.updates)
        )
        assert alive_with(marker)
        agent.process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await agent.process.wait() == 0
    assert not alive_with(marker)
    assert _tool_statuses(home, session_id) == ["error"]


async def test_a_client_slow_to_read_loses_no_update(tmp_path: Path, project: Path) -> None:
    """The client stops reading while a step makes thousands of events: the agent's
    subscription falls behind and is cut off; it takes the turn up again from the ledger,
    and every call still reaches the client with its final status."""
    calls = 1100  # several events each: past a subscriber's 4,096-event buffer
    turn = {
        "tool_calls": [
            {"name": "glob", "arguments": {"pattern": f"z{n}"}} for n in range(calls)
        ]
    }
    model = _script(tmp_path, [turn, {"text": "globbed it all", "chunks": 3}])
    logs = tmp_path / "home" / "logs"

    def logged(text: str) -> bool:
        return any(text in f.read_text() for f in logs.glob("acp-*.jsonl"))

    async with acp_agent(tmp_path / "home", "--model", model) as agent:
        session_id = await _open(agent, project)
        agent.reading = trio.Event()  # not reading from now on
        await agent.send(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "session/prompt",
                "params": _prompt(session_id, "go"),
            }
        )
        with trio.fail_after(120):
            while not logged('"turn finished"'):
                await trio.sleep(0.2)
        agent.reading.set()
        answer = await agent.response(9, seconds=120)
    assert logged("acp client fell behind")
    assert answer["result"]["stopReason"] == "end_turn"
    final: dict[str, str] = {}
    for update in agent.updates:
        if update["update"].get("toolCallId"):
            final[update["update"]["toolCallId"]] = update["update"].get("status", "")
    assert len(final) == calls
    assert set(final.values()) == {"completed"}
    assert agent.text() == "globbed it all"


async def test_a_ledger_held_by_another_process_is_an_error_the_editor_sees(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    async with acp_agent(home, "--model", "scripted:/none") as holder:
        await _open(holder, project)  # this agent holds the ledger
        async with acp_agent(
            home, "--model", "scripted:/none", exit_code=1, stderr=tmp_path / "second.txt"
        ) as second:
            answer = await second.request("initialize", {"protocolVersion": 1})
            assert answer["error"]["code"] == -32603
            assert "in use" in answer["error"]["message"]
            unknown = await second.request("no/such", {})
            assert unknown["error"]["code"] == -32601
        assert "in use" in (tmp_path / "second.txt").read_text()


async def test_a_known_secret_never_reaches_the_editor(tmp_path: Path, project: Path) -> None:
    """Not in the live text either, whose deltas the ledger never redacts: even split
    across two deltas (12 pieces of 4 characters: the key spans several)."""
    secret = "sk-test-5f1d0c2a9b8e7d6c"
    model = _script(
        tmp_path, [{"text": f"the key is {secret}, of course", "chunks": 12, "chunk_delay": 0.06}]
    )
    os.environ["OPENAI_API_KEY"] = secret  # the agent's environment is built from ours
    try:
        async with acp_agent(tmp_path / "home", "--model", model) as agent:
            session_id = await _open(agent, project)
            await agent.request("session/prompt", _prompt(session_id, "what is the key?"))
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert agent.text() == "the key is [REDACTED:OPENAI_API_KEY], of course"
    chunks = [u["content"]["text"] for u in _updates(agent, "agent_message_chunk")]
    assert len(chunks) > 3  # it streamed, the key held back only while it could be one
    assert not any(secret[:8] in chunk for chunk in chunks)


async def test_a_client_that_stops_reading_for_good_is_no_crash(
    tmp_path: Path, project: Path
) -> None:
    """The client closes its end of the agent's stdout mid-answer: the agent's writes fail,
    which ends nothing but the answers; closing stdin then stops it as usual (exit 0)."""
    model = _script(
        tmp_path, [{"text": "a long answer " * 50, "chunks": 50, "chunk_delay": 0.02}]
    )
    err = tmp_path / "agent-stderr.txt"
    async with acp_agent(tmp_path / "home", "--model", model, stderr=err) as agent:
        session_id = await _open(agent, project)
        await agent.send(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "session/prompt",
                "params": _prompt(session_id, "go"),
            }
        )
        await agent.wait_for(lambda: bool(agent.updates))
        agent.reading = trio.Event()
        assert agent.process.stdout is not None
        await agent.process.stdout.aclose()
        await agent.send({"jsonrpc": "2.0", "id": 10, "method": "nope"})  # its answer fails too
        await trio.sleep(1.5)  # the rest of the answer is written into a closed pipe
    assert "internal error" not in err.read_text()


async def test_an_ask_left_by_a_killed_agent_reaches_the_next_client(
    tmp_path: Path, project: Path
) -> None:
    """The agent is killed (SIGKILL) while an ask waits; the next one resumes the turn at
    start, and its ask, made while no prompt was followed, is put to the client that
    loads the session and prompts: answered, the resumed turn and then the prompt end."""
    import signal

    home = tmp_path / "home"
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "a"}}]},
            {"tool_calls": [{"name": "write", "arguments": {"path": "b.txt", "content": "b"}}]},
            {"text": "the resumed turn is done"},
            {"text": "and so is the new prompt"},
        ],
    )
    async with acp_agent(
        home, "--model", model, choose=lambda params: NO_ANSWER, exit_code=-signal.SIGKILL
    ) as first:
        session_id = await _open(first, project)
        await first.send(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "session/prompt",
                "params": _prompt(session_id, "write a and b"),
            }
        )
        await first.wait_for(lambda: bool(first.permission_requests))
        first.process.kill()
        await first.process.wait()
    logs = home / "logs"

    def asks_logged() -> int:
        return sum(f.read_text().count('"permission asked"') for f in logs.glob("acp-*.jsonl"))

    async with acp_agent(home, "--model", model) as second:
        with trio.fail_after(30):
            while asks_logged() < 2:  # the resumed turn's ask waits, and nobody follows it
                await trio.sleep(0.05)
        await second.request("initialize", {"protocolVersion": 1})
        loaded = await second.request(
            "session/load", {"sessionId": session_id, "cwd": str(project), "mcpServers": []}
        )
        assert "result" in loaded
        answer = await second.request("session/prompt", _prompt(session_id, "go on"))
    assert answer["result"]["stopReason"] == "end_turn"
    assert [r["toolCall"]["title"].rsplit("/", 1)[-1] for r in second.permission_requests] == [
        "b.txt"
    ]
    assert (project / "b.txt").read_text() == "b"
    assert second.text().endswith("and so is the new prompt")


async def test_session_list_pages_through_the_ledgers_sessions(
    tmp_path: Path, project: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        init = await agent.request("initialize", {"protocolVersion": 1})
        assert "list" in init["result"]["agentCapabilities"]["sessionCapabilities"]
        made = []
        for n in range(53):
            cwd = project if n % 2 == 0 else other
            new = await agent.request("session/new", {"cwd": str(cwd), "mcpServers": []})
            made.append(new["result"]["sessionId"])
        first = (await agent.request("session/list", {}))["result"]
        second = (await agent.request("session/list", {"cursor": first["nextCursor"]}))["result"]
        here = (await agent.request("session/list", {"cwd": str(other)}))["result"]
        bad = await agent.request("session/list", {"cursor": "x"})
    listed = [s["sessionId"] for s in first["sessions"] + second["sessions"]]
    assert len(first["sessions"]) == 50 and "nextCursor" not in second
    assert listed == made[::-1]  # the most recently active first, each once
    assert {s["cwd"] for s in here["sessions"]} == {str(other)}
    assert len(here["sessions"]) == 26
    assert all(s["updatedAt"].endswith("+00:00") for s in first["sessions"])
    assert bad["error"]["code"] == -32602

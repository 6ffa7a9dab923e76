"""An ACP client's MCP servers (``mcpServers`` of ``session/new`` and ``session/load``)
joining that session's tools, over a real ``harness acp`` subprocess and a real server
(tests/mcp_servers.py), as an editor would send them.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.config import Config
from harness.messages.model import ToolCompleted, ToolError, ToolPart
from harness.reader import open_reader
from harness.storage.ledger import Ledger
from tests.acp_client import AcpProcess, acp_agent
from tests.procs import live_processes

SERVERS = Path(__file__).parent / "mcp_servers.py"


@pytest.fixture
def marker() -> Iterator[str]:
    """On each server's command line; nothing holding it may outlive the test."""
    mark = f"acpmcp-{uuid.uuid4().hex[:12]}"
    yield mark
    deadline = time.monotonic() + 5
    while live_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_processes(mark) == {}, "a client's MCP server outlived harness acp"


def _stdio(name: str, marker: str, kind: str = "basic") -> dict[str, Any]:
    """A server as ACP's ``McpServerStdio`` says it: command, args, env as a list."""
    return {
        "name": name,
        "command": sys.executable,
        "args": [str(SERVERS), kind, f"--marker={marker}"],
        "env": [{"name": "ACP_MCP_TEST", "value": "1"}],
    }


def _script(tmp_path: Path, note: Path) -> str:
    path = tmp_path / "script.json"
    call = {"name": "basic_note", "arguments": {"path": str(note), "text": "from the model"}}
    path.write_text(json.dumps([{"tool_calls": [call]}, {"text": "done"}]))
    return f"scripted:{path}"


def _prompt(session_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": "write the note"}]}


def _tool_parts(home: Path, session_id: str) -> list[ToolPart]:
    reader = open_reader(Config(home=home))
    return [
        part
        for message in reader.messages(session_id)
        for part in message.parts
        if isinstance(part, ToolPart)
    ]


def _events(home: Path, kind: str) -> list[Any]:
    ledger = Ledger(Config(home=home).ledger_path)
    try:
        return [e for e in ledger.events_after(0, limit=100_000) if e.type == kind]
    finally:
        ledger.close()


async def _initialize(agent: AcpProcess) -> dict[str, Any]:
    init = await agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    result: dict[str, Any] = init["result"]
    return result


async def test_a_client_server_joins_its_session_only_and_stops_with_the_agent(
    tmp_path: Path, project: Path, marker: str
) -> None:
    home = tmp_path / "home"
    note = tmp_path / "note.txt"
    async with acp_agent(home, "--model", _script(tmp_path, note)) as agent:
        init = await _initialize(agent)
        mcp = init["agentCapabilities"]["mcpCapabilities"]
        assert (mcp["http"], mcp["sse"], mcp.get("acp", False)) == (True, False, False)
        new = await agent.request(
            "session/new", {"cwd": str(project), "mcpServers": [_stdio("basic", marker)]}
        )
        with_server = new["result"]["sessionId"]
        answer = await agent.request("session/prompt", _prompt(with_server))
        assert answer["result"]["stopReason"] == "end_turn", answer
        assert live_processes(marker), "the server runs while the agent does"
        # The call asked the client first, by the tool's full name and its arguments.
        [asked] = agent.permission_requests
        assert asked["sessionId"] == with_server
        assert asked["toolCall"]["title"].startswith("basic_note: ")
        assert str(note) in asked["toolCall"]["title"]

        other = await agent.request("session/new", {"cwd": str(project), "mcpServers": []})
        without = other["result"]["sessionId"]
        answer = await agent.request("session/prompt", _prompt(without))
        assert "result" in answer, answer
        assert len(agent.permission_requests) == 1  # nothing for the second session to ask

    assert note.read_text() == "from the model"
    [ran] = _tool_parts(home, with_server)
    assert isinstance(ran.state, ToolCompleted)
    # What the model reads next step: the server's answer.
    assert ran.state.output == "wrote 14 characters"
    [unknown] = _tool_parts(home, without)
    assert isinstance(unknown.state, ToolError)
    assert "basic_note" in unknown.state.error
    # Recorded like a configured server's group (for a crash's reaping), then its end.
    [process] = _events(home, "mcp.process")
    assert process.session_id == with_server
    assert process.data["server"] == "basic"
    assert any(e.data["server"] == "basic" for e in _events(home, "mcp.exited"))
    # (the marker fixture: no process of the server is left)


async def test_load_after_a_restart_uses_the_servers_the_client_sends_again(
    tmp_path: Path, project: Path, marker: str
) -> None:
    home = tmp_path / "home"
    note = tmp_path / "note.txt"
    path = tmp_path / "script.json"
    call = {"name": "basic_note", "arguments": {"path": str(note), "text": "second"}}
    path.write_text(json.dumps([{"text": "first"}, {"tool_calls": [call]}, {"text": "done"}]))
    model = f"scripted:{path}"
    servers = [_stdio("basic", marker)]
    async with acp_agent(home, "--model", model) as agent:
        await _initialize(agent)
        new = await agent.request("session/new", {"cwd": str(project), "mcpServers": servers})
        session_id = new["result"]["sessionId"]
        first = await agent.request("session/prompt", _prompt(session_id))
        assert first["result"]["stopReason"] == "end_turn"
    assert live_processes(marker) == {}
    async with acp_agent(home, "--model", model) as agent:
        await _initialize(agent)
        loaded = await agent.request(
            "session/load",
            {"sessionId": session_id, "cwd": str(project), "mcpServers": servers},
        )
        assert "result" in loaded, loaded
        again = await agent.request("session/prompt", _prompt(session_id))
        assert again["result"]["stopReason"] == "end_turn", again
    assert note.read_text() == "second"
    [ran] = _tool_parts(home, session_id)
    assert isinstance(ran.state, ToolCompleted), ran.state


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ({"name": "x", "args": [], "env": []}, "command"),
        ({"name": "x", "command": "", "args": [], "env": []}, "command[0] is empty"),
        ({"name": "bad name!", "command": "true", "args": [], "env": []}, "1-32 of"),
        ({"type": "sse", "name": "x", "url": "http://127.0.0.1:9/sse", "headers": []}, "sse"),
        ({"type": "http", "name": "x", "url": "ftp://h/", "headers": []}, "url"),
        ("not an object", "not an object"),
    ],
)
async def test_a_bad_server_is_invalid_params_and_makes_no_session(
    tmp_path: Path, project: Path, server: Any, says: str
) -> None:
    home = tmp_path / "home"
    async with acp_agent(home, "--model", "scripted:/none") as agent:
        await _initialize(agent)
        answer = await agent.request(
            "session/new", {"cwd": str(project), "mcpServers": [server]}
        )
        assert answer["error"]["code"] == -32602, answer
        assert "mcpServers[0]" in answer["error"]["message"]
        assert says in answer["error"]["message"]
        # The agent goes on serving.
        fine = await agent.request("session/new", {"cwd": str(project), "mcpServers": []})
        assert "result" in fine
    assert len(open_reader(Config(home=home)).sessions()) == 1


async def test_two_servers_of_one_name_are_invalid_params(
    tmp_path: Path, project: Path, marker: str
) -> None:
    async with acp_agent(tmp_path / "home", "--model", "scripted:/none") as agent:
        await _initialize(agent)
        servers = [_stdio("basic", marker), _stdio("basic", marker)]
        answer = await agent.request("session/new", {"cwd": str(project), "mcpServers": servers})
        assert answer["error"]["code"] == -32602
        assert "a second server named 'basic'" in answer["error"]["message"]


async def test_a_killed_agent_leaves_servers_the_next_one_reaps(
    tmp_path: Path, project: Path, marker: str
) -> None:
    """The client's servers' groups are in the ledger like configured ones: after a
    SIGKILL of the agent (one server deaf to SIGTERM and a closed stdin, with a child),
    the next ``harness acp`` kills them at start."""
    import signal

    home = tmp_path / "home"
    flag = tmp_path / "write.log"
    path = tmp_path / "script.json"
    call = {"name": "basic_slow_write", "arguments": {"seconds": 60, "marker": str(flag)}}
    path.write_text(json.dumps([{"tool_calls": [call]}, {"text": "after"}]))
    model = f"scripted:{path}"
    servers = [_stdio("basic", marker), _stdio("stubborn", marker, "stubborn")]
    async with acp_agent(home, "--model", model, exit_code=-signal.SIGKILL) as first:
        await _initialize(first)
        new = await first.request("session/new", {"cwd": str(project), "mcpServers": servers})
        session_id = new["result"]["sessionId"]
        await first.send(
            {"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": _prompt(session_id)}
        )
        with trio.fail_after(60):
            while not (flag.exists() and "started" in flag.read_text()):
                await trio.sleep(0.02)
        first.process.kill()
        await first.process.wait()
    left = live_processes(marker)
    assert any("stubborn" in Path(f"/proc/{pid}/cmdline").read_text() for pid in left)
    async with acp_agent(home, "--model", model) as second:
        await _initialize(second)
        with trio.fail_after(10):
            while set(left) & set(live_processes(marker)):
                await trio.sleep(0.02)
    reaped = [e for e in _events(home, "mcp.exited") if "reaped" in e.data["reason"]]
    assert {e.data["server"] for e in reaped} == {"basic", "stubborn"}
    assert all(e.session_id == session_id for e in reaped)


def test_a_session_mcp_harness_imports_no_sdk_until_a_server_is_given(
    tmp_path: Path, project: Path
) -> None:
    """``harness acp`` always runs a hub; the SDK (half a second) comes with a server."""
    import subprocess

    script = (
        "import sys, trio\n"
        "from harness.config import Config\n"
        "from harness.providers.scripted import ScriptedProvider\n"
        "from harness.runtime import open_harness\n"
        "async def main():\n"
        "    p = ScriptedProvider.from_turns([{'text': 'hi'}])\n"
        f"    c = Config(home={str(tmp_path / 'h')!r}, model='scripted:x', interactive=False,"
        " provider_factory=lambda m: p)\n"
        "    async with open_harness(c, session_mcp=True) as h:\n"
        f"        s = await h.create_session({str(project)!r})\n"
        "        await h.run(s.id, 'go')\n"
        "trio.run(main)\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


async def test_an_http_server_of_the_client_serves_its_session(
    tmp_path: Path, project: Path
) -> None:
    """``McpServerHttp``: the reference server over streamable HTTP, its headers sent."""
    import os

    from tests.test_mcp import EVERYTHING, _free_port, _http_everything

    if not EVERYTHING.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"server-everything is not installed at {EVERYTHING} (.ci/run)")
        pytest.skip("server-everything not installed: run the npm step of .ci/run")
    port = _free_port()
    process = await trio.to_thread.run_sync(_http_everything, EVERYTHING, port)
    path = tmp_path / "script.json"
    call = {"name": "web_echo", "arguments": {"message": "over acp and http"}}
    path.write_text(json.dumps([{"tool_calls": [call]}, {"text": "done"}]))
    home = tmp_path / "home"
    server = {
        "type": "http",
        "name": "web",
        "url": f"http://127.0.0.1:{port}/mcp",
        "headers": [{"name": "X-Client", "value": "${HOME}"}],
    }
    try:
        async with acp_agent(home, "--model", f"scripted:{path}") as agent:
            await _initialize(agent)
            new = await agent.request(
                "session/new", {"cwd": str(project), "mcpServers": [server]}
            )
            session_id = new["result"]["sessionId"]
            answer = await agent.request("session/prompt", _prompt(session_id))
            assert answer["result"]["stopReason"] == "end_turn", answer
    finally:
        process.kill()
        process.wait(10)
    [ran] = _tool_parts(home, session_id)
    assert isinstance(ran.state, ToolCompleted), ran.state
    assert ran.state.output == "Echo: over acp and http"
    [started] = _events(home, "mcp.started")
    assert started.session_id == session_id and started.data["transport"] == "http"


async def test_the_clients_values_are_literal_not_read_from_harness_environment(
    tmp_path: Path, project: Path
) -> None:
    """A ``${VAR}`` an editor sends must not pull a variable of harness's (a key) out to
    a server: it is sent as written."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list[str | None] = []

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    http = HTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"text": "ok"}]))
    server = {
        "type": "http",
        "name": "docs",
        "url": f"http://127.0.0.1:{http.server_port}/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer ${HOME}"}],
    }
    home = tmp_path / "home"
    try:
        async with acp_agent(home, "--model", f"scripted:{path}") as agent:
            await _initialize(agent)
            new = await agent.request(
                "session/new", {"cwd": str(project), "mcpServers": [server]}
            )
            answer = await agent.request("session/prompt", _prompt(new["result"]["sessionId"]))
            assert answer["result"]["stopReason"] == "end_turn", answer
    finally:
        http.shutdown()
    assert seen and set(seen) == {"Bearer ${HOME}"}
    [failed] = _events(home, "mcp.failed")
    assert failed.data["server"] == "docs"

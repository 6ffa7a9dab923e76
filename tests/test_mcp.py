"""MCP servers (issue 16, DESIGN §12), against real servers in real processes.

Servers nobody here wrote: ``@modelcontextprotocol/server-everything`` from npm (installed
by .ci/run into .ci/node, run with node) and ``mcp-server-time`` from PyPI. Servers for each
fault are written with the SDK in tests/mcp_servers.py (and by hand in
tests/mcp_raw_server.py). After every harness exits, /proc shows none of the servers the
test started: each server's command line carries a marker unique to the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import wait_for_daemon
from procs import live_processes

from harness.config import Config
from harness.config_files import (
    ConfigFileError,
    config_overrides,
    daemon_cannot_apply,
    load_settings,
    read_file,
)
from harness.mcp.naming import MAX_NAME, tool_name
from harness.mcp.schemas import schema_problem
from harness.mcp.spec import McpServerSpec, MissingVariable, expand
from harness.messages.events import Event
from harness.messages.model import Rule, ToolCompleted, ToolError, ToolPart
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness
from harness.storage.ledger import Ledger

TESTS = Path(__file__).resolve().parent
SERVERS = TESTS / "mcp_servers.py"
RAW_SERVER = TESTS / "mcp_raw_server.py"
EVERYTHING = (
    TESTS.parent
    / ".ci/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


@pytest.fixture
def everything() -> Path:
    """The reference server's entry point; skipped only outside CI (where .ci/run did not
    install it), a failure under CI=true."""
    if not EVERYTHING.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"server-everything is not installed at {EVERYTHING} (.ci/run)")
        pytest.skip("server-everything not installed: run the npm step of .ci/run")
    return EVERYTHING


@pytest.fixture
def marker() -> Iterator[str]:
    """Put on each server's command line; nothing holding it may outlive the test."""
    mark = f"mcpt-{uuid.uuid4().hex[:12]}"
    yield mark
    deadline = time.monotonic() + 5
    while live_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_processes(mark) == {}, "an MCP server outlived its harness"


def server(kind: str, marker: str, *args: str, **spec: Any) -> McpServerSpec:
    return McpServerSpec(
        command=[sys.executable, str(SERVERS), kind, *args, f"--marker={marker}"], **spec
    )


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@asynccontextmanager
async def harness(
    tmp_path: Path, turns: list[dict[str, Any]], servers: dict[str, McpServerSpec], **config: Any
) -> AsyncIterator[tuple[Harness, ScriptedProvider]]:
    provider = ScriptedProvider.from_turns(turns, record=True)
    settings: dict[str, Any] = {
        "home": tmp_path / "home",
        "model": "scripted:test",
        "provider_factory": lambda model: provider,
        "interactive": False,
        "log_file": tmp_path / "home" / "logs" / "test.jsonl",
        "mcp_servers": servers,
        **config,
    }
    async with open_harness(Config(**settings)) as h:
        yield h, provider


def events(h: Harness, prefix: str = "mcp.") -> list[Event]:
    return [e for e in h.ledger.events_after(0, limit=100_000) if e.type.startswith(prefix)]


def parts(h: Harness, session_id: str) -> list[ToolPart]:
    return [p for m in h.ledger.messages(session_id) for p in m.parts if isinstance(p, ToolPart)]


def output(part: ToolPart) -> str:
    state = part.state
    if isinstance(state, ToolCompleted):
        return state.output
    assert isinstance(state, ToolError), state
    return "ERROR: " + state.error


def offered(provider: ScriptedProvider, request: int) -> list[str]:
    return [spec.name for spec in provider.requests[request].tools]


async def run(h: Harness, project: Path, prompt: str = "go", **session: Any) -> str:
    created = await h.create_session(project, **session)
    with trio.fail_after(60):
        await h.run(created.id, prompt)
    return created.id


# --- names, config, schemas ----------------------------------------------------------------


def test_tool_names_are_safe_short_and_stable() -> None:
    assert tool_name("github", "create_issue") == "github_create_issue"
    assert tool_name("ev", "get-tiny.image/x") == "ev_get-tiny_image_x"
    long_a, long_b = tool_name("srv", "a" * 100), tool_name("srv", "a" * 99 + "b")
    assert len(long_a) == len(long_b) == MAX_NAME
    assert long_a != long_b and long_a[:40] == long_b[:40]
    assert long_a == tool_name("srv", "a" * 100)  # rules and approvals are stored by it


def test_mcp_config_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        "mcp_search_threshold = 500\n"
        '[mcp.github]\ncommand = ["npx", "-y", "server-github"]\n'
        'env = { GITHUB_TOKEN = "${GITHUB_TOKEN}" }\nstartup_timeout = 60\n'
        '[mcp.docs]\nurl = "https://docs.internal/mcp"\n'
        'headers = { Authorization = "Bearer ${DOCS_TOKEN}" }\nenabled = false\n'
    )
    monkeypatch.setenv("HARNESS_CONFIG", str(config))
    values = config_overrides(load_settings(tmp_path, project=False))
    github, docs = values["mcp_servers"]["github"], values["mcp_servers"]["docs"]
    assert github.transport == "stdio" and github.startup_timeout == 60 and github.timeout == 120
    assert docs.transport == "http" and not docs.enabled and docs.startup_timeout == 30
    assert values["mcp_search_threshold"] == 500
    # The variables a server's env and headers name are credentials: redacted, and kept
    # from the commands tools run.
    assert {"GITHUB_TOKEN", "DOCS_TOKEN"} <= set(values["secret_env"])
    # A daemon's servers are its own (from the global file): a project's are refused there.
    assert daemon_cannot_apply(read_file(config)) == ["mcp", "mcp_search_threshold"]
    for bad, says in [
        ('[mcp.x]\nurl = "https://a"\ncommand = ["a"]\n', "exactly one of command"),
        ("[mcp.x]\nenabled = true\n", "exactly one of command"),
        ('[mcp.x]\ncommand = ["a"]\ntimeout = 0\n', "mcp.x.timeout"),
        ('[mcp.x]\ncommand = ["a"]\nheaders = { A = "b" }\n', "headers are for a url"),
        ('[mcp."a b"]\ncommand = ["a"]\n', "mcp.a b"),
        ('[mcp.x]\ncommand = ["a"]\nshell = true\n', "mcp.x.shell: unknown key"),
    ]:
        config.write_text(bad)
        with pytest.raises(ConfigFileError, match=says):
            load_settings(tmp_path, project=False)


def test_variables_expand_from_the_environment() -> None:
    assert expand({"A": "Bearer ${T}", "B": "plain"}, {"T": "tok"}) == {
        "A": "Bearer tok",
        "B": "plain",
    }
    with pytest.raises(MissingVariable, match=r"\$\{T\} is not set"):
        expand({"A": "${T}"}, {})


def test_schemas_a_provider_would_reject() -> None:
    assert schema_problem({"type": "object", "properties": {"a": {"type": "string"}}}) is None
    assert "not 'object'" in (schema_problem({"type": "string"}) or "")
    assert "without 'items'" in (
        schema_problem({"type": "object", "properties": {"xs": {"type": "array"}}}) or ""
    )
    assert "unknown type" in (
        schema_problem({"type": "object", "properties": {"a": {"type": "str"}}}) or ""
    )
    assert schema_problem([1]) is not None
    # A property named like a keyword is a property, not a keyword.
    named = {"type": "object", "properties": {"type": {"type": "string"}, "items": {}}}
    assert schema_problem(named) is None


# --- real servers nobody here wrote -------------------------------------------------------


async def test_the_reference_server_through_the_harness(
    tmp_path: Path, project: Path, everything: Path
) -> None:
    turns = [
        call("everything_echo", message="hello"),
        call("everything_get-tiny-image"),
        call("everything_get-structured-content", location="New York"),
        {"text": "done"},
    ]
    servers = {"everything": McpServerSpec(command=["node", str(everything), "stdio"])}
    async with harness(tmp_path, turns, servers) as (h, provider):
        session = await run(h, project)
        done = parts(h, session)
        started = [e for e in events(h) if e.type == "mcp.started"]
        pid = started[0].data["pid"]
    # After a normal exit the ledger says the server stopped, and why.
    ledger = Ledger(tmp_path / "home" / "ledger.db", read_only=True)
    exited = [e for e in ledger.events_after(0) if e.type == "mcp.exited"]
    ledger.close()
    assert [e.data["reason"] for e in exited] == ["the harness stopped"]
    assert exited[0].data["process"]["pgid"] == pid
    assert output(done[0]) == "Echo: hello"
    assert "[image: image/png, " in output(done[1]) and "bytes]" in output(done[1])
    assert "temperature" in output(done[2])
    assert started[0].data["tools"] >= 10 and started[0].data["schema_tokens"] > 0
    assert "everything_echo" in offered(provider, 0)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


async def test_a_python_server_from_pypi(tmp_path: Path, project: Path) -> None:
    turns = [call("time_get_current_time", timezone="UTC"), {"text": "done"}]
    servers = {"time": McpServerSpec(command=[sys.executable, "-m", "mcp_server_time"])}
    async with harness(tmp_path, turns, servers) as (h, _):
        session = await run(h, project)
        [part] = parts(h, session)
    assert '"timezone": "UTC"' in output(part) or "UTC" in output(part)
    assert isinstance(part.state, ToolCompleted)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_streamable_http_with_headers_from_the_environment(
    tmp_path: Path, project: Path, everything: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    env = {**os.environ, "PORT": str(port)}
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, before any await
        ["node", str(everything), "streamableHttp"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            await trio.sleep(0.1)
        monkeypatch.setenv("DOCS_TOKEN", "tok-123456789")
        url = f"http://127.0.0.1:{port}/mcp"
        servers = {
            "docs": McpServerSpec(url=url, headers={"Authorization": "Bearer ${DOCS_TOKEN}"}),
            "nokey": McpServerSpec(url=url, headers={"Authorization": "Bearer ${NO_SUCH_VAR}"}),
        }
        turns = [call("docs_echo", message="over http"), {"text": "done"}]
        async with harness(tmp_path, turns, servers) as (h, _):
            session = await run(h, project)
            [part] = parts(h, session)
            failed = [e for e in events(h) if e.type == "mcp.failed"]
        assert output(part) == "Echo: over http"
        assert [e.data["server"] for e in failed] == ["nokey"]
        assert "${NO_SUCH_VAR} is not set" in failed[0].data["reason"]
    finally:
        process.terminate()
        process.wait(10)


# --- permissions ------------------------------------------------------------------------------


async def test_every_call_goes_through_the_gate_by_its_full_name(
    tmp_path: Path, project: Path, marker: str
) -> None:
    note = project / "note.txt"
    servers = {"basic": server("basic", marker)}
    write = call("basic_note", path=str(note), text="hi")
    # Nobody to ask: the default for a tool without readOnlyHint is ask, so it is refused.
    async with harness(tmp_path, [write, {"text": "no"}], servers) as (h, _):
        session = await run(h, project)
        [part] = parts(h, session)
        decided = [e.data for e in events(h, "permission.")]
    assert "rejected" in output(part) and not note.exists()
    # What was asked shows what the call would do: its arguments.
    asked = json.dumps({"path": str(note), "text": "hi"}, separators=(",", ":"))
    assert any(d.get("pattern") == asked for d in decided), decided
    # A rule by the full name allows it (the config layer, as [permission] would).
    allow = [Rule(permission="basic_note", pattern="*", action="allow")]
    async with harness(tmp_path, [write, {"text": "ok"}], servers, rules=allow) as (h, _):
        session = await run(h, project)
        [part] = parts(h, session)
    assert output(part) == "wrote 2 characters" and note.read_text() == "hi"
    # readOnlyHint is allowed in build; a deny rule still wins over it.
    echo = call("basic_echo", text="x")
    deny = [Rule(permission="basic_echo", pattern="*", action="deny")]
    async with harness(tmp_path, [echo, echo, {"text": "ok"}], servers) as (h, _):
        session = await run(h, project)
        assert output(parts(h, session)[0]) == "echo: x"
    async with harness(tmp_path, [echo, {"text": "ok"}], servers, rules=deny) as (h, p):
        session = await run(h, project)
        [part] = parts(h, session)
        assert "basic_echo" not in offered(p, 0)  # a blanket deny hides it
    assert "denies" in output(part)


async def test_the_plan_agent_denies_mcp_tools_that_are_not_read_only(
    tmp_path: Path, project: Path, marker: str
) -> None:
    note = project / "note.txt"
    turns = [
        call("basic_echo", text="x"),
        call("basic_note", path=str(note), text="hi"),
        {"text": "ok"},
    ]
    async with harness(tmp_path, turns, {"basic": server("basic", marker)}) as (h, p):
        session = await run(h, project, agent="plan")
        done = parts(h, session)
        tools = offered(p, 0)
    assert output(done[0]) == "echo: x"
    assert "denies" in output(done[1]) and not note.exists()
    assert "basic_echo" in tools and "basic_note" not in tools


# --- failures, timeouts, restarts -----------------------------------------------------------


async def test_a_server_that_fails_to_start_is_an_event_and_the_turn_goes_on(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {"broken": server("broken", marker), "basic": server("basic", marker)}
    turns = [call("basic_echo", text="still here"), {"text": "done"}]
    async with harness(tmp_path, turns, servers) as (h, _):
        session = await run(h, project)
        [part] = parts(h, session)
        [failed] = [e for e in events(h) if e.type == "mcp.failed"]
        status = {s.name: s for s in h_status(h)}
    assert output(part) == "echo: still here"
    assert failed.data["server"] == "broken" and failed.session_id == session
    assert "exited with code 3" in failed.data["reason"]
    assert "missing configuration FOO" in failed.data["reason"]
    assert status["broken"].state == "failed" and "FOO" in (status["broken"].last_error or "")


def h_status(h: Harness) -> list[Any]:
    services = h._supervisor._services  # the hub of the harness under test
    assert services.mcp is not None
    return services.mcp.status()


async def test_the_startup_timeout_is_honoured_and_said(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {"late": server("slow_start", marker, "30", startup_timeout=0.5)}
    started = time.monotonic()
    async with harness(tmp_path, [{"text": "done"}], servers) as (h, _):
        await run(h, project)
        [failed] = [e for e in events(h) if e.type == "mcp.failed"]
    assert failed.data["reason"] == "did not start within 0.5 s (startup_timeout)"
    assert time.monotonic() - started < 15


async def test_the_call_timeout_is_honoured_and_said(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {"basic": server("basic", marker, timeout=0.5)}
    turns = [call("basic_slow", seconds=30), call("basic_echo", text="after"), {"text": "ok"}]
    allow = [Rule(permission="basic_slow", pattern="*", action="allow")]
    async with harness(tmp_path, turns, servers, rules=allow) as (h, _):
        started = time.monotonic()
        session = await run(h, project)
        took = time.monotonic() - started
        slow, echo = parts(h, session)
    assert "did not answer 'slow' within 0.5 s (its timeout)" in output(slow)
    assert output(echo) == "echo: after"  # the server is still up
    assert took < 10


async def test_a_server_that_dies_is_an_event_a_clear_error_and_restarted_on_next_use(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {"basic": server("basic", marker)}
    turns = [call("basic_pid"), call("basic_crash"), call("basic_pid"), {"text": "ok"}]
    allow = [Rule(permission="basic_crash", pattern="*", action="allow")]
    async with harness(tmp_path, turns, servers, rules=allow) as (h, _):
        session = await run(h, project)
        first, crash, second = parts(h, session)
        kinds = [(e.type, e.data.get("reason", "")) for e in events(h)]
    assert "stopped during 'crash'" in output(crash) and "exited with code 7" in output(crash)
    assert "started again on next use" in output(crash)
    assert output(first).isdigit() and output(second).isdigit()
    assert output(first) != output(second)
    types = [kind for kind, _ in kinds]
    assert types.count("mcp.started") == 2
    assert ("mcp.exited", "exited with code 7") in kinds


async def test_results_text_images_resources_structured_errors_huge(
    tmp_path: Path, project: Path, marker: str
) -> None:
    names = ["image", "resource", "structured", "fail", "huge", "resources"]
    turns = [
        call("basic_image"),
        call("basic_resource"),
        call("basic_structured", city="Paris"),
        call("basic_fail", why="no luck"),
        call("basic_huge"),
        call("basic_resources"),
        call("basic_resources", uri="memo://one"),
        {"text": "ok"},
    ]
    allow = [Rule(permission=f"basic_{n}", pattern="*", action="allow") for n in names]
    async with harness(tmp_path, turns, {"basic": server("basic", marker)}, rules=allow) as (
        h,
        _,
    ):
        session = await run(h, project)
        image, resource, structured, fail, huge, listing, read = parts(h, session)
    assert output(image) == "a tiny image\n[image: image/png, 68 bytes]"
    assert output(resource) == "[resource: memo://one (text/plain)]\nmemo text"
    assert json.loads(output(structured)) == {"city": "Paris", "temperature": 21}
    assert output(fail) == "ERROR: it failed: no luck"
    assert isinstance(huge.state, ToolCompleted)
    assert "truncated" in huge.state.output and len(huge.state.output) < 60_000
    saved = tmp_path / "home" / "tool-output" / f"{huge.call_id}.txt"
    assert saved.read_text().count("\n") == 5000
    assert "memo://one (text/plain)" in output(listing)
    assert output(read).endswith("memo text")


async def test_bad_schemas_are_left_out_with_a_warning(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {
        "raw": McpServerSpec(command=[sys.executable, str(RAW_SERVER), f"--marker={marker}"]),
        "bad": server("bad_schema", marker),
    }
    turns = [call("raw_good", x=21), {"text": "ok"}]
    allow = [Rule(permission="raw_good", pattern="*", action="allow")]
    async with harness(tmp_path, turns, servers, rules=allow) as (h, provider):
        session = await run(h, project)
        [part] = parts(h, session)
        warnings = {(e.data["server"], e.data["tool"]) for e in events(h, "mcp.warning")}
        tools = offered(provider, 0)
    assert output(part) == "42"
    assert warnings == {("raw", "stringly"), ("raw", "itemless"), ("bad", "bad")}
    assert "raw_good" in tools and "bad_good" in tools
    assert not {"raw_stringly", "raw_itemless", "bad_bad"} & set(tools)


async def test_list_changed_refreshes_the_tools_at_the_next_step(
    tmp_path: Path, project: Path, marker: str
) -> None:
    turns = [call("changing_grow"), call("changing_extra"), {"text": "ok"}]
    # Only grow is allowed by a rule: the new tool's readOnlyHint default applies at once.
    allow = [Rule(permission="changing_grow", pattern="*", action="allow")]
    servers = {"changing": server("list_changed", marker)}
    async with harness(tmp_path, turns, servers, rules=allow) as (h, provider):
        session = await run(h, project)
        grow, extra = parts(h, session)
        first, second = offered(provider, 0), offered(provider, 1)
    assert output(grow) == "grown" and output(extra) == "extra here"
    assert "changing_extra" not in first and "changing_extra" in second


async def test_tool_search_mode_past_the_threshold(
    tmp_path: Path, project: Path, marker: str
) -> None:
    turns = [
        call("mcp_search", query="say text back"),
        call("basic_echo", text="found"),
        {"text": "ok"},
    ]
    servers = {"basic": server("basic", marker)}
    async with harness(tmp_path, turns, servers, mcp_search_threshold=100) as (h, provider):
        session = await run(h, project)
        search, echo = parts(h, session)
        first, second = offered(provider, 0), offered(provider, 1)
    assert "mcp_search" in first
    assert [t for t in first if t.startswith("basic_")] == ["basic_resources"]
    assert "basic_echo" in output(search) and '"text"' in output(search)
    assert "basic_echo" in second
    assert output(echo) == "echo: found"


async def test_under_the_threshold_every_schema_is_offered(
    tmp_path: Path, project: Path, marker: str
) -> None:
    async with harness(tmp_path, [{"text": "ok"}], {"basic": server("basic", marker)}) as (
        h,
        provider,
    ):
        await run(h, project)
        tools = offered(provider, 0)
    assert "mcp_search" not in tools and "basic_echo" in tools and "basic_huge" in tools


# --- cancellation and processes -------------------------------------------------------------


async def test_a_cancel_sends_notifications_cancelled_and_returns_at_once(
    tmp_path: Path, project: Path, marker: str
) -> None:
    flag = tmp_path / "slow.log"
    turns = [call("basic_slow", seconds=60, marker=str(flag)), {"text": "ok"}]
    allow = [Rule(permission="basic_slow", pattern="*", action="allow")]
    async with harness(tmp_path, turns, {"basic": server("basic", marker)}, rules=allow) as (
        h,
        _,
    ):
        created = await h.create_session(project)
        await h.prompt(created.id, "go")
        with trio.fail_after(30):
            while not flag.exists():
                await trio.sleep(0.02)
        started = time.monotonic()
        assert await h.cancel(created.id)
        with trio.fail_after(10):
            while h.session(created.id).status == "busy":
                await trio.sleep(0.01)
        took = time.monotonic() - started
        with trio.fail_after(10):
            while "cancelled" not in flag.read_text():
                await trio.sleep(0.02)
        [part] = parts(h, created.id)
    assert took < 1.0
    assert isinstance(part.state, ToolError) and "cancel" in part.state.error


async def test_a_server_ignoring_sigterm_is_killed_with_its_group(
    tmp_path: Path, project: Path, marker: str
) -> None:
    turns = [call("stubborn_pid"), {"text": "ok"}]
    async with harness(tmp_path, turns, {"stubborn": server("stubborn", marker)}) as (h, _):
        await run(h, project)
        group = live_processes(marker)
        assert len(group) == 2 and len(set(group.values())) == 1  # the server and its child
        started = time.monotonic()
    took = time.monotonic() - started
    assert live_processes(marker) == {}
    assert took < 5


def test_no_sdk_import_without_a_server(tmp_path: Path, project: Path) -> None:
    script = (
        "import sys, trio\n"
        "from harness.config import Config\n"
        "from harness.providers.scripted import ScriptedProvider\n"
        "from harness.runtime import open_harness\n"
        "async def main():\n"
        "    p = ScriptedProvider.from_turns([{'text': 'hi'}])\n"
        f"    c = Config(home={str(tmp_path / 'h')!r}, model='scripted:x', interactive=False,"
        " provider_factory=lambda m: p)\n"
        "    async with open_harness(c) as h:\n"
        f"        s = await h.create_session({str(project)!r})\n"
        "        await h.run(s.id, 'go')\n"
        "trio.run(main)\n"
        # The SDK and the client actor; harness.mcp.spec (the config file's model of a
        # server, pydantic only) comes with the configuration files' models.
        "ours = ('mcp.', 'harness.actors.mcp', 'harness.mcp.stdio', 'harness.tools.mcp')\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(ours)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# --- durability: kill -9 and a restart ------------------------------------------------------


def _crash_mid_call(
    tmp_path: Path, project: Path, servers: dict[str, McpServerSpec], turns: list[Any], flag: Path
) -> str:
    """Run a harness in a child process until the MCP call has started, then SIGKILL it."""
    setup = {
        "home": str(tmp_path / "home"),
        "project": str(project),
        "turns": turns,
        "servers": {name: spec.model_dump() for name, spec in servers.items()},
    }
    child = subprocess.Popen(
        [sys.executable, str(TESTS / "mcp_crash_child.py"), json.dumps(setup)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    session_id = child.stdout.readline().strip()
    deadline = time.monotonic() + 60
    while not (flag.exists() and "started" in flag.read_text()):
        assert time.monotonic() < deadline and child.poll() is None, "the call never started"
        time.sleep(0.02)
    child.kill()
    child.wait(10)
    return session_id


async def test_kill_9_then_restart_reaps_the_servers_and_shows_the_call_interrupted(
    tmp_path: Path, project: Path, marker: str
) -> None:
    flag = tmp_path / "write.log"
    servers = {"basic": server("basic", marker), "stubborn": server("stubborn", marker)}
    turns = [call("basic_slow_write", seconds=60, marker=str(flag)), {"text": "after"}]
    session_id = _crash_mid_call(tmp_path, project, servers, turns, flag)
    # Deaf to a closed stdin and to SIGTERM: still running with no harness.
    left = live_processes(marker)
    assert any("stubborn" in Path(f"/proc/{pid}/cmdline").read_text() for pid in left)
    allow = [Rule(permission="*", pattern="*", action="allow")]
    async with harness(tmp_path, turns, servers, rules=allow) as (h, _):
        # Reaped at start (SIGKILLed: gone as soon as the kernel has torn them down).
        with trio.fail_after(5):
            while set(left) & set(live_processes(marker)):
                await trio.sleep(0.02)
        with trio.fail_after(60):
            while h.session(session_id).status != "idle" or not h.ledger.messages(session_id):
                await trio.sleep(0.05)
            while not any(e.type == "turn.finished" for e in h.ledger.events_after(0)):
                await trio.sleep(0.05)
        [part] = parts(h, session_id)
        reaped = [e for e in events(h) if e.type == "mcp.exited" and "reaped" in e.data["reason"]]
    assert isinstance(part.state, ToolError) and "restart" in part.state.error
    assert flag.read_text() == "started\n"  # not run again: it may have written already
    assert {e.data["server"] for e in reaped} == {"basic", "stubborn"}
    assert next(e for e in reaped if e.data["server"] == "stubborn").data["killed"] == 2


async def test_an_idempotent_mcp_call_is_run_again_after_a_crash(
    tmp_path: Path, project: Path, marker: str
) -> None:
    flag = tmp_path / "slow.log"
    servers = {"basic": server("basic", marker)}
    turns = [call("basic_slow", seconds=2, marker=str(flag)), {"text": "after"}]
    session_id = _crash_mid_call(tmp_path, project, servers, turns, flag)
    allow = [Rule(permission="*", pattern="*", action="allow")]
    async with harness(tmp_path, turns, servers, rules=allow) as (h, _):
        with trio.fail_after(60):
            while not any(e.type == "turn.finished" for e in h.ledger.events_after(0)):
                await trio.sleep(0.05)
        [part] = parts(h, session_id)
    assert output(part) == "slept 2.0"
    assert flag.read_text().count("started") == 2


# --- harness mcp ----------------------------------------------------------------------------


def test_the_mcp_command_reports_each_server(tmp_path: Path, marker: str) -> None:
    python = sys.executable
    config = tmp_path / "config.toml"
    config.write_text(
        f'[mcp.basic]\ncommand = ["{python}", "{SERVERS}", "basic", "--marker={marker}"]\n'
        f'[mcp.raw]\ncommand = ["{python}", "{RAW_SERVER}", "--marker={marker}"]\n'
        '[mcp.gone]\ncommand = ["no-such-mcp-binary"]\n'
        '[mcp.off]\nurl = "http://127.0.0.1:9/mcp"\nenabled = false\n'
    )
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HARNESS_HOME": str(tmp_path / "h")}
    command = [python, "-m", "harness", "mcp", "--dir", str(tmp_path)]
    result = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    servers = {s["name"]: s for s in report["servers"]}
    assert servers["basic"]["state"] == "running" and servers["basic"]["tools"] == 11
    assert servers["basic"]["schema_tokens"] > 100 and servers["basic"]["prompts"] == ["review"]
    assert servers["raw"]["tools"] == 1 and len(servers["raw"]["warnings"]) == 2
    assert servers["gone"]["state"] == "failed"
    assert "not found: no-such-mcp-binary" in servers["gone"]["last_error"]
    assert servers["off"]["state"] == "disabled"
    assert report["tool_search"] is False and report["search_threshold"] == 10_000
    text = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120).stdout
    assert "basic" in text and "prompts: review" in text and "tool search off" in text


def test_a_daemon_shares_its_servers_and_reports_them_live(
    tmp_path: Path, project: Path, socket_dir: Path, marker: str
) -> None:
    python = sys.executable
    config = tmp_path / "config.toml"
    config.write_text(
        f'[mcp.basic]\ncommand = ["{python}", "{SERVERS}", "basic", "--marker={marker}"]\n'
        '[mcp.gone]\ncommand = ["no-such-mcp-binary"]\n'
    )
    socket_path = socket_dir / "h.sock"
    env = {
        **os.environ,
        "HARNESS_CONFIG": str(config),
        "HARNESS_HOME": str(tmp_path / "home"),
        "HARNESS_SOCKET": str(socket_path),
    }
    turns = tmp_path / "turns.json"
    turns.write_text(json.dumps([call("basic_pid"), {"text": "ok"}]))
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen([python, "-m", "harness", "serve"], stderr=out, env=env)
    try:
        client = wait_for_daemon(daemon, socket_path, log, 30)
        before = {s["name"]: s["state"] for s in client.mcp()["servers"]}
        assert before == {"basic": "idle", "gone": "idle"}  # lazily: no turn yet
        pids = set()
        for _ in range(2):  # two sessions, one server process
            session = client.create_session(directory=str(project), model=f"scripted:{turns}")
            client.prompt(session["id"], "go")
            deadline = time.monotonic() + 60
            while not any(
                p.get("tool") == "basic_pid" and p["state"]["status"] == "completed"
                for m in client.messages(session["id"])
                for p in m["parts"]
            ):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            pids |= {
                p["state"]["output"]
                for m in client.messages(session["id"])
                for p in m["parts"]
                if p.get("tool") == "basic_pid"
            }
        assert len(pids) == 1
        command = [python, "-m", "harness", "mcp", "--json"]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        servers = {s["name"]: s for s in json.loads(result.stdout)["servers"]}
        assert servers["basic"]["state"] == "running" and servers["basic"]["tools"] == 11
        assert servers["gone"]["state"] == "failed"
        assert "no-such-mcp-binary" in servers["gone"]["last_error"]
    finally:
        daemon.terminate()
        daemon.wait(30)


def _http_everything(everything: Path, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        ["node", str(everything), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the HTTP server never listened")


async def test_an_http_server_that_goes_away_is_reconnected_on_next_use(
    tmp_path: Path, everything: Path, tool_context: Any
) -> None:
    from harness.actors.mcp_client import McpHub
    from harness.tools.base import ToolFailure, parse_arguments

    port = _free_port()
    process = _http_everything(everything, port)
    ledger = Ledger(tmp_path / "ledger.db")
    spec = McpServerSpec(url=f"http://127.0.0.1:{port}/mcp", timeout=10)
    hub = McpHub({"web": spec}, ledger=ledger, home=tmp_path, search_threshold=10_000)
    ctx = tool_context(tmp_path)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run_writer, None)
            await nursery.start(hub.run)
            await hub.prepare("ses_x", tmp_path)
            echo = hub.tools()["web_echo"]
            args, _ = parse_arguments(echo.params, {"message": "one"})
            assert (await echo.execute(args, ctx)).output == "Echo: one"
            process.kill()
            process.wait(10)
            with pytest.raises(ToolFailure, match=r"stopped during 'echo'.*started again"):
                await echo.execute(args, ctx)
            assert hub.clients["web"].state == "exited"
            process = _http_everything(everything, port)
            assert (await echo.execute(args, ctx)).output == "Echo: one"
            assert hub.clients["web"].state == "running"
            nursery.cancel_scope.cancel()
    finally:
        process.kill()
        process.wait(10)
        ledger.close()


def test_headers_are_sent_with_variables_expanded(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    monkeypatch.setenv("DOCS_TOKEN", "tok-abcdefghijkl")
    url = f"http://127.0.0.1:{http.server_port}/mcp"
    servers = {"docs": McpServerSpec(url=url, headers={"Authorization": "Bearer ${DOCS_TOKEN}"})}

    async def main() -> list[Event]:
        async with harness(tmp_path, [{"text": "ok"}], servers) as (h, _):
            await run(h, project)
            return [e for e in events(h) if e.type == "mcp.failed"]

    try:
        failed = trio.run(main)
    finally:
        http.shutdown()
    assert seen and seen[0] == "Bearer tok-abcdefghijkl"
    assert failed and failed[0].data["server"] == "docs"
    # The token is a credential: the ledger never holds it.
    assert "tok-abcdefghijkl" not in json.dumps([e.data for e in failed])


def test_harness_run_says_when_a_server_fails(tmp_path: Path, project: Path, marker: str) -> None:
    python = sys.executable
    config = tmp_path / "config.toml"
    config.write_text(
        f'[mcp.broken]\ncommand = ["{python}", "{SERVERS}", "broken", "--marker={marker}"]\n'
        f'[mcp.raw]\ncommand = ["{python}", "{RAW_SERVER}", "--marker={marker}"]\n'
    )
    turns = tmp_path / "turns.json"
    turns.write_text(json.dumps([call("raw_good", x=2), {"text": "the answer"}]))
    env = {
        **os.environ,
        "HARNESS_CONFIG": str(config),
        "HARNESS_HOME": str(tmp_path / "home"),
        "HARNESS_SOCKET": str(tmp_path / "no.sock"),
    }
    result = subprocess.run(
        [python, "-m", "harness", "run", "--model", f"scripted:{turns}", "--yes", "go"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "the answer"
    assert "! MCP server broken failed to start: exited with code 3" in result.stderr
    assert "! MCP server raw: tool 'stringly'" in result.stderr
    assert "✓ raw_good" in result.stderr


async def test_a_line_that_is_not_json_on_stdout_does_not_break_the_server(
    tmp_path: Path, project: Path, marker: str
) -> None:
    command = [sys.executable, str(RAW_SERVER), "--noisy", f"--marker={marker}"]
    turns = [call("raw_good", x=5), {"text": "ok"}]
    allow = [Rule(permission="raw_good", pattern="*", action="allow")]
    async with harness(tmp_path, turns, {"raw": McpServerSpec(command=command)}, rules=allow) as (
        h,
        _,
    ):
        session = await run(h, project)
        [part] = parts(h, session)
    assert output(part) == "10"


async def test_tools_loaded_by_search_are_remembered_by_a_restarted_harness(
    tmp_path: Path, project: Path, marker: str
) -> None:
    servers = {"basic": server("basic", marker)}
    turns = [call("mcp_search", query="select:basic_pid"), {"text": "ok"}, {"text": "again"}]
    async with harness(tmp_path, turns, servers, mcp_search_threshold=0) as (h, _):
        session = await run(h, project)
    async with harness(tmp_path, turns, servers, mcp_search_threshold=0) as (h, provider):
        with trio.fail_after(60):
            await h.run(session, "and now")
        tools = offered(provider, 0)
    assert "basic_pid" in tools and "basic_echo" not in tools

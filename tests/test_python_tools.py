"""Python tools (issue 15 item 5, DESIGN §12) through the real loop.

``@harness.tool`` functions given to a real harness (``Config(tools=[...])``), called by
a scripted model: sync and async, with the context, raising, cancelled mid-await, given
bad arguments, clashing with a built-in. The config-file route (``tools = [...]``) is
tested through real ``harness run`` and ``harness serve`` subprocesses with the tools'
module on a temporary ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Annotated, Any

import pytest
import trio
import trio.lowlevel
from cli_runs import run_harness as _harness
from conftest import ScriptedHarness, ToolParts
from pydantic import BaseModel, Field

import harness
from harness.messages.model import Rule, ToolCompleted, ToolError
from harness.runtime import Harness

ALLOW_ALL = [Rule(permission="*", pattern="*", action="allow")]


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "callPy001") -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments, "id": call_id}]}


async def run(h: Harness, directory: Path, text: str = "go") -> tuple[str, Any]:
    session = await h.create_session(directory)
    result = await h.run(session.id, text)
    return session.id, result


# --- the schema the model sees ---------------------------------------------------------------


class Priority(BaseModel):
    level: int = Field(ge=1, le=5)
    reason: str = ""


@harness.tool
async def ticket(
    ctx: harness.ToolContext,
    number: Annotated[int, Field(ge=1, description="the ticket's number")],
    priority: Priority | None = None,
) -> str:
    """Fetch an issue from our tracker by number."""
    return f"ticket {number} for {ctx.session_id}"


def test_the_schema_comes_from_the_signature_and_the_context_is_left_out() -> None:
    assert ticket.name == "ticket"
    assert ticket.description == "Fetch an issue from our tracker by number."
    schema = ticket.params.model_json_schema()
    assert set(schema["properties"]) == {"number", "priority"}
    assert schema["required"] == ["number"]
    assert schema["properties"]["number"]["description"] == "the ticket's number"
    assert schema["properties"]["number"]["minimum"] == 1
    assert schema["additionalProperties"] is False
    # Still the function: a test of the tool calls it directly.
    assert ticket.__name__ == "ticket" and ticket.__doc__ is not None


# --- sync, async, context, output ------------------------------------------------------------


async def test_a_sync_tool_runs_in_a_worker_thread_and_returns_json(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    threads: list[int] = []

    @harness.tool(permission="allow")
    def add(a: int, b: int = 2) -> dict[str, int]:
        """Add two numbers."""
        threads.append(threading.get_ident())
        return {"sum": a + b}

    turns = [call("add", {"a": 40}), {"text": "done"}]
    async with scripted_harness(turns, tools=[add]) as (h, provider):
        sid, result = await run(h, project)
        [part] = tool_parts(h, sid)
    assert (result.reason, result.answer) == ("answered", "done")
    assert isinstance(part.state, ToolCompleted), part.state
    assert json.loads(part.state.output) == {"sum": 42}
    assert threads and threads[0] != threading.get_ident()  # not on the Trio thread
    spec = next(t for t in provider.requests[0].tools if t.name == "add")
    assert spec.description == "Add two numbers."
    assert spec.parameters["required"] == ["a"]
    # The model read the output as the call's result.
    result_message = provider.requests[1].messages[-1]
    assert '{"sum":42}' in getattr(result_message, "content", "")


async def test_an_async_tool_gets_its_context(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    seen: list[harness.ToolContext] = []

    @harness.tool
    async def where(ctx: harness.ToolContext, label: str) -> str:
        """Say where the call runs."""
        await trio.lowlevel.checkpoint()
        seen.append(ctx)
        return f"{label}: {ctx.directory}"

    turns = [call("where", {"label": "here"}, "callWhere1"), {"text": "ok"}]
    async with scripted_harness(turns, tools=[where], rules=ALLOW_ALL) as (h, provider):
        sid, result = await run(h, project)
        [part] = tool_parts(h, sid)
    assert result.reason == "answered"
    assert isinstance(part.state, ToolCompleted)
    assert part.state.output == f"here: {project.resolve()}"
    [ctx] = seen
    assert (ctx.session_id, ctx.call_id) == (sid, part.call_id)
    assert ctx.directory == project.resolve()
    spec = next(t for t in provider.requests[0].tools if t.name == "where")
    assert list(spec.parameters["properties"]) == ["label"]


async def test_a_long_output_is_truncated_like_every_tools(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    @harness.tool(permission="allow")
    def lines(count: int) -> str:
        """Print numbered lines."""
        return "\n".join(f"line {i}" for i in range(count))

    turns = [call("lines", {"count": 5000}), {"text": "ok"}]
    async with scripted_harness(turns, tools=[lines]) as (h, _):
        sid, _result = await run(h, project)
        [part] = tool_parts(h, sid)
    assert isinstance(part.state, ToolCompleted)
    assert part.state.metadata["truncated"] is True
    assert "lines truncated" in part.state.output and "line 1999" in part.state.output
    assert "line 2000\n" not in part.state.output
    saved = Path(part.state.metadata["output_path"])
    assert saved.read_text().endswith("line 4999")


# --- failures the model reads ----------------------------------------------------------------


async def test_an_exception_is_a_one_line_error_and_the_turn_goes_on(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    @harness.tool(permission="allow")
    async def lookup(number: int) -> str:
        """Look a ticket up."""
        raise LookupError(f"no ticket {number}\nin the tracker")

    @harness.tool(permission="allow")
    def opaque() -> object:
        """Return something JSON cannot carry."""
        return object()

    turns = [
        {"tool_calls": [{"name": "lookup", "arguments": {"number": 7}}, {"name": "opaque"}]},
        {"text": "it does not exist"},
    ]
    async with scripted_harness(turns, tools=[lookup, opaque]) as (h, provider):
        sid, result = await run(h, project)
        failed, unjsonable = tool_parts(h, sid)
    assert (result.reason, result.answer) == ("answered", "it does not exist")
    assert isinstance(failed.state, ToolError)
    assert failed.state.error == "LookupError: no ticket 7 in the tracker"
    assert isinstance(unjsonable.state, ToolError)
    assert "returned a object, which is not JSON-able" in unjsonable.state.error
    assert "Traceback" not in failed.state.error + unjsonable.state.error
    assert len(provider.requests) == 2  # the model saw the errors and answered


async def test_bad_arguments_from_the_model_never_reach_the_function(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    called: list[Any] = []

    @harness.tool(permission="allow")
    async def fetch(ctx: harness.ToolContext, number: Annotated[int, Field(ge=1)]) -> str:
        """Fetch a ticket."""
        called.append((ctx.session_id, number))
        return "fetched"

    turns = [
        {
            "tool_calls": [
                {"name": "fetch", "arguments": {"number": "seven"}, "id": "callBad001"},
                {"name": "fetch", "arguments": {"number": -3}, "id": "callBad002"},
                {"name": "fetch", "arguments": {}, "id": "callBad003"},
                {"name": "fetch", "arguments": "{not json", "id": "callBad004"},
                # The context cannot be forged: it is no argument, and is dropped.
                {"name": "fetch", "arguments": {"number": 5, "ctx": "forged"}, "id": "callOk0001"},
            ]
        },
        {"text": "ok"},
    ]
    async with scripted_harness(turns, tools=[fetch]) as (h, _):
        sid, result = await run(h, project)
        parts = {p.call_id: p for p in tool_parts(h, sid)}
    assert result.reason == "answered"
    errors = {
        key: part.state.error for key, part in parts.items() if isinstance(part.state, ToolError)
    }
    assert "invalid arguments for tool 'fetch': number:" in errors["callBad001"]
    assert "greater than or equal to 1" in errors["callBad002"]
    assert "number: Field required" in errors["callBad003"]
    assert "not valid JSON" in errors["callBad004"]
    ok = parts["callOk0001"].state
    assert isinstance(ok, ToolCompleted)
    assert ok.output.startswith("fetched") and "ignored arguments" in ok.output
    assert called == [(sid, 5)]


# --- cancellation ----------------------------------------------------------------------------


async def test_a_cancel_reaches_an_async_tool_mid_await(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    started = trio.Event()
    outcome: list[str] = []

    @harness.tool(permission="allow")
    async def slow() -> str:
        """Wait a long time."""
        started.set()
        try:
            await trio.sleep(300)
        except trio.Cancelled:
            outcome.append("cancelled")
            raise
        return "never"

    turns = [call("slow", {}, "callSlow01"), {"text": "never sent"}]
    async with scripted_harness(turns, tools=[slow]) as (h, provider):
        session = await h.create_session(project)
        results: list[Any] = []

        async def go() -> None:
            results.append(await h.run(session.id, "wait"))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(go)
                await started.wait()
                before = trio.current_time()
                assert await h.cancel(session.id)
        assert trio.current_time() - before < 2
        [part] = tool_parts(h, session.id)
    assert outcome == ["cancelled"]
    assert results[0].reason == "cancelled"
    assert isinstance(part.state, ToolError) and part.state.error == "cancelled"
    assert len(provider.requests) == 1


async def test_a_cancel_does_not_wait_for_a_sync_tools_thread(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    entered = threading.Event()
    release = threading.Event()

    @harness.tool(permission="allow")
    def blocking() -> str:
        """Block until released."""
        entered.set()
        release.wait(30)
        return "late"

    turns = [call("blocking", {}), {"text": "never sent"}]
    async with scripted_harness(turns, tools=[blocking]) as (h, _):
        session = await h.create_session(project)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.run, session.id, "block")
            await trio.to_thread.run_sync(entered.wait, 10)
            with trio.fail_after(5):
                assert await h.cancel(session.id)
                while h.session(session.id).status != "idle":
                    await trio.sleep(0.01)
        release.set()
        [part] = tool_parts(h, session.id)
    assert isinstance(part.state, ToolError) and part.state.error == "cancelled"


# --- permission --------------------------------------------------------------------------------


async def test_the_permission_is_the_tools_name(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    ran: list[str] = []

    @harness.tool
    def deploy(target: str) -> str:
        """Deploy somewhere."""
        ran.append(target)
        return "deployed"

    @harness.tool(permission="allow")
    def status() -> str:
        """Report the status."""
        ran.append("status")
        return "green"

    turns = [call("status", {}), call("deploy", {"target": "prod"}), {"text": "never"}]
    # `ask` by default, and nobody can be asked: the deploy is denied.
    async with scripted_harness(turns, tools=[deploy, status]) as (h, _):
        sid, result = await run(h, project)
        status_part, deploy_part = tool_parts(h, sid)
        assert isinstance(status_part.state, ToolCompleted)
        events = h.ledger.events_after(0, session_ids=[sid], limit=100_000)
        decided = [e for e in events if e.type == "permission.decided"]
    assert result.reason == "denied"
    assert ran == ["status"]
    assert isinstance(deploy_part.state, ToolError)
    assert "--allow 'deploy" in deploy_part.state.error
    assert [d.data["permission"] for d in decided] == ["status", "deploy"]
    # A rule allows it by name; a rule also beats the decorator's `allow`.
    ran.clear()
    rules = [
        Rule(permission="deploy", pattern="*", action="allow"),
        Rule(permission="status", pattern="*", action="deny"),
    ]
    turns = [call("deploy", {"target": "staging"}), {"text": "shipped"}]
    async with scripted_harness(turns, tools=[deploy, status], rules=rules) as (h, provider):
        sid, result = await run(h, project)
    assert (result.reason, ran) == ("answered", ["staging"])
    assert "status" not in {t.name for t in provider.requests[0].tools}  # denied: hidden


# --- the tool table ----------------------------------------------------------------------------


async def test_a_name_clash_with_a_built_in_is_an_error_unless_it_replaces_it(
    scripted_harness: ScriptedHarness, project: Path, tool_parts: ToolParts
) -> None:
    @harness.tool
    def read(path: str) -> str:
        """Read from our store."""
        return f"stored {path}"

    with pytest.raises(harness.ToolDefinitionError, match=r"tools\[0\]: 'read' is the name of a"):
        async with scripted_harness([], tools=[read]):
            pass

    @harness.tool(name="read", replaces=True)
    def read_store(path: str) -> str:
        """Read from our store."""
        return f"stored {path}"

    turns = [call("read", {"path": "a/b"}), {"text": "ok"}]
    async with scripted_harness(turns, tools=[read_store]) as (h, provider):
        sid, result = await run(h, project)
        [part] = tool_parts(h, sid)
    assert result.reason == "answered"
    assert isinstance(part.state, ToolCompleted) and part.state.output == "stored a/b"
    [spec] = [t for t in provider.requests[0].tools if t.name == "read"]
    assert spec.description == "Read from our store."

    @harness.tool(name="reed", replaces=True)
    def typo(path: str) -> str:
        """Read."""
        return path

    with pytest.raises(harness.ToolDefinitionError, match="none has that name"):
        async with scripted_harness([], tools=[typo]):
            pass
    with pytest.raises(harness.ToolDefinitionError, match=r"tools\[1\]: a second tool named"):
        async with scripted_harness([], tools=[ticket, ticket]):
            pass


def test_functions_that_cannot_be_tools_say_why() -> None:
    def undocumented(x: int) -> int:
        return x

    def variadic(*args: int) -> int:
        """Sum."""
        return sum(args)

    async def stream() -> Any:
        """Stream."""
        yield 1

    cases = [
        (undocumented, "no docstring"),
        (variadic, "*args has no schema"),
        (stream, "an async generator is not a tool"),
    ]
    for function, message in cases:
        with pytest.raises(harness.ToolDefinitionError, match=message.replace("*", r"\*")):
            harness.tool(function)
    with pytest.raises(harness.ToolDefinitionError, match="tool name 'bad name'"):
        harness.tool(name="bad name")(ticket.function)
    with pytest.raises(harness.ToolDefinitionError, match="permission= cannot change it"):
        harness.tool(name="read", replaces=True, permission="allow")(ticket.function)


async def test_a_plain_function_and_a_module_path_are_tools_too(
    scripted_harness: ScriptedHarness,
    project: Path,
    tool_parts: ToolParts,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def shout(text: str) -> str:
        """Shout the text."""
        return text.upper()

    pkg = tmp_path / "pylib" / "teamtools"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "words.py").write_text(
        "import harness\n\n"
        "@harness.tool(permission='allow')\n"
        "def whisper(text: str) -> str:\n"
        '    """Whisper the text."""\n'
        "    return text.lower()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pylib"))
    turns = [
        {
            "tool_calls": [
                {"name": "shout", "arguments": {"text": "Hi"}},
                {"name": "whisper", "arguments": {"text": "Hi"}},
            ]
        },
        {"text": "ok"},
    ]
    tools = [shout, "teamtools.words:whisper"]
    async with scripted_harness(turns, tools=tools, rules=ALLOW_ALL) as (h, _):
        sid, _result = await run(h, project)
        outputs = [getattr(p.state, "output", p.state) for p in tool_parts(h, sid)]
    assert outputs == ["HI", "hi"]
    for entry, message in [
        ("teamtools.nothere:x", "cannot import teamtools.nothere: ModuleNotFoundError"),
        ("teamtools.words:missing", "has no attribute 'missing'"),
        ("teamtools.words:harness", "not a tool or a function, but a module"),
        ("no-colon", "expected 'package.module:function'"),
    ]:
        with pytest.raises(harness.ToolDefinitionError, match=message):
            async with scripted_harness([], tools=[entry]):
                pass


# --- configuration files: `harness run` and the daemon -----------------------------------------


TOOLS_MODULE = """\
import os

import harness


@harness.tool(permission="allow")
async def shout(ctx: harness.ToolContext, text: str) -> dict:
    \"\"\"Shout the text back, with the process that ran it.\"\"\"
    return {"text": text.upper(), "pid": os.getpid(), "session": ctx.session_id}
"""


def _cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(tmp_path / "no-daemon.sock")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env["PYTHONPATH"] = str(tmp_path / "pylib")
    env.update(extra)
    return env


def _setup_files(tmp_path: Path, tools: str) -> Path:
    """The tools' module on a PYTHONPATH of its own, and a global file naming ``tools``."""
    lib = tmp_path / "pylib" / "teamtools"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "__init__.py").write_text("")
    (lib / "loud.py").write_text(TOOLS_MODULE)
    script = tmp_path / "script.json"
    shout = {"name": "shout", "arguments": {"text": "hello"}, "id": "callShout1"}
    script.write_text(json.dumps([{"tool_calls": [shout]}, {"text": "shouted"}]))
    config = tmp_path / "xdg" / "harness" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'model = "scripted:{script}"\ntools = {tools}\n')
    return config


def _shout_output(env: dict[str, str], directory: Path) -> dict[str, Any]:
    sessions = json.loads(_harness(env, "sessions", "--json").stdout)
    shown = json.loads(_harness(env, "show", sessions[0]["id"], "--json").stdout)
    parts = [p for m in shown["messages"] for p in m["parts"] if p["type"] == "tool"]
    [part] = parts
    assert part["state"]["status"] == "completed", part
    output: dict[str, Any] = json.loads(part["state"]["output"])
    return output


def test_run_loads_tools_from_the_config_file(tmp_path: Path) -> None:
    _setup_files(tmp_path, '["teamtools.loud:shout"]')
    env = _cli_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = _harness(env, "run", "--dir", str(work), "shout hello")
    assert (done.returncode, done.stdout.strip()) == (0, "shouted"), done.stderr
    output = _shout_output(env, work)
    assert output["text"] == "HELLO" and output["pid"] != os.getpid()


def test_a_bad_tools_entry_stops_run_and_serve_with_one_line(
    tmp_path: Path, socket_dir: Path
) -> None:
    config = _setup_files(tmp_path, '["teamtools.loud:shout", "teamtools.gone:x"]')
    env = _cli_env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    work = tmp_path / "work"
    work.mkdir()
    for args in (["run", "--dir", str(work), "hi"], ["serve"]):
        done = _harness(env, *args)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert str(config.resolve()) in lines[0] and "tools[1]: 'teamtools.gone:x'" in lines[0]
        assert "cannot import teamtools.gone" in lines[0] and "Traceback" not in done.stderr
    assert not (socket_dir / "h.sock").exists()
    # A clash with a built-in and a wrong shape are refused the same way.
    config.write_text('tools = ["teamtools.loud:shout", "teamtools.loud:shout"]\n')
    done = _harness(env, "serve")
    assert done.returncode == 1 and "a second tool named 'shout'" in done.stderr, done.stderr
    config.write_text('tools = ["not a path"]\n')
    done = _harness(env, "serve")
    assert done.returncode == 1 and "tools.0" in done.stderr, done.stderr


def test_the_daemon_loads_tools_from_its_global_file(tmp_path: Path, socket_dir: Path) -> None:
    from test_client import start_daemon, stop

    _setup_files(tmp_path, '["teamtools.loud:shout"]')
    env = _cli_env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    daemon = start_daemon(env, tmp_path / "daemon.log")
    try:
        work = tmp_path / "work"
        work.mkdir()
        done = _harness(env, "run", "--dir", str(work), "shout hello")
        assert (done.returncode, done.stdout.strip()) == (0, "shouted"), done.stderr
        output = _shout_output(env, work)
        assert output["text"] == "HELLO"
        assert output["pid"] == daemon.pid, "the daemon ran the tool, not the client"
        # A project file naming tools of its own is the embedded run's, never the daemon's.
        repo = tmp_path / "repo"
        (repo / ".harness").mkdir(parents=True)
        (repo / ".harness" / "config.toml").write_text('tools = ["teamtools.loud:shout"]\n')
        from harness.client import ApiError, Client

        with pytest.raises(ApiError) as refused:
            Client(socket_dir / "h.sock").create_session(directory=str(repo))
        assert refused.value.status == 422 and "tools" in refused.value.message
    finally:
        assert stop(daemon) == 0

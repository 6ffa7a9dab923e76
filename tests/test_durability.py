"""Durability (issue 5): whatever dies — a runner, a tool, the daemon — the ledger brings
the work back, and no tool with a side effect runs twice.

Runner crashes are injected in-process through ``Config.provider_factory``. Daemon
crashes are real: ``python -m harness serve`` subprocesses killed with SIGKILL, their
ledger files inspected read-only and handed to a fresh daemon. Recovery from states a
kill rarely hits (a read in flight) is tested on a ledger written event by event.
Every wait polls a real state against a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from daemons import wait_for_daemon
from procs import alive_with
from wire_server import Reply, chunk, wire_server

from harness.actors.recovery import MAX_RESUMES
from harness.client import Client
from harness.config import Config
from harness.messages import ids
from harness.messages.events import NewEvent
from harness.messages.model import (
    AssistantMessage,
    Rule,
    Session,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolRunning,
    UserMessage,
)
from harness.messages.provider import ProviderRequest, StreamEvent, ToolResult, UserTurn
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness
from harness.storage.ledger import Ledger

# The commands append to counters beside the project: a redirection is a write, and one
# outside the session directory needs external_directory too (issue 11).
ALLOW_BASH = [
    Rule(permission=permission, pattern="*", action="allow")
    for permission in ("bash", "edit", "external_directory")
]
DEADLINE = 15.0  # a guard against a hung recovery; every test finishes far sooner


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# --- runner crashes, in-process -----------------------------------------------------------


class CrashingProvider(ScriptedProvider):
    """A scripted model whose stream raises a plain RuntimeError on chosen requests."""

    def __init__(self, turns: list[dict[str, Any]], crash: Callable[[int], bool]) -> None:
        base = ScriptedProvider.from_turns(turns)
        super().__init__(base.turns, record=True)
        self.crash = crash
        self.calls = 0

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        self.calls += 1
        if self.crash(self.calls):
            self.requests.append(request)
            raise RuntimeError(f"injected crash {self.calls}")
        async with super().stream(request) as events:
            yield events


def config_for(home: Path, provider: ScriptedProvider, **extra: Any) -> Config:
    return Config(
        home=home,
        model="scripted:unused",
        provider_factory=lambda model: provider,
        interactive=False,
        rules=ALLOW_BASH,
        **extra,
    )


async def test_a_crashed_runner_restarts_from_the_ledger_and_completes(
    tmp_path: Path, project: Path
) -> None:
    counter = project / "counter"  # in the session directory: the sandbox lets bash write it
    turns = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {counter}"}}]},
        {"text": "all done"},
    ]
    # Request 2 (the step after the tool) crashes once; the restart asks again.
    provider = CrashingProvider(turns, crash=lambda n: n == 2)
    async with open_harness(config_for(tmp_path / "home", provider)) as h:
        session = await h.create_session(project)
        with trio.fail_after(DEADLINE):
            result = await h.run(session.id, "count once")
        assert (result.reason, result.answer) == ("answered", "all done")
        assert h.session(session.id).status == "idle"
        transcript = await h.messages(session.id)
    assert provider.calls == 3
    assert lines(counter) == 1, "the completed bash call is kept, not run again"
    [tool] = [p for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert isinstance(tool.state, ToolCompleted)
    # The restarted runner saw the same history as the crashed one.
    _, crashed, again = provider.requests
    assert crashed.messages == again.messages
    users = [m for m in transcript if isinstance(m.info, UserMessage)]
    assert len(users) == 1


async def test_crashing_past_the_intensity_marks_the_session_error(
    tmp_path: Path, project: Path
) -> None:
    provider = CrashingProvider([{"text": "never"}], crash=lambda n: True)
    home = tmp_path / "home"
    log_file = tmp_path / "harness.jsonl"
    async with open_harness(config_for(home, provider, restart_limit=2, log_file=log_file)) as h:
        session = await h.create_session(project)
        with trio.fail_after(DEADLINE):
            result = await h.run(session.id, "hello")
        stored = h.session(session.id)
        claims = h.ledger.claimed_turns()
    assert result.reason == "error"
    assert provider.calls == 3  # the first run and two restarts
    assert result.error is not None
    assert "crashed 3 times within 60 s" in result.error
    assert "RuntimeError: injected crash 3" in result.error, result.error
    assert (stored.status, stored.error) == ("error", result.error)
    assert claims == []  # ended for good: not resumed by the next start
    # Each crash is a structured log line with its traceback, not terminal noise.
    crashes = [
        json.loads(line) for line in log_file.read_text().splitlines() if "runner crashed" in line
    ]
    assert len(crashes) == 3 and "RuntimeError" in crashes[0]["exception"]


# --- recovery from a ledger written event by event -----------------------------------------


async def write_ledger(home: Path, events: Callable[[], list[NewEvent]]) -> None:
    ledger = Ledger(home / "ledger.db")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run_writer, None)
            await ledger.write(events())
            ledger.close_writer()
    finally:
        ledger.close()


def interrupted_turn(
    project: Path, call: dict[str, Any] | list[dict[str, Any]], *, resumes: int = 0
) -> tuple[Session, str, Callable[[], list[NewEvent]]]:
    """A session whose turn was claimed, whose step 1 asked for ``call`` (one or several)
    and finished streaming, and whose calls are still ``running``: what a kill mid-tool
    leaves."""
    now = time.time()
    session = Session(
        id=ids.session_id(),
        directory=str(project),
        model="scripted:unused",
        status="busy",
        permission=ALLOW_BASH,
        created=now,
        updated=now,
    )
    user = UserMessage(
        id=ids.message_id(), session_id=session.id, agent="build", model="m", created=now
    )
    prompt = TextPart(id=ids.part_id(), session_id=session.id, message_id=user.id, text="go")
    step = AssistantMessage(
        id=ids.message_id(),
        session_id=session.id,
        parent_id=user.id,
        agent="build",
        model="m",
        step=1,
        finish="tool_calls",
        created=now,
        completed=now,
    )
    calls = call if isinstance(call, list) else [call]
    tools = [
        ToolPart(
            id=ids.part_id(),
            session_id=session.id,
            message_id=step.id,
            call_id=f"callCrash{number + 1}",
            tool=one["name"],
            state=ToolRunning(input=one["arguments"], start=now),
        )
        for number, one in enumerate(calls)
    ]

    def events() -> list[NewEvent]:
        out = [
            NewEvent(kind, session.id, obj.model_dump(mode="json"))
            for kind, obj in [
                ("session.created", session),
                ("message.created", user),
                ("part.created", prompt),
            ]
        ]
        claim = {"message_id": user.id, "session_id": session.id, "started": now}
        out.append(NewEvent("turn.started", session.id, claim))
        if resumes:
            out.append(
                NewEvent("turn.resumed", session.id, {"message_id": user.id, "resumes": resumes})
            )
        out += [
            NewEvent("message.created", session.id, step.model_dump(mode="json")),
            *(NewEvent("part.created", session.id, t.model_dump(mode="json")) for t in tools),
        ]
        return out

    return session, user.id, events


async def recover(
    home: Path, provider: ScriptedProvider, session_id: str, message_id: str
) -> tuple[dict[str, Any], Session, list[Any]]:
    """Start a harness on ``home`` and wait for the claimed turn to finish by itself."""
    async with open_harness(config_for(home, provider)) as h:
        with trio.fail_after(DEADLINE):
            while True:
                finished = [
                    e.data
                    for e in h.ledger.events_after(0, session_ids=[session_id], limit=10_000)
                    if e.type == "turn.finished" and e.data["message_id"] == message_id
                ]
                if finished:
                    break
                await trio.sleep(0.01)
            await h.ledger.flush()
        return finished[0], h.session(session_id), await h.messages(session_id)


async def test_a_running_read_is_run_again(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "home"
    read = {"name": "read", "arguments": {"path": "notes.txt"}}
    session, message_id, events = interrupted_turn(project, read)
    await write_ledger(home, events)
    provider = ScriptedProvider.from_turns(
        [{"tool_calls": [read]}, {"text": "the notes say marker-7f3a"}], record=True
    )
    finished, stored, transcript = await recover(home, provider, session.id, message_id)
    assert (finished["reason"], finished["answer"]) == ("answered", "the notes say marker-7f3a")
    assert stored.status == "idle"
    [tool] = [p for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert isinstance(tool.state, ToolCompleted) and "marker-7f3a" in tool.state.output
    # The model saw the re-run result, bound to the original call, and no restart note:
    # nothing was lost that it needs to be told about.
    [request] = provider.requests
    [result] = [m for m in request.messages if isinstance(m, ToolResult)]
    assert result.call_id == "callCrash1" and "marker-7f3a" in result.content
    assert not any(isinstance(m, UserTurn) and "restarted" in m.text for m in request.messages)


async def test_a_running_bash_is_reported_interrupted_not_run(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    counter = tmp_path / "counter"
    bash = {"name": "bash", "arguments": {"command": f"echo x >> {counter}"}}
    session, message_id, events = interrupted_turn(project, bash)
    await write_ledger(home, events)
    provider = ScriptedProvider.from_turns(
        [{"tool_calls": [bash]}, {"text": "checked, done"}], record=True
    )
    finished, stored, transcript = await recover(home, provider, session.id, message_id)
    assert (finished["reason"], finished["answer"]) == ("answered", "checked, done")
    assert stored.status == "idle"
    assert not counter.exists(), "an interrupted side effect is never re-run blindly"
    [tool] = [p for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert isinstance(tool.state, ToolError) and tool.state.error == "interrupted by restart"
    [request] = provider.requests
    [result] = [m for m in request.messages if isinstance(m, ToolResult)]
    assert result.is_error and result.content == "interrupted by restart"
    # The tool's own result says it was cut off; no note is added to the conversation.
    assert request.messages[-1] == result
    users = [m for m in transcript if isinstance(m.info, UserMessage)]
    assert [u.info.synthetic for u in users] == [False]  # type: ignore[union-attr]


async def test_in_one_step_the_read_is_run_again_and_the_bash_is_not(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    counter = tmp_path / "counter"
    read = {"name": "read", "arguments": {"path": "notes.txt"}}
    bash = {"name": "bash", "arguments": {"command": f"echo x >> {counter}"}}
    session, message_id, events = interrupted_turn(project, [read, bash])
    await write_ledger(home, events)
    provider = ScriptedProvider.from_turns(
        [{"tool_calls": [read, bash]}, {"text": "read it; will check the counter"}], record=True
    )
    finished, stored, transcript = await recover(home, provider, session.id, message_id)
    assert (finished["reason"], stored.status) == ("answered", "idle")
    assert not counter.exists()
    states = {p.tool: p.state for m in transcript for p in m.parts if isinstance(p, ToolPart)}
    assert isinstance(states["read"], ToolCompleted) and "marker-7f3a" in states["read"].output
    assert isinstance(states["bash"], ToolError)
    assert states["bash"].error == "interrupted by restart"
    [request] = provider.requests
    results = {r.call_id: r for r in request.messages if isinstance(r, ToolResult)}
    assert "marker-7f3a" in results["callCrash1"].content
    assert results["callCrash2"].is_error
    # The bash's own result says it was cut off; nothing else is added.
    assert request.messages[-1] == results["callCrash2"]
    assert not any(isinstance(m, UserTurn) and "restarted" in m.text for m in request.messages)


async def test_a_turn_resumed_too_often_fails_with_a_clear_reason(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    counter = tmp_path / "counter"
    bash = {"name": "bash", "arguments": {"command": f"echo x >> {counter}"}}
    session, message_id, events = interrupted_turn(project, bash, resumes=MAX_RESUMES)
    await write_ledger(home, events)
    provider = ScriptedProvider.from_turns([{"text": "never asked"}], record=True)
    finished, stored, transcript = await recover(home, provider, session.id, message_id)
    assert finished["reason"] == "error"
    assert finished["error"] == (
        f"the turn was resumed {MAX_RESUMES} times after restarts and kept failing"
    )
    assert (stored.status, stored.error) == ("error", finished["error"])
    assert provider.requests == [] and not counter.exists()
    [tool] = [p for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert isinstance(tool.state, ToolError)
    # The error status is committed with turn.finished, not after it: a client that
    # reads the session once it sees the turn end found it still busy (a flaky test).
    async with open_harness(config_for(home, provider)) as h:
        events = h.ledger.events_after(0, session_ids=[session.id], limit=10_000)
    [end] = [e for e in events if e.type == "turn.finished"]
    [failed] = [e for e in events if e.type == "session.updated" and e.data["status"] == "error"]
    assert failed.ts == end.ts  # one commit


# --- the daemon killed with SIGKILL ---------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, socket_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(socket_dir / "h.sock")
    return env


def start_daemon(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve", *extra], stderr=out, env=env
        )
    wait_for_daemon(process, Path(env["HARNESS_SOCKET"]), log, DEADLINE)
    return process


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=DEADLINE) == -signal.SIGKILL


def kill_group_of(marker: str) -> None:
    """Kill the process group of the tool command whose command line holds ``marker``."""
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            if entry.isdigit() and marker.encode() in cmdline and int(entry) != os.getpid():
                os.killpg(os.getpgid(int(entry)), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def query(home: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read the ledger as another process would, while the daemon writes it."""
    conn = apsw.Connection(str(home / "ledger.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(5000)
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def script(path: Path, turns: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def test_a_killed_daemon_resumes_sessions_cut_mid_tool_and_mid_stream(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    home = Path(env["HARNESS_HOME"])
    # Unsandboxed: under the sandbox a command dies with its harness (bwrap's
    # --die-with-parent, tests/test_sandbox.py), and this is about the orphans left where
    # there is no sandbox to take them down.
    env["HARNESS_SANDBOX"] = "off"
    count_a, count_b = tmp_path / "count-a", tmp_path / "count-b"
    orphan = "sleep 61.5151"  # a marker for the command the kill orphans
    slow_tool = {"command": f"echo a >> {count_a} && {orphan}"}
    script_a = script(
        tmp_path / "a.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": slow_tool}]},
            {"text": "A: checked the counter, done", "delay": 0.05},
            {"text": "A: the queued question, answered"},
        ],
    )
    b_turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo b >> {count_b}"}}]},
        {"text": "B: done", "delay": 60},  # the kill lands while this step streams
    ]
    script_b = script(tmp_path / "b.json", b_turns)
    allow = [rule.model_dump() for rule in ALLOW_BASH]
    daemon = start_daemon(env, tmp_path / "daemon-1.log")
    try:
        client = Client(Path(env["HARNESS_SOCKET"]))
        a = client.create_session(directory=str(project), model=script_a, permission=allow)["id"]
        b = client.create_session(directory=str(project), model=script_b, permission=allow)["id"]
        first_a = client.prompt(a, "count for A")
        client.prompt(b, "count for B")
        wait_for(
            "A's bash to be running",
            lambda: (
                lines(count_a) == 1
                and query(
                    home, "SELECT 1 FROM parts WHERE session_id = ? AND status = 'running'", a
                )
                != []
            ),
        )
        queued = client.prompt(a, "a queued question")
        wait_for(
            "B's second step to stream",
            lambda: (
                query(
                    home,
                    "SELECT 1 FROM messages WHERE session_id = ? AND role = 'assistant'"
                    " AND json_extract(data, '$.step') = 2",
                    b,
                )
                != []
            ),
        )
        assert query(home, "SELECT 1 FROM inbox WHERE id = ?", queued) != []
        last_seq = query(home, "SELECT max(seq) FROM events")[0][0]
    finally:
        kill(daemon)
    claimed = {row[0] for row in query(home, "SELECT session_id FROM turns")}
    assert claimed == {a, b}
    # A SIGKILL'd daemon cannot kill its tool's process group: the `sleep` lives on...
    assert alive_with(orphan), "the orphaned tool process should still be running"

    # The model answers B at once this time: recovery must not depend on the delay.
    b_turns[1] = {"text": "B: done"}
    script(tmp_path / "b.json", b_turns)
    daemon = start_daemon(env, tmp_path / "daemon-2.log")
    try:
        client = Client(Path(env["HARNESS_SOCKET"]))
        wait_for(
            "both sessions to finish",
            lambda: (
                query(home, "SELECT count(*) FROM turns")[0][0] == 0
                and query(home, "SELECT count(*) FROM inbox")[0][0] == 0
                and {s["status"] for s in client.sessions()} == {"idle"}
            ),
        )
        transcripts = {sid: client.messages(sid) for sid in (a, b)}
        # ...until the restarted daemon finds it through the ledger and kills it.
        wait_for("the orphaned tool process to be killed", lambda: not alive_with(orphan))
    finally:
        kill(daemon)
        kill_group_of(orphan)  # whatever happened above, leave nothing behind

    finished = {
        json.loads(data)["message_id"]: json.loads(data)
        for seq, data in query(
            home, "SELECT seq, data FROM events WHERE type = 'turn.finished' ORDER BY seq"
        )
    }
    assert finished[first_a]["answer"] == "A: checked the counter, done"
    assert finished[queued]["answer"] == "A: the queued question, answered"
    assert [f["reason"] for f in finished.values()] == ["answered"] * 3

    # The bash call cut mid-run is shown interrupted and was not run again.
    assert lines(count_a) == 1 and lines(count_b) == 1
    tools_a = [p for m in transcripts[a] for p in m["parts"] if p["type"] == "tool"]
    assert [t["state"]["status"] for t in tools_a] == ["error"]
    assert tools_a[0]["state"]["error"] == "interrupted by restart"
    tools_b = [p for m in transcripts[b] for p in m["parts"] if p["type"] == "tool"]
    assert [t["state"]["status"] for t in tools_b] == ["completed"]

    # One user message per prompt, and the queued input after them: no restart note.
    def users(sid: str) -> list[tuple[str, bool]]:
        return [
            ("".join(p["text"] for p in m["parts"] if p["type"] == "text"), m["info"]["synthetic"])
            for m in transcripts[sid]
            if m["info"]["role"] == "user"
        ]

    assert users(a) == [("count for A", False), ("a queued question", False)]
    assert users(b) == [("count for B", False)]
    # B's step cut mid-stream is kept as aborted; a fresh step answered.
    steps_b = [m["info"] for m in transcripts[b] if m["info"]["role"] == "assistant"]
    assert [s["error"] for s in steps_b] == [None, "interrupted by restart", None]

    seqs = [row[0] for row in query(home, "SELECT seq FROM events ORDER BY rowid")]
    assert seqs == sorted(set(seqs)) and seqs[-1] > last_seq


def test_durability_flag_and_a_corrupt_ledger(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    home = Path(env["HARNESS_HOME"])
    daemon = start_daemon(env, tmp_path / "daemon.log", "--durability", "full")
    kill(daemon)
    started = [
        json.loads(line)
        for line in (tmp_path / "daemon.log").read_text().splitlines()
        if "daemon listening" in line
    ]
    assert started[0]["durability"] == "full"
    assert query(home, "PRAGMA journal_mode") == [("wal",)]

    bad = subprocess.run(
        [sys.executable, "-m", "harness", "serve", "--durability", "fsync"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert bad.returncode == 2 and "invalid choice: 'fsync'" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "harness", "serve"],
        capture_output=True,
        text=True,
        env={**env, "HARNESS_DURABILITY": "maybe"},
        timeout=30,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "harness: HARNESS_DURABILITY='maybe': expected 'normal' or 'full'"

    ledger = home / "ledger.db"
    for name, damage in [
        ("garbage", lambda data: os.urandom(8192)),
        ("truncated", lambda data: data[: len(data) // 3]),
    ]:
        for stale in (ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm")):
            stale.unlink(missing_ok=True)
        Ledger(ledger).close()  # a healthy ledger, checkpointed into the one file
        broken = damage(ledger.read_bytes())
        ledger.write_bytes(broken)
        for args in (["serve"], ["run", "--embedded", "--model", "scripted:/none", "hi"]):
            done = subprocess.run(
                [sys.executable, "-m", "harness", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
            )
            assert done.returncode == 1, (name, args, done.stderr)
            assert "cannot open the ledger at" in done.stderr, done.stderr
            assert "left untouched" in done.stderr
            assert "Traceback" not in done.stderr
            assert ledger.read_bytes() == broken, (name, args)


async def test_a_resume_that_lost_nothing_resends_the_interrupted_request_byte_for_byte(
    env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    """Killed while the model streams its second reply, after the first reply's bash call
    completed: the restarted daemon sends the model exactly the request it was answering,
    so it cannot tell a crash happened and does not do the work again (issue 12, item 1)."""
    home = Path(env["HARNESS_HOME"])
    counter = project / "COUNTER"  # inside the workspace: the sandbox lets bash write it
    call = {"command": f"echo line >> {counter}"}
    first = Reply(
        events=[
            chunk(
                tool_calls=[
                    {
                        "index": 0,
                        "id": "callEcho1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps(call)},
                    }
                ]
            ),
            chunk(finish="tool_calls"),
        ]
    )
    # Streams a few words and then hangs: the kill lands mid-reply.
    cut = Reply(events=[chunk("I ran it; now I")], hang=True, done=False)
    again = Reply(events=[chunk("done: one line"), chunk(finish="stop")])
    async with wire_server(first, cut, again) as server:
        daemon_env = {**env, "HARNESS_BASE_URL": server.url + "/v1"}
        # The counter sits outside the project: `>>` there is an edit outside it.
        allow = [
            {"permission": name, "pattern": "*", "action": "allow"}
            for name in ("bash", "edit", "external_directory")
        ]
        daemon = await trio.to_thread.run_sync(
            start_daemon, daemon_env, tmp_path / "daemon-1.log"
        )
        try:
            client = Client(Path(env["HARNESS_SOCKET"]))
            session = await trio.to_thread.run_sync(
                lambda: client.create_session(
                    directory=str(project), model="openai/m", permission=allow
                )
            )
            await trio.to_thread.run_sync(client.prompt, session["id"], "append a line")
            with trio.fail_after(DEADLINE):
                while len(server.requests) < 2:
                    await trio.sleep(0.02)
            tools = query(home, "SELECT status FROM parts WHERE type = 'tool'")
            assert tools == [("completed",)] and lines(counter) == 1
        finally:
            await trio.to_thread.run_sync(kill, daemon)
        daemon = await trio.to_thread.run_sync(
            start_daemon, daemon_env, tmp_path / "daemon-2.log"
        )
        try:
            with trio.fail_after(DEADLINE):
                while query(home, "SELECT count(*) FROM turns")[0][0]:
                    await trio.sleep(0.02)
        finally:
            await trio.to_thread.run_sync(kill, daemon)
    assert len(server.requests) == 3
    interrupted, resumed = server.requests[1], server.requests[2]
    assert resumed.body == interrupted.body
    assert lines(counter) == 1
    assert "restarted" not in resumed.body.decode()
    # The ledger still says what happened; the model's conversation does not.
    kinds = [row[0] for row in query(home, "SELECT type FROM events ORDER BY seq")]
    assert kinds.count("turn.resumed") == 1
    users = query(home, "SELECT data FROM messages WHERE role = 'user'")
    assert len(users) == 1
    [(answer,)] = query(
        home, "SELECT data FROM events WHERE type = 'turn.finished' ORDER BY seq DESC LIMIT 1"
    )
    assert json.loads(answer)["answer"] == "done: one line"

"""The todo list and the question tool: through the model, the ledger, the API and a terminal.

Loop tests use the scripted provider in-process; the daemon runs in-process on a temp
socket; the terminal tests run a real ``harness run`` process whose stdin is a
pseudo-terminal, so it asks at the prompt exactly as it would for a user.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from daemons import wait_for_daemon

from harness import cli, server
from harness.client import ApiError, Client
from harness.commands.display import shape_answers
from harness.config import Config
from harness.messages.events import Event
from harness.messages.model import ToolCompleted, ToolError, ToolPart
from harness.runtime import Harness, HarnessError
from harness.storage.ledger import Ledger

if TYPE_CHECKING:
    from conftest import ScriptedHarness, ToolParts

DEADLINE = 20.0  # seconds: a guard against a hung process; every step takes far less

TODOS = [
    {"content": "read the parser", "status": "completed", "priority": "high"},
    {"content": "fix the off-by-one", "status": "in_progress", "priority": "high"},
    {"content": "add a regression test", "status": "pending", "priority": "medium"},
]

QUESTIONS = [
    {
        "question": "Which DB?",
        "header": "Database",
        "options": [
            {"label": "Postgres", "description": "a server"},
            {"label": "SQLite", "description": "a file"},
        ],
    },
    {
        "question": "Which features?",
        "options": [
            {"label": "auth", "description": "log in"},
            {"label": "billing", "description": "invoices"},
            {"label": "search", "description": "full text"},
        ],
        "multiple": True,
    },
]


def ask(questions: list[dict[str, Any]] = QUESTIONS, call_id: str = "askUser01") -> dict[str, Any]:
    return {
        "tool_calls": [{"name": "question", "arguments": {"questions": questions}, "id": call_id}]
    }


def durable(h: Harness, session_id: str, kind: str) -> list[Event]:
    events = h.ledger.events_after(0, session_ids=[session_id], limit=100_000)
    return [e for e in events if e.type == kind]


# --- todos ----------------------------------------------------------------------------------


async def test_todos_round_trip_through_the_model_and_the_ledger(
    tmp_path: Path,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    scripted_harness: ScriptedHarness,
    tool_parts: ToolParts,
) -> None:
    turns = [
        {"tool_calls": [{"name": "todowrite", "arguments": {"todos": TODOS}, "id": "writeTd1"}]},
        {"tool_calls": [{"name": "todoread", "arguments": {}, "id": "readTodo1"}]},
        {"text": "on it"},
    ]
    async with scripted_harness(turns) as (h, provider):
        session = await h.create_session(project)
        async with h.subscribe(session.id) as events:
            result = await h.run(session.id, "plan the fix")
            published = [e async for e in _drain(events) if e.type == "todo.updated"]
        assert (result.reason, result.answer) == ("answered", "on it")
        stored = [t.model_dump() for t in h.todos(session.id)]
        assert stored == TODOS
        written, read = tool_parts(h, session.id)
        assert isinstance(written.state, ToolCompleted) and isinstance(read.state, ToolCompleted)
        assert written.state.title == read.state.title == "3 todos"
        assert read.state.output == written.state.output
        assert "[>] fix the off-by-one (high)" in read.state.output
        assert "3 todos: 1 in progress, 1 pending, 1 completed" in read.state.output
        # The model read back exactly what it wrote.
        last = provider.requests[-1].messages[-1]
        assert "[x] read the parser (high)" in getattr(last, "content", "")
        # Durable, applied to the projection, and published.
        updates = durable(h, session.id, "todo.updated")
        assert [e.data["todos"] for e in updates] == [TODOS]
        assert [e.seq for e in published] == [updates[0].seq]

    # `show --json` (no daemon: read from the ledger) includes the list; `show` prints it.
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HARNESS_SOCKET", str(tmp_path / "no-daemon.sock"))
    for args in (["show", session.id, "--json"], ["show", session.id]):
        with pytest.raises(SystemExit) as exited:
            cli.main(args)
        assert exited.value.code == 0
    shown_json, shown_text = capsys.readouterr().out.split("\n}\n", 1)
    assert json.loads(shown_json + "}")["todos"] == TODOS
    assert "todos: 1/3 completed" in shown_text
    assert "[ ] add a regression test (medium)" in shown_text


async def _drain(events: trio.MemoryReceiveChannel[Event]) -> AsyncIterator[Event]:
    """What the subscription holds right now."""
    while True:
        try:
            yield events.receive_nowait()
        except trio.WouldBlock:
            return


async def test_a_child_session_has_its_own_todo_list(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    mine = [{"content": "delegate the search", "status": "in_progress", "priority": "low"}]
    theirs = [{"content": "grep for callers", "status": "completed", "priority": "high"}]
    turns = [
        {"tool_calls": [{"name": "todowrite", "arguments": {"todos": mine}, "id": "writeMin"}]},
        {
            "tool_calls": [
                {
                    "name": "task",
                    "arguments": {
                        "description": "search",
                        "prompt": "find callers",
                        "agent": "build",
                    },
                    "id": "taskCall1",
                }
            ]
        },
        {"text": "done"},
    ]
    subtasks = {
        "find callers": [
            {"tool_calls": [{"name": "todowrite", "arguments": {"todos": theirs}}]},
            {"text": "found two"},
        ]
    }
    async with scripted_harness(turns, subtasks) as (h, _):
        session = await h.create_session(project)
        result = await h.run(session.id, "go")
        assert result.reason == "answered"
        (child,) = h.ledger.children(session.id)
        assert [t.model_dump() for t in h.todos(session.id)] == mine
        assert [t.model_dump() for t in h.todos(child.id)] == theirs


async def test_a_general_subagent_has_no_todowrite(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    turns = [
        {"tool_calls": [{"name": "task", "arguments": {"description": "d", "prompt": "sub"}}]},
        {"text": "done"},
    ]
    subtasks = {"sub": [{"text": "ok"}]}
    async with scripted_harness(turns, subtasks) as (h, provider):
        session = await h.create_session(project)
        assert (await h.run(session.id, "go")).reason == "answered"
        offered = [{spec.name for spec in request.tools} for request in provider.requests]
        assert any("todowrite" in names for names in offered)  # the parent
        assert any("todowrite" not in names and "todoread" in names for names in offered)


async def test_a_bad_todo_is_an_error_the_model_sees(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    bad = [{"content": "x", "status": "done", "priority": "high"}]
    turns = [
        {"tool_calls": [{"name": "todowrite", "arguments": {"todos": bad}}]},
        {"text": "fixed"},
    ]
    async with scripted_harness(turns) as (h, _):
        session = await h.create_session(project)
        assert (await h.run(session.id, "go")).reason == "answered"
        (part,) = tool_parts(h, session.id)
        assert isinstance(part.state, ToolError)
        assert "todos.0.status" in part.state.error
        assert h.todos(session.id) == []


# --- questions: embedded ----------------------------------------------------------------------


async def _first(events: trio.MemoryReceiveChannel[Event], kind: str) -> Event:
    with trio.fail_after(5):
        async for event in events:
            if event.type == kind:
                return event
    raise AssertionError(f"no {kind} event")


async def test_a_question_with_no_terminal_fails_at_once_and_the_turn_goes_on(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    async with scripted_harness([ask(), {"text": "assumed Postgres"}]) as (h, _):
        session = await h.create_session(project)
        with trio.fail_after(5):
            result = await h.run(session.id, "set up a DB")
        assert (result.reason, result.answer) == ("answered", "assumed Postgres")
        (part,) = tool_parts(h, session.id)
        assert isinstance(part.state, ToolError)
        assert "there is no terminal" in part.state.error
        assert durable(h, session.id, "question.asked") == []
        assert await h.pending_questions() == []


async def test_answers_come_back_as_the_tool_result(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    turns = [ask(), {"text": "SQLite it is"}]
    async with scripted_harness(turns, interactive=True) as (h, _):
        session = await h.create_session(project)
        async with h.subscribe(session.id) as events:
            sent = await h.prompt(session.id, "set up a DB")
            asked = await _first(events, "question.asked")
            (pending,) = await h.pending_questions(session.id)
            assert pending.id == asked.data["id"] and pending.id.startswith("que_")
            assert [q.question for q in pending.questions] == ["Which DB?", "Which features?"]
            # Answers that do not fit are refused and the question stays pending.
            with pytest.raises(HarnessError, match="2 answer"):
                await h.answer_question(pending.id, [["SQLite"]])
            with pytest.raises(HarnessError, match="takes one answer"):
                await h.answer_question(pending.id, [["SQLite", "Postgres"], []])
            assert await h.answer_question("que_unknown", [["x"], []]) is False
            assert await h.answer_question(pending.id, [["SQLite"], ["auth", "search"]])
            finished = await _first(events, "turn.finished")
        assert finished.data["message_id"] == sent
        assert finished.data["reason"] == "answered"
        (part,) = tool_parts(h, session.id)
        assert isinstance(part.state, ToolCompleted)
        assert part.state.output.startswith(
            'User answered: "Which DB?"="SQLite", "Which features?"="auth, search".'
        )
        assert part.state.metadata["answers"] == [["SQLite"], ["auth", "search"]]
        replied = durable(h, session.id, "question.replied")
        assert [e.data["answers"] for e in replied] == [[["SQLite"], ["auth", "search"]]]
        assert await h.pending_questions() == []


async def test_a_rejected_question_stops_the_turn_unless_it_says_why(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    # The scripted turn answered is picked by the number of assistant turns so far.
    turns = [ask(call_id="askOne01"), ask(call_id="askTwo02"), {"text": "carried on"}]
    async with scripted_harness(turns, interactive=True) as (h, _):
        session = await h.create_session(project)
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "go")
            asked = await _first(events, "question.asked")
            assert await h.reject_question(asked.data["id"])
            finished = await _first(events, "turn.finished")
        assert finished.data["reason"] == "denied"
        (part,) = tool_parts(h, session.id)
        assert isinstance(part.state, ToolError) and "dismissed" in part.state.error

        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "again")
            asked = await _first(events, "question.asked")
            assert await h.reject_question(asked.data["id"], "use Postgres, don't ask")
            finished = await _first(events, "turn.finished")
        assert (finished.data["reason"], finished.data["answer"]) == ("answered", "carried on")
        assert "use Postgres, don't ask" in tool_parts(h, session.id)[-1].state.error  # type: ignore[union-attr]


async def test_cancelling_the_session_clears_its_pending_questions(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    async with scripted_harness([ask(), {"text": "never"}], interactive=True) as (h, _):
        session = await h.create_session(project)
        other = await h.create_session(project)
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "go")
            asked = await _first(events, "question.asked")
            assert len(await h.pending_questions()) == 1
            async with h.subscribe(other.id) as other_events:
                await h.prompt(other.id, "go")
                other_asked = await _first(other_events, "question.asked")
            assert await h.cancel(session.id)
            finished = await _first(events, "turn.finished")
        assert finished.data["reason"] == "cancelled"
        assert [q.id for q in await h.pending_questions()] == [other_asked.data["id"]]
        assert await h.answer_question(asked.data["id"], [["SQLite"], []]) is False
        rejected = durable(h, session.id, "question.rejected")
        assert [e.data["id"] for e in rejected] == [asked.data["id"]]
        (part,) = tool_parts(h, session.id)
        assert part.state.status == "error"


# --- questions: the daemon API ------------------------------------------------------------------


async def test_a_question_answered_through_the_api(
    tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery, tool_parts: ToolParts
) -> None:
    config = Config(home=tmp_path / "home", log_file=tmp_path / "daemon.jsonl")
    h, path = await nursery.start(server.serve, config, socket_dir / "d.sock")
    client = Client(path)

    async def call(name: str, *args: Any) -> Any:
        return await trio.to_thread.run_sync(partial(getattr(client, name), *args))

    script = tmp_path / "script.json"
    script.write_text(json.dumps([ask(), {"text": "noted"}]))
    created = await trio.to_thread.run_sync(
        partial(client.create_session, directory=str(project), model=f"scripted:{script}")
    )
    session = h.session(created["id"])
    async with h.subscribe(session.id) as events:
        await call("prompt", session.id, "set up")
        asked = await _first(events, "question.asked")
        listed = await call("questions")
        assert [q["id"] for q in listed] == [asked.data["id"]]
        assert listed == await call("questions", session.id)
        assert listed[0]["questions"][1]["multiple"] is True
        request_id = listed[0]["id"]
        for body, status in (
            ({"answers": [["SQLite"]]}, 422),  # one answer for two questions
            ({"answers": [["a", "b"], []]}, 422),  # two for a single-choice question
            ({"answers": [["x"], []], "reject": True}, 422),  # both
            ({}, 422),  # neither
            ({"answers": "SQLite"}, 422),  # not a list
        ):
            with pytest.raises(ApiError) as refused:
                await trio.to_thread.run_sync(
                    partial(client.request, "POST", f"/v1/questions/{request_id}", body)
                )
            assert refused.value.status == status, body
        with pytest.raises(ApiError) as missing:
            await call("answer_question", "que_nope", [["x"], []])
        assert missing.value.status == 404
        await call("answer_question", request_id, [["Postgres"], ["billing"]])
        finished = await _first(events, "turn.finished")
    assert finished.data["reason"] == "answered"
    (part,) = tool_parts(h, session.id)
    assert isinstance(part.state, ToolCompleted)
    assert 'User answered: "Which DB?"="Postgres", "Which features?"="billing"' in part.state.output
    assert await call("questions") == []
    with pytest.raises(ApiError) as gone:
        await call("answer_question", request_id, [["Postgres"], []])
    assert gone.value.status == 404
    assert await call("todos", session.id) == []
    nursery.cancel_scope.cancel()


def test_typed_answers_are_shaped_per_question() -> None:
    shape = shape_answers
    assert shape(QUESTIONS, ["2", "auth, 3"]) == [["SQLite"], ["auth", "search"]]
    assert shape(QUESTIONS, ["postgres", ""]) == [["Postgres"], []]
    # A single-choice answer is kept whole: free text may contain commas.
    assert shape(QUESTIONS, ["MySQL, version 8", "BILLING"]) == [["MySQL, version 8"], ["billing"]]
    assert shape(QUESTIONS, ["9", "x"]) == [["9"], ["x"]]  # no option 9: the user's own words
    with pytest.raises(cli.UsageError, match="2 question"):
        shape(QUESTIONS, ["1"])


# --- questions at a real terminal -----------------------------------------------------------------


def _env(tmp_path: Path, socket: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(socket or tmp_path / "no-daemon.sock")
    return env


class Terminal:
    """A ``harness run`` process whose stdin is a pseudo-terminal; stderr read with deadlines."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "harness", *args],
                stdin=slave,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self.err = b""

    def wait_for(self, marker: str, deadline: float) -> str:
        assert self.process.stderr is not None
        fd = self.process.stderr.fileno()
        while marker.encode() not in self.err:
            left = deadline - time.monotonic()
            if left <= 0 or (
                self.process.poll() is not None and not select.select([fd], [], [], 0)[0]
            ):
                raise AssertionError(f"never saw {marker!r}; stderr so far:\n{self.err.decode()}")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk and self.process.poll() is not None:
                    continue
                self.err += chunk
        return self.err.decode()

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self, deadline: float) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        self.err += err
        return self.process.returncode, out.decode(), self.err.decode()

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        os.close(self.master)


def _answered_through_a_terminal(
    tmp_path: Path, project: Path, env: dict[str, str], *extra: str
) -> str:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([ask(), {"text": "SQLite with auth and search"}]))
    args = ["run", *extra, "--model", f"scripted:{script}", "--dir", str(project), "set up a DB"]
    terminal = Terminal(args, env)
    deadline = time.monotonic() + DEADLINE
    try:
        shown = terminal.wait_for("or your own words", deadline)
        assert "? [Database] Which DB? (1/2)" in shown
        assert "  2. SQLite — a file" in shown
        terminal.type("2")
        shown = terminal.wait_for("numbers or labels, comma-separated", deadline)
        assert "Which features? (2/2)" in shown
        terminal.type("auth, 3")
        code, out, err = terminal.finish(deadline)
    finally:
        terminal.close()
    assert code == 0, err
    assert out.strip() == "SQLite with auth and search"
    assert "✓ question (asked 2 questions)" in err
    return err


def _the_tool_output(tmp_path: Path) -> str:
    ledger = Ledger(tmp_path / "home" / "ledger.db")
    try:
        (session,) = ledger.sessions()
        (part,) = [
            p for m in ledger.messages(session.id) for p in m.parts if isinstance(p, ToolPart)
        ]
    finally:
        ledger.close()
    assert isinstance(part.state, ToolCompleted)
    return part.state.output


EXPECTED = 'User answered: "Which DB?"="SQLite", "Which features?"="auth, search".'


def test_a_question_answered_at_the_terminal_embedded(tmp_path: Path, project: Path) -> None:
    _answered_through_a_terminal(tmp_path, project, _env(tmp_path), "--embedded")
    assert _the_tool_output(tmp_path).startswith(EXPECTED)


@pytest.fixture
def daemon_env(tmp_path: Path, socket_dir: Path) -> Iterator[tuple[dict[str, str], Client]]:
    """A real ``harness serve`` process, and the environment that reaches it."""
    env = _env(tmp_path, socket_dir / "d.sock")
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "harness", "serve"], stderr=out, env=env)
    try:
        client = wait_for_daemon(daemon, socket_dir / "d.sock", log, DEADLINE)
        yield env, client
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=15)


def _harness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )


def test_a_question_answered_at_the_terminal_through_the_daemon(
    tmp_path: Path, project: Path, daemon_env: tuple[dict[str, str], Client]
) -> None:
    env, client = daemon_env
    _answered_through_a_terminal(tmp_path, project, env)
    (session,) = client.sessions()
    parts = [p for m in client.messages(session["id"]) for p in m["parts"] if p["type"] == "tool"]
    assert parts[0]["state"]["output"].startswith(EXPECTED)
    shown = _harness(env, "show", session["id"], "--json")  # through the daemon
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["todos"] == []


def test_no_terminal_through_the_daemon_fails_the_call_and_goes_on(
    tmp_path: Path, project: Path, daemon_env: tuple[dict[str, str], Client]
) -> None:
    env, client = daemon_env
    script = tmp_path / "script.json"
    script.write_text(json.dumps([ask(), {"text": "assumed"}]))
    run = _harness(env, "run", "--model", f"scripted:{script}", "--dir", str(project), "go")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "assumed"
    assert "✗ question: the question could not be asked: there is no terminal" in run.stderr
    assert run.stderr.count("✗ question") == 1
    assert client.questions() == []


def test_the_answer_command(
    tmp_path: Path, project: Path, daemon_env: tuple[dict[str, str], Client]
) -> None:
    env, client = daemon_env
    script = tmp_path / "script.json"
    script.write_text(json.dumps([ask(), {"text": "thanks"}]))
    session = client.create_session(directory=str(project), model=f"scripted:{script}")
    client.prompt(session["id"], "set up")
    deadline = time.monotonic() + DEADLINE
    while not (pending := client.questions()):
        assert time.monotonic() < deadline, "the question never came"
        time.sleep(0.02)
    request_id = pending[0]["id"]
    for args, message in (
        ([request_id], "give one ANSWER per question, or --reject"),
        ([request_id, "1"], "2 question(s) asked and 1 answer(s) given"),
        (["que_nope", "1", "2"], "no pending question que_nope"),
        (["que_nope", "--reject"], "no pending question que_nope"),
        ([request_id, "1", "2", "--reject"], "give one ANSWER per question, or --reject"),
    ):
        refused = _harness(env, "answer", *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert message in refused.stderr and "Traceback" not in refused.stderr
    answered = _harness(env, "answer", request_id, "postgres", "billing,1", "--json")
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["answers"] == [["Postgres"], ["billing", "auth"]]
    while client.session(session["id"])["status"] != "idle":
        assert time.monotonic() < deadline, "the turn never finished"
        time.sleep(0.02)
    parts = [p for m in client.messages(session["id"]) for p in m["parts"] if p["type"] == "tool"]
    assert '"Which features?"="billing, auth"' in parts[0]["state"]["output"]

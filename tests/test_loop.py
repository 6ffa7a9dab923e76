"""The agent loop's classic test matrix, end to end through the embedding API.

Each test runs a real harness (actors, a real SQLite ledger file under ``tmp_path``, real
tools on a real temporary project, real subprocesses for bash) with the scripted provider
injected through ``Config.provider_factory``. Assertions read the ledger
(``h.messages``, ``h.ledger``) and the requests the provider received, not only the
value ``run`` returns.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import apsw
import pytest
import trio
from procs import alive_with

import harness.runtime
from harness.config import Config
from harness.history import History
from harness.messages.events import Event, TurnResult
from harness.messages.model import (
    AssistantMessage,
    MessageWithParts,
    Rule,
    Session,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    UserMessage,
)
from harness.messages.permission import Reply
from harness.messages.provider import (
    AssistantTurn,
    ProviderRequest,
    StreamEvent,
    ToolResult,
    UserTurn,
)
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness
from harness.storage.ledger import Ledger
from harness.tools.base import Tool, ToolContext, ToolOutput, ToolParams
from harness.tools.registry import builtin_tools

TURN_TIMEOUT = 5.0  # a guard against a hung loop; every test finishes far sooner

# --- helpers ---------------------------------------------------------------------------------


@dataclass
class Loop:
    """A running harness with one session on ``project`` and its recording provider."""

    h: Harness
    provider: ScriptedProvider
    session: Session
    project: Path

    @property
    def sid(self) -> str:
        return self.session.id

    @property
    def requests(self) -> list[ProviderRequest]:
        return self.provider.requests

    async def transcript(self) -> list[MessageWithParts]:
        return await self.h.messages(self.sid)

    async def tool_parts(self) -> list[ToolPart]:
        return [p for m in await self.transcript() for p in m.parts if isinstance(p, ToolPart)]

    async def assistants(self) -> list[MessageWithParts]:
        return [m for m in await self.transcript() if isinstance(m.info, AssistantMessage)]

    def events(self, kind: str) -> list[Event]:
        """Durable events of one type, from the ledger's event log."""
        return [
            e
            for e in self.h.ledger.events_after(0, session_ids=[self.sid], limit=100_000)
            if e.type == kind
        ]

    async def drive(
        self,
        text: str,
        on_event: Callable[[Event], Awaitable[None]] | None = None,
    ) -> TurnResult:
        """Prompt, hand every event to ``on_event``, and return when that turn finishes."""
        async with self.h.subscribe(self.sid) as events:
            sent = await self.h.prompt(self.sid, text)
            with trio.fail_after(TURN_TIMEOUT):
                async for event in events:
                    if on_event is not None:
                        await on_event(event)
                    if event.type == "turn.finished" and event.data["message_id"] == sent:
                        data = event.data
                        return TurnResult(sent, data["reason"], data["answer"], data["error"])
        raise AssertionError("the event stream ended before the turn finished")


@asynccontextmanager
async def open_loop(
    tmp_path: Path,
    project: Path,
    turns: list[dict[str, Any]] | None = None,
    *,
    provider: ScriptedProvider | None = None,
    **config: Any,
) -> AsyncIterator[Loop]:
    provider = provider or ScriptedProvider.from_turns(turns or [], record=True)
    config.setdefault("interactive", False)
    cfg = Config(
        home=tmp_path / "home",
        # Must parse as a model string; the factory ignores it.
        model=f"scripted:{tmp_path / 'unused-script.json'}",
        provider_factory=lambda model: provider,
        **config,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        yield Loop(h, provider, session, project)


def results_in(request: ProviderRequest) -> list[ToolResult]:
    return [m for m in request.messages if isinstance(m, ToolResult)]


def calls_in(request: ProviderRequest) -> list[str]:
    return [c.id for m in request.messages if isinstance(m, AssistantTurn) for c in m.tool_calls]


def read(path: str, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": "read", "arguments": {"path": path}}
    if call_id is not None:
        call["id"] = call_id
    return call


def bash(command: str, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": "bash", "arguments": {"command": command}}
    if call_id is not None:
        call["id"] = call_id
    return call


def replier(
    h: Harness, replies: list[tuple[Reply, str | None]], asked: list[Event]
) -> Callable[[Event], Awaitable[None]]:
    """An ``on_event`` that answers each ``permission.asked`` with the next reply."""

    async def on_event(event: Event) -> None:
        if event.type == "permission.asked":
            asked.append(event)
            reply, message = replies.pop(0)
            assert await h.reply_permission(event.data["id"], reply, message)

    return on_event


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the project, outside the session, holding a secret."""
    root = tmp_path / "outside"
    root.mkdir()
    (root / "secret.txt").write_text("TOPSECRET-91c2\n")
    return root


# --- 1. direct answer ----------------------------------------------------------------------


async def test_direct_answer(tmp_path: Path, project: Path) -> None:
    async with open_loop(tmp_path, project, [{"text": "forty-two"}]) as lp:
        result = await lp.h.run(lp.sid, "what is the answer?")
        assert (result.reason, result.answer, result.error) == ("answered", "forty-two", None)
        assert len(lp.requests) == 1
        assert lp.requests[0].messages == (UserTurn("what is the answer?"),)
        transcript = await lp.transcript()
        assert [m.info.role for m in transcript] == ["user", "assistant"]
        reply = transcript[1]
        assert isinstance(reply.info, AssistantMessage)
        assert reply.info.finish == "stop" and reply.info.error is None
        assert reply.info.parent_id == transcript[0].info.id == result.message_id
        assert [p.text for p in reply.parts if isinstance(p, TextPart)] == ["forty-two"]
        [finished] = lp.events("turn.finished")
        assert finished.data["reason"] == "answered"
        assert lp.h.session(lp.sid).status == "idle"


# --- 2. read then answer -------------------------------------------------------------------


async def test_read_then_answer(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [read("notes.txt", "callRead1")]}, {"text": "it says line two"}]
    async with open_loop(tmp_path, project, turns) as lp:
        result = await lp.h.run(lp.sid, "what do the notes say?")
        assert (result.reason, result.answer) == ("answered", "it says line two")
        assert len(lp.requests) == 2
        assert results_in(lp.requests[0]) == []
        second = lp.requests[1]
        assert calls_in(second) == ["callRead1"]
        [tool_result] = results_in(second)
        assert tool_result.call_id == "callRead1" and not tool_result.is_error
        assert "marker-7f3a line two" in tool_result.content
        # The result comes right after the assistant turn that made the call.
        assert [type(m) for m in second.messages] == [UserTurn, AssistantTurn, ToolResult]
        [part] = await lp.tool_parts()
        assert part.call_id == "callRead1" and part.tool == "read"
        assert isinstance(part.state, ToolCompleted)
        assert "marker-7f3a" in part.state.output
        assert part.state.input == {"path": "notes.txt"}
        steps = await lp.assistants()
        assert [m.info.finish for m in steps] == ["tool_calls", "stop"]  # type: ignore[union-attr]


async def test_scripted_call_ids_bind_results_without_explicit_ids(
    tmp_path: Path, project: Path
) -> None:
    turns = [{"tool_calls": [read("notes.txt"), read("package.json")]}, {"text": "ok"}]
    async with open_loop(tmp_path, project, turns) as lp:
        assert (await lp.h.run(lp.sid, "read both")).reason == "answered"
        parts = await lp.tool_parts()
        assert len({p.call_id for p in parts}) == 2
        by_call = {r.call_id: r for r in results_in(lp.requests[1])}
        assert calls_in(lp.requests[1]) == [p.call_id for p in parts]
        for part in parts:
            assert isinstance(part.state, ToolCompleted)
            assert by_call[part.call_id].content == part.state.output
        assert "marker-7f3a" in by_call[parts[0].call_id].content
        assert "pnpm@9" in by_call[parts[1].call_id].content


async def test_a_call_id_already_in_the_session_gets_a_fresh_one(
    tmp_path: Path, project: Path
) -> None:
    """A model that reuses an id (across steps, or twice in one reply) must not leave two
    results for one id in the history, which providers reject (issue 12, item 2)."""
    turns = [
        {"tool_calls": [read("notes.txt", "dup000001")]},
        {"tool_calls": [read("package.json", "dup000001"), read("notes.txt", "dup000002")]},
        {"tool_calls": [read("package.json", "dup000002")]},
        {"text": "ok"},
    ]
    async with open_loop(tmp_path, project, turns) as lp:
        assert (await lp.h.run(lp.sid, "read twice")).reason == "answered"
        parts = await lp.tool_parts()
        ledger = lp.h.ledger
        await ledger.flush()
        rebuilt = History(ledger, lp.sid)
        rebuilt.sync()
        chat = rebuilt.chat()
    last = lp.requests[-1]
    ids = [r.call_id for r in results_in(last)]
    assert len(ids) == len(set(ids)) == 4, ids
    assert calls_in(last) == ids == [p.call_id for p in parts]
    assert ids[0] == "dup000001" and ids[2] == "dup000002"
    assert "dup000001" not in ids[1:] and ids[3] != "dup000002"
    # The model's own id is kept next to the fresh one, so the mapping is in the ledger...
    assert [p.model_call_id for p in parts] == [None, "dup000001", None, "dup000002"]
    # ...and a history rebuilt from the ledger alone sends the same request.
    assert chat[:-1] == list(last.messages)  # the last request, then the final answer
    by_call = {r.call_id: r.content for r in results_in(last)}
    assert "pnpm@9" in by_call[ids[1]] and "marker-7f3a" in by_call[ids[2]]


# --- 3. invalid arguments ------------------------------------------------------------------


async def test_opencode_argument_names_are_accepted(tmp_path: Path, project: Path) -> None:
    """Models trained on OpenCode send its argument names; each tool of the same name takes
    them (issue 12, item 3), and the schema the model sees keeps ours."""
    calls = [
        {"name": "write", "arguments": {"filePath": "out.txt", "content": "alpha beta\n"}},
        {
            "name": "edit",
            "arguments": {
                "filePath": "out.txt",
                "oldString": "beta",
                "newString": "gamma",
                "replaceAll": True,
            },
        },
        {"name": "read", "arguments": {"filePath": "out.txt", "offset": 1, "limit": 5}},
        {"name": "glob", "arguments": {"pattern": "*.txt", "path": "."}},
        {"name": "grep", "arguments": {"pattern": "gamma", "path": ".", "include": "*.txt"}},
        {"name": "list", "arguments": {"path": ".", "ignore": ["node_modules"]}},
        {
            "name": "bash",
            "arguments": {"command": "echo ok", "timeout": 5000, "description": "Say ok"},
        },
        {
            "name": "todowrite",
            "arguments": {
                "todos": [
                    {"content": "check", "status": "pending", "priority": "high", "id": "1"},
                    {"content": "ship", "status": "completed", "priority": "low", "id": "2"},
                ]
            },
        },
    ]
    turns = [{"tool_calls": [call]} for call in calls] + [{"text": "done"}]
    rules = [Rule(permission="*", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        assert (await lp.h.run(lp.sid, "use opencode names")).reason == "answered"
        parts = await lp.tool_parts()
        todos = lp.h.todos(lp.sid)
    assert [p.tool for p in parts] == [c["name"] for c in calls]
    for part in parts:
        assert isinstance(part.state, ToolCompleted), (part.tool, part.state)
        assert "ignored arguments" not in part.state.output, part.state.output
    assert (project / "out.txt").read_text() == "alpha gamma\n"
    assert "alpha gamma" in parts[2].state.output  # type: ignore[union-attr]
    assert [t.content for t in todos] == ["check", "ship"]
    # The schema the model saw kept our names and still forbids others.
    write_spec = next(t for t in lp.requests[0].tools if t.name == "write")
    assert set(write_spec.parameters["properties"]) == {"path", "content"}
    assert write_spec.parameters["additionalProperties"] is False


def test_task_takes_opencode_subagent_type() -> None:
    from harness.tools.base import parse_arguments
    from harness.tools.task import TaskParams

    args, ignored = parse_arguments(
        TaskParams, {"description": "look", "prompt": "find it", "subagent_type": "explore"}
    )
    assert (args.agent, ignored) == ("explore", [])
    # Both spellings: ours wins, and the other is named as ignored.
    args, ignored = parse_arguments(
        TaskParams,
        {"description": "d", "prompt": "p", "agent": "general", "subagent_type": "explore"},
    )
    assert (args.agent, ignored) == ("general", ["subagent_type"])


async def test_unknown_arguments_are_dropped_and_named_in_the_result(
    tmp_path: Path, project: Path
) -> None:
    """One rule for every tool: an argument no schema has is dropped, the call still does
    its work, and the result names what was ignored; the ledger keeps what was sent."""
    sent_write = {"path": "out.txt", "content": "x", "mode": "a", "force": True}
    sent_todo = {"todos": [{"content": "c", "status": "pending", "owner": "me"}], "v": 2}
    turns = [
        {"tool_calls": [{"name": "write", "arguments": sent_write}]},
        {"tool_calls": [{"name": "todowrite", "arguments": sent_todo}]},
        {"tool_calls": [{"name": "read", "arguments": {"path": "missing.txt", "x": 1}}]},
        {"text": "done"},
    ]
    rules = [Rule(permission="*", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        assert (await lp.h.run(lp.sid, "write it")).reason == "answered"
        write, todo, read_ = await lp.tool_parts()
    assert (project / "out.txt").read_text() == "x"
    assert isinstance(write.state, ToolCompleted)
    assert write.state.output.endswith(
        "(ignored arguments this tool does not take: mode, force)"
    )
    assert write.state.input == sent_write
    assert isinstance(todo.state, ToolCompleted)
    assert todo.state.output.endswith(
        "(ignored arguments this tool does not take: todos.0.owner, v)"
    )
    # A call that fails for its own reason still says what was ignored.
    assert isinstance(read_.state, ToolError)
    assert read_.state.error.endswith("(ignored arguments this tool does not take: x)")
    results = results_in(lp.requests[-1])
    assert results[0].content == write.state.output


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        pytest.param({"path": "out.txt"}, "content: Field required", id="missing-field"),
        pytest.param({"path": "out.txt", "content": ["x"]}, "content:", id="wrong-type"),
        pytest.param('{"path": "out.txt", "content": ', "not valid JSON", id="broken-json"),
    ],
)
async def test_invalid_arguments_never_run_the_tool(
    tmp_path: Path, project: Path, arguments: Any, problem: str
) -> None:
    turns = [
        {"tool_calls": [{"name": "write", "arguments": arguments, "id": "callBad1"}]},
        {"text": "sorry, fixed"},
    ]
    # Writing is allowed: only validation stands between the call and the file.
    rules = [Rule(permission="edit", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "write out.txt")
        assert (result.reason, result.answer) == ("answered", "sorry, fixed")
        assert not (project / "out.txt").exists()
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert problem in part.state.error
        assert "write" in part.state.error
        assert len(lp.requests) == 2
        [seen] = results_in(lp.requests[1])
        assert seen.call_id == "callBad1" and seen.is_error
        assert seen.content == part.state.error
        # Nothing was asked: validation comes before permission.
        assert lp.events("permission.decided") == []


# --- 4. unknown tool -----------------------------------------------------------------------


async def test_unknown_tool_lists_available_tools(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [{"name": "frobnicate", "arguments": {"x": 1}, "id": "callUnk1"}]},
        {"text": "I will use read instead"},
    ]
    async with open_loop(tmp_path, project, turns) as lp:
        result = await lp.h.run(lp.sid, "frobnicate it")
        assert result.reason == "answered"
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        error = part.state.error
        assert "unknown tool 'frobnicate'" in error
        for name in ("read", "write", "edit", "bash", "glob", "grep", "list"):
            assert name in error
        [seen] = results_in(lp.requests[1])
        assert (seen.call_id, seen.is_error, seen.content) == ("callUnk1", True, error)


async def test_unknown_tool_call_keeps_the_model_arguments(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [{"name": "frobnicate", "arguments": {"x": 1}, "id": "callUnk2"}]},
        {"text": "ok"},
    ]
    async with open_loop(tmp_path, project, turns) as lp:
        assert (await lp.h.run(lp.sid, "frobnicate it")).reason == "answered"
        [part] = await lp.tool_parts()
        assert part.state.input == {"x": 1}
        [turn] = [m for m in lp.requests[1].messages if isinstance(m, AssistantTurn)]
        assert json.loads(turn.tool_calls[0].arguments) == {"x": 1}


# --- provider error ------------------------------------------------------------------------


async def test_provider_error_ends_the_turn_with_error(tmp_path: Path, project: Path) -> None:
    turns = [{"error": {"kind": "auth", "message": "invalid api key"}}]
    async with open_loop(tmp_path, project, turns) as lp:
        result = await lp.h.run(lp.sid, "hello")
        assert result.reason == "error"
        assert result.error is not None and "invalid api key" in result.error
        assert len(lp.requests) == 1
        [step] = await lp.assistants()
        assert isinstance(step.info, AssistantMessage)
        assert step.info.error is not None and "invalid api key" in step.info.error
        [finished] = lp.events("turn.finished")
        assert finished.data["reason"] == "error"


# --- 5. permission deny --------------------------------------------------------------------


async def test_permission_deny_rule_has_no_side_effect(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [bash("touch made.txt", "callDeny1")]}, {"text": "never sent"}]
    rules = [Rule(permission="bash", pattern="touch *", action="deny")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "make a file")
        assert result.reason == "denied"
        assert not (project / "made.txt").exists()
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "denies" in part.state.error and "touch made.txt" in part.state.error
        # A denial stops the loop: the model is not called again this turn...
        assert len(lp.requests) == 1
        # ...and the decision is on record with the rule that matched.
        [decided] = lp.events("permission.decided")
        assert decided.data["allowed"] is False and decided.data["source"] == "rule"
        assert decided.data["rule"] == {
            "permission": "bash",
            "pattern": "touch *",
            "action": "deny",
        }
        # The model sees the denial as the call's result in the next request.
        history = History(lp.h.ledger, lp.sid)
        history.sync()
        [seen] = [m for m in history.chat() if isinstance(m, ToolResult)]
        assert seen.call_id == "callDeny1" and seen.is_error and "denies" in seen.content


async def test_permission_blanket_deny_stops_with_denied(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [bash("touch made.txt")]}, {"text": "carried on"}]
    rules = [Rule(permission="bash", pattern="*", action="deny")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "make a file")
        assert not (project / "made.txt").exists()
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "den" in part.state.error  # "denied" / "denies", not "unknown tool"
        assert result.reason == "denied"
        assert len(lp.requests) == 1


# --- 6. permission ask ---------------------------------------------------------------------


async def test_permission_ask_once_pauses_then_runs_exactly_once(
    tmp_path: Path, project: Path
) -> None:
    log_file = project / "log.txt"
    turns = [{"tool_calls": [bash("echo ran >> log.txt", "callAsk1")]}, {"text": "appended"}]
    # The redirection is a write (issue 11): edit is allowed so that the one ask is bash's.
    edits = [Rule(permission="edit", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, interactive=True, rules=edits) as lp:
        asked: list[Event] = []

        async def on_event(event: Event) -> None:
            if event.type != "permission.asked":
                return
            asked.append(event)
            # Paused: nothing ran, the part is not running, the ask is listed as pending.
            assert not log_file.exists()
            [part] = await lp.tool_parts()
            assert part.state.status == "pending"
            [pending] = await lp.h.pending_permissions(lp.sid)
            assert pending.id == event.data["id"] and pending.call_id == "callAsk1"
            assert (pending.permission, pending.pattern) == ("bash", "echo ran >> log.txt")
            await trio.sleep(0.05)  # still paused a while later
            assert not log_file.exists()
            assert await lp.h.reply_permission(event.data["id"], "once")
            assert not await lp.h.reply_permission(event.data["id"], "once")  # answered

        result = await lp.drive("append a line", on_event)
        assert (result.reason, result.answer) == ("answered", "appended")
        assert len(asked) == 1
        assert log_file.read_text() == "ran\n"
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolCompleted) and part.call_id == "callAsk1"
        assert await lp.h.pending_permissions(lp.sid) == []
        [replied] = lp.events("permission.replied")
        assert replied.data["reply"] == "once"
        assert lp.h.ledger.approvals(str(project)) == []  # "once" stores nothing
        assert len(lp.requests) == 2


async def test_permission_ask_reject_stops_without_running(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [bash("echo ran >> log.txt")]}, {"text": "never sent"}]
    async with open_loop(tmp_path, project, turns, interactive=True) as lp:
        asked: list[Event] = []
        result = await lp.drive("append a line", replier(lp.h, [("reject", None)], asked))
        assert result.reason == "denied"
        assert len(asked) == 1
        assert not (project / "log.txt").exists()
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "rejected" in part.state.error
        assert len(lp.requests) == 1


async def test_permission_reject_with_feedback_continues(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [bash("echo ran >> log.txt", "callFb1")]},
        {"text": "ok, I will not touch the log"},
    ]
    async with open_loop(tmp_path, project, turns, interactive=True) as lp:
        replies: list[tuple[Reply, str | None]] = [("reject", "do not write logs here")]
        result = await lp.drive("append a line", replier(lp.h, replies, []))
        assert (result.reason, result.answer) == ("answered", "ok, I will not touch the log")
        assert not (project / "log.txt").exists()
        assert len(lp.requests) == 2
        [seen] = results_in(lp.requests[1])
        assert seen.call_id == "callFb1" and seen.is_error
        assert "do not write logs here" in seen.content


async def test_permission_always_is_remembered(tmp_path: Path, project: Path) -> None:
    log_file = project / "log.txt"
    turns = [
        {"tool_calls": [bash("echo one >> log.txt")]},
        {"text": "first done"},
        {"tool_calls": [bash("echo two >> log.txt")]},
        {"text": "second done"},
    ]
    # The redirection is a write (issue 11): edit is allowed so that the one ask is bash's.
    edits = [Rule(permission="edit", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, interactive=True, rules=edits) as lp:
        asked: list[Event] = []
        replies: list[tuple[Reply, str | None]] = [("always", None)]
        first = await lp.drive("append one", replier(lp.h, replies, asked))
        second = await lp.drive("append two", replier(lp.h, replies, asked))
        assert (first.reason, first.answer) == ("answered", "first done")
        assert (second.reason, second.answer) == ("answered", "second done")
        assert len(asked) == 1  # the second command, same prefix, was not asked again
        assert log_file.read_text() == "one\ntwo\n"
        approval = Rule(permission="bash", pattern="echo *", action="allow")
        assert lp.h.ledger.approvals(str(project)) == [approval]
        decided = [d for d in lp.events("permission.decided") if d.data["permission"] == "bash"]
        assert [d.data["source"] for d in decided] == ["reply", "approved"]


async def test_cancel_while_permission_pending(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [bash("echo ran >> log.txt")]}, {"text": "never sent"}]
    async with open_loop(tmp_path, project, turns, interactive=True) as lp:

        async def on_event(event: Event) -> None:
            if event.type == "permission.asked":
                assert await lp.h.cancel(lp.sid)

        result = await lp.drive("append a line", on_event)
        assert result.reason == "cancelled"
        assert not (project / "log.txt").exists()
        assert await lp.h.pending_permissions(lp.sid) == []
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError) and part.state.error == "cancelled"


# --- 7. non-interactive ask ----------------------------------------------------------------


async def test_non_interactive_ask_is_rejected_naming_the_flag(
    tmp_path: Path, project: Path
) -> None:
    turns = [{"tool_calls": [bash("touch made.txt")]}, {"text": "never sent"}]
    async with open_loop(tmp_path, project, turns, interactive=False) as lp:
        result = await lp.h.run(lp.sid, "make a file")
        assert result.reason == "denied"
        assert not (project / "made.txt").exists()
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "--allow 'bash:touch *'" in part.state.error
        assert lp.events("permission.asked") == []
        [decided] = lp.events("permission.decided")
        assert decided.data["source"] == "no-terminal" and decided.data["allowed"] is False
        assert len(lp.requests) == 1


# --- 8. identical repeated calls -----------------------------------------------------------


async def test_identical_repeated_calls_stop_at_doom_loop(tmp_path: Path, project: Path) -> None:
    same = {"tool_calls": [read("notes.txt")]}
    turns = [same] * 8 + [{"text": "never reached"}]
    async with open_loop(tmp_path, project, turns, interactive=False) as lp:
        result = await lp.h.run(lp.sid, "read the notes forever")
        assert result.reason == "doom_loop"
        assert len(lp.requests) == 3
        parts = await lp.tool_parts()
        assert [p.state.status for p in parts] == ["completed", "completed", "error"]
        third = parts[2].state
        assert isinstance(third, ToolError) and "doom_loop" in third.error
        [decided] = [d for d in lp.events("permission.decided") if d.data["permission"] != "read"]
        assert decided.data["permission"] == "doom_loop" and decided.data["allowed"] is False


async def test_identical_calls_within_one_step_ask_doom_loop(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [read("notes.txt")] * 3}, {"text": "never reached"}]
    async with open_loop(tmp_path, project, turns, interactive=False) as lp:
        result = await lp.h.run(lp.sid, "read thrice")
        assert result.reason == "doom_loop"
        parts = await lp.tool_parts()
        assert [p.state.status for p in parts] == ["completed", "completed", "error"]
        assert len(lp.requests) == 1


async def test_doom_loop_ask_once_lets_the_loop_go_on(tmp_path: Path, project: Path) -> None:
    same = {"tool_calls": [read("notes.txt")]}
    turns = [same, same, same, same, {"text": "stopped myself"}]
    async with open_loop(tmp_path, project, turns, interactive=True) as lp:
        asked: list[Event] = []
        replies: list[tuple[Reply, str | None]] = [("once", None), ("once", None)]
        result = await lp.drive("read", replier(lp.h, replies, asked))
        assert (result.reason, result.answer) == ("answered", "stopped myself")
        assert [a.data["permission"] for a in asked] == ["doom_loop", "doom_loop"]
        assert [p.state.status for p in await lp.tool_parts()] == ["completed"] * 4
        assert len(lp.requests) == 5


# --- 9. cancel -----------------------------------------------------------------------------


async def test_cancel_stops_a_running_bash_tree(tmp_path: Path, project: Path) -> None:
    marker = f"{300 + os.getpid() % 1000 / 10_000:.4f}"  # unique: sleep 300.xxxx
    command = f"sleep {marker} & sleep {marker}; wait"
    turns = [{"tool_calls": [bash(command, "callCancel1")]}, {"text": "never sent"}]
    rules = [Rule(permission="bash", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        seen_alive: list[int] = []

        async def on_event(event: Event) -> None:
            if event.type != "part.updated" or event.data.get("type") != "tool":
                return
            state = event.data["state"]
            # The running update that names the process group: the command has started.
            if state["status"] != "running" or "process" not in state["metadata"]:
                return
            for _ in range(400):  # /proc has no change notification: poll, up to 2 s
                if len(alive_with(f"sleep {marker}")) >= 2:
                    break
                await trio.sleep(0.005)
            seen_alive.extend(alive_with(f"sleep {marker}"))
            assert await lp.h.cancel(lp.sid)

        started = time.monotonic()
        result = await lp.drive("sleep a long time", on_event)
        assert time.monotonic() - started < 3
        assert len(seen_alive) >= 2  # both sleeps were running when the cancel came
        assert result.reason == "cancelled"
        assert alive_with(f"sleep {marker}") == []
        [part] = await lp.tool_parts()
        assert part.call_id == "callCancel1"
        assert isinstance(part.state, ToolError) and part.state.error == "cancelled"
        [finished] = lp.events("turn.finished")
        assert finished.data["reason"] == "cancelled"
        assert lp.h.ledger.open_tool_parts(lp.sid) == []
        assert lp.h.session(lp.sid).status == "idle"
        assert len(lp.requests) == 1


async def test_cancel_during_a_tool_marks_the_assistant_message_aborted(
    tmp_path: Path, project: Path
) -> None:
    turns = [{"tool_calls": [bash("sleep 300.4243", "callCancel2")]}, {"text": "never sent"}]
    rules = [Rule(permission="bash", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:

        async def on_event(event: Event) -> None:
            if (
                event.type == "part.updated"
                and event.data.get("type") == "tool"
                and event.data["state"]["status"] == "running"
                and "process" in event.data["state"]["metadata"]  # the command has started
            ):
                assert await lp.h.cancel(lp.sid)

        result = await lp.drive("sleep a long time", on_event)
        assert result.reason == "cancelled"
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError) and part.state.error == "cancelled"
        [step] = await lp.assistants()
        assert isinstance(step.info, AssistantMessage)
        assert step.info.error == "cancelled"


async def test_cancel_during_the_provider_stream(tmp_path: Path, project: Path) -> None:
    turns = [{"delay": 300, "text": "too late"}]
    async with open_loop(tmp_path, project, turns) as lp:
        cancelled_at: list[float] = []

        async def on_event(event: Event) -> None:
            if event.type == "part.created" and event.data.get("type") == "step-start":
                await trio.sleep(0.02)  # well inside the stream's 300 s delay
                cancelled_at.append(time.monotonic())
                assert await lp.h.cancel(lp.sid)

        result = await lp.drive("think hard", on_event)
        assert time.monotonic() - cancelled_at[0] < 0.5
        assert result.reason == "cancelled"
        assert len(lp.requests) == 1
        [step] = await lp.assistants()
        assert isinstance(step.info, AssistantMessage)
        assert step.info.error == "cancelled" and step.info.finish is None
        assert not any(isinstance(p, TextPart) and p.text for p in step.parts)
        assert not await lp.h.cancel(lp.sid)  # nothing left to cancel


# --- 10. tool raises -----------------------------------------------------------------------


class BoomParams(ToolParams):
    what: str = "anything"


class BoomTool(Tool[BoomParams]):
    name: ClassVar[str] = "boom"
    description: ClassVar[str] = "Always raises."
    params = BoomParams
    read_only: ClassVar[bool] = True

    async def execute(self, args: BoomParams, ctx: ToolContext) -> ToolOutput:
        raise RuntimeError("boom: the tool blew up")


@pytest.fixture
def with_boom_tool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def tools() -> dict[str, Tool[Any]]:
        return {**builtin_tools(), "boom": BoomTool()}

    monkeypatch.setattr(harness.runtime, "builtin_tools", tools)
    yield


@pytest.mark.usefixtures("with_boom_tool")
async def test_tool_raises_error_is_fed_back(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [{"name": "boom", "arguments": {}, "id": "callBoom1"}]},
        {"text": "the tool failed"},
    ]
    rules = [Rule(permission="boom", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "use boom")
        assert "boom" in [t.name for t in lp.requests[0].tools]
        assert (result.reason, result.answer) == ("answered", "the tool failed")
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "RuntimeError" in part.state.error and "boom: the tool blew up" in part.state.error
        [seen] = results_in(lp.requests[1])
        assert seen.call_id == "callBoom1" and seen.is_error
        assert "boom: the tool blew up" in seen.content
        assert lp.h.session(lp.sid).status == "idle"


async def test_tool_failure_is_fed_back(tmp_path: Path, project: Path) -> None:
    turns = [{"tool_calls": [read("missing.txt", "callMiss1")]}, {"text": "no such file"}]
    async with open_loop(tmp_path, project, turns) as lp:
        result = await lp.h.run(lp.sid, "read missing.txt")
        assert (result.reason, result.answer) == ("answered", "no such file")
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError) and "missing.txt" in part.state.error
        [seen] = results_in(lp.requests[1])
        assert seen.is_error and seen.content == part.state.error


# --- 11. max steps -------------------------------------------------------------------------


async def test_max_steps_last_step_has_no_tools(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [read("notes.txt")]},
        {"text": "step limit reached; I read the notes"},
        {"text": "never reached"},
    ]
    async with open_loop(tmp_path, project, turns, max_steps=2) as lp:
        result = await lp.h.run(lp.sid, "keep reading")
        assert result.reason == "max_steps"
        assert result.answer == "step limit reached; I read the notes"
        assert len(lp.requests) == 2
        first, last = lp.requests
        assert first.tools and first.tool_choice == "auto"
        assert not any("MAXIMUM STEPS REACHED" in s for s in first.system)
        assert last.tools == () and last.tool_choice == "none"
        assert any("MAXIMUM STEPS REACHED" in s for s in last.system)
        [finished] = lp.events("turn.finished")
        assert finished.data["reason"] == "max_steps"


async def test_max_steps_refuses_a_tool_call_on_the_last_step(
    tmp_path: Path, project: Path
) -> None:
    turns = [
        {"tool_calls": [read("notes.txt")]},
        {"tool_calls": [{"name": "write", "arguments": {"path": "late.txt", "content": "x"}}]},
        {"text": "never reached"},
    ]
    rules = [Rule(permission="edit", pattern="*", action="allow")]
    async with open_loop(tmp_path, project, turns, max_steps=2, rules=rules) as lp:
        result = await lp.h.run(lp.sid, "keep going")
        assert result.reason == "max_steps"
        assert len(lp.requests) == 2
        assert not (project / "late.txt").exists()
        parts = await lp.tool_parts()
        assert [p.state.status for p in parts] == ["completed", "error"]
        refused = parts[1].state
        assert isinstance(refused, ToolError) and "step limit" in refused.error


# --- 12. path escape through a symlink -----------------------------------------------------


@pytest.mark.parametrize("how", ["file-link", "dir-link", "dotdot"])
async def test_path_escape_is_refused(
    tmp_path: Path, project: Path, outside: Path, how: str
) -> None:
    if how == "file-link":
        (project / "innocent.txt").symlink_to(outside / "secret.txt")
        path = "innocent.txt"
    elif how == "dir-link":
        (project / "docs").symlink_to(outside, target_is_directory=True)
        path = "docs/secret.txt"
    else:
        path = "../outside/secret.txt"
    turns = [{"tool_calls": [read(path, "callEsc1")]}, {"text": "never sent"}]
    async with open_loop(tmp_path, project, turns, interactive=False) as lp:
        result = await lp.h.run(lp.sid, "read it")
        assert result.reason == "denied"
        [part] = await lp.tool_parts()
        assert isinstance(part.state, ToolError)
        assert "external_directory" in part.state.error
        [decided] = lp.events("permission.decided")
        assert decided.data["permission"] == "external_directory"
        assert decided.data["pattern"] == f"{outside.resolve()}/*"
        # The secret is nowhere: not in the ledger, not in anything sent to the model.
        everything = json.dumps([m.model_dump() for m in await lp.transcript()])
        everything += repr(lp.requests)
        everything += json.dumps([e.data for e in lp.events("part.updated")])
        assert "TOPSECRET" not in everything


# --- 13. the ledger alone rebuilds the next request after a kill ---------------------------

CHILD = """
import dataclasses, json, sys
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from harness.config import Config
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness


class Dumping(ScriptedProvider):
    @asynccontextmanager
    async def stream(self, request):
        messages = [dataclasses.asdict(m) for m in request.messages]
        print(json.dumps({"step": request.step, "messages": messages}), flush=True)
        async with super().stream(request) as events:
            yield events


async def main():
    home, project = Path(sys.argv[1]), Path(sys.argv[2])
    provider = Dumping.from_turns([
        {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}, "id": "callKeep1"}]},
        {"delay": 300, "text": "never"},
    ])
    config = Config(
        home=home, model="scripted:unused", provider_factory=lambda m: provider,
        interactive=False,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        print(json.dumps({"session": session.id}), flush=True)
        await h.run(session.id, "what do the notes say?")


trio.run(main)
"""


def _as_json(messages: Any) -> Any:
    return json.loads(json.dumps([dataclasses.asdict(m) for m in messages]))


async def test_ledger_rebuilds_the_next_request_after_kill(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "home"
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(CHILD))
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(child), str(home), str(project)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=str(tmp_path),
    )
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    buffer = b""
    try:
        with trio.fail_after(10):
            # Session id, step 1's request, step 2's request: then it sits in the stream.
            while len(lines) < 3:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the child exited early"
                buffer += chunk
                *done, buffer = buffer.split(b"\n")
                lines.extend(json.loads(line) for line in done)
        session_id = lines[0]["session"]
        step2 = lines[2]
        assert step2["step"] == 2
        # The tool result is durable before the kill.
        conn = apsw.Connection(str(home / "ledger.db"), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = conn.execute(
                "SELECT status FROM parts WHERE session_id = ? AND type = 'tool'", (session_id,)
            ).fetchall()
        finally:
            conn.close()
        assert rows == [("completed",)]
    finally:
        proc.send_signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await proc.wait()
            await proc.stdout.aclose()
    assert proc.returncode == -signal.SIGKILL

    # A fresh History on the ledger alone gives exactly what the dead process sent.
    ledger = Ledger(home / "ledger.db")
    try:
        history = History(ledger, session_id)
        history.sync()
        chat = history.chat()
    finally:
        ledger.close()
    assert _as_json(chat) == step2["messages"]
    [result] = [m for m in chat if isinstance(m, ToolResult)]
    assert result.call_id == "callKeep1" and "marker-7f3a" in result.content

    # A new harness on the same home resumes the interrupted turn by itself: its request
    # is the interrupted one (the original call and its result), with no restart note.
    provider = ScriptedProvider.from_turns(
        [{"text": "unused"}, {"text": "the notes mention marker-7f3a"}, {"text": "nothing more"}],
        record=True,
    )
    config = Config(
        home=home,
        model="scripted:unused",
        provider_factory=lambda model: provider,
        interactive=False,
    )
    async with open_harness(config) as h:
        # Queued behind the resumed turn, so when it is answered both are done.
        result_after = await h.run(session_id, "and now?")
        assert (result_after.reason, result_after.answer) == ("answered", "nothing more")
        finished = [e.data for e in h.ledger.events_after(0) if e.type == "turn.finished"]
    resumed, after = provider.requests
    assert _as_json(resumed.messages) == step2["messages"]
    assert "restarted" not in json.dumps(_as_json(resumed.messages))
    assert calls_in(resumed) == ["callKeep1"]
    assert [f["reason"] for f in finished] == ["answered", "answered"]
    assert finished[0]["answer"] == "the notes mention marker-7f3a"
    assert _as_json(after.messages)[-1] == {"text": "and now?", "role": "user"}


# --- 14. queue and steer -------------------------------------------------------------------


class GatedProvider(ScriptedProvider):
    """Holds the stream of request number ``gate_at`` until ``release`` is set."""

    def __init__(self, turns: list[dict[str, Any]], gate_at: int) -> None:
        base = ScriptedProvider.from_turns(turns)
        super().__init__(base.turns, record=True)
        self.gate_at = gate_at
        self.reached = trio.Event()
        self.release = trio.Event()

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        if len(self.requests) == self.gate_at:
            self.reached.set()
            await self.release.wait()
        async with super().stream(request) as events:
            yield events


async def _finished(events: trio.MemoryReceiveChannel[Event], count: int) -> list[Event]:
    out: list[Event] = []
    with trio.fail_after(TURN_TIMEOUT):
        async for event in events:
            if event.type == "turn.finished":
                out.append(event)
                if len(out) == count:
                    break
    return out


async def test_queued_prompts_run_as_two_turns_in_order(tmp_path: Path, project: Path) -> None:
    provider = GatedProvider([{"text": "first answer"}, {"text": "second answer"}], gate_at=0)
    async with open_loop(tmp_path, project, provider=provider) as lp:
        async with lp.h.subscribe(lp.sid) as events:
            one = await lp.h.prompt(lp.sid, "question one")
            await provider.reached.wait()  # turn one is in its stream
            two = await lp.h.prompt(lp.sid, "question two")
            provider.release.set()
            finished = await _finished(events, 2)
        assert [f.data["message_id"] for f in finished] == [one, two]
        assert [f.data["answer"] for f in finished] == ["first answer", "second answer"]
        assert [f.data["reason"] for f in finished] == ["answered", "answered"]
        first, second = lp.requests
        assert first.messages == (UserTurn("question one"),)  # not joined into turn one
        assert second.messages == (
            UserTurn("question one"),
            AssistantTurn("first answer"),
            UserTurn("question two"),
        )
        transcript = await lp.transcript()
        assert [m.info.role for m in transcript] == ["user", "assistant", "user", "assistant"]
        assert [m.info.id for m in transcript if isinstance(m.info, UserMessage)] == [one, two]
        assert transcript[3].info.parent_id == two  # type: ignore[union-attr]


async def test_a_turn_reads_its_inbox_once_not_once_a_step(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steering check of each step skips the read while nothing was added (issue 18):
    the ledger's inbox mark has not moved since the inbox was seen empty."""
    turns = [{"tool_calls": [read(name)]} for name in ("notes.txt", "a.txt", "b.txt")]
    turns.append({"text": "done"})
    async with open_loop(tmp_path, project, turns) as lp:
        ledger = lp.h.ledger
        reads: list[tuple[Any, ...]] = []
        rows = ledger._rows

        def counting(sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            if sql.startswith("SELECT data FROM inbox WHERE session_id"):
                reads.append(args)
            return rows(sql, args)

        monkeypatch.setattr(ledger, "_rows", counting)
        result = await lp.drive("read it three times")
        await ledger.flush()
        assert (result.reason, result.answer) == ("answered", "done")
        assert len(lp.requests) == 4
        assert reads == [(lp.sid,)]  # to take the prompt; none for the four steps
        assert ledger.inbox_mark(lp.sid) > 0  # the prompt moved it


async def test_steer_joins_the_running_turn(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [read("notes.txt", "callSteer1")]},
        {"text": "noted, using pnpm"},
    ]
    provider = GatedProvider(turns, gate_at=0)
    async with open_loop(tmp_path, project, provider=provider) as lp:
        async with lp.h.subscribe(lp.sid) as events:
            one = await lp.h.prompt(lp.sid, "read the notes")
            await provider.reached.wait()
            steer = await lp.h.prompt(lp.sid, "also: we use pnpm", delivery="steer")
            provider.release.set()
            [finished] = await _finished(events, 1)
            assert lp.h.ledger.inbox(lp.sid) == []
        assert finished.data["message_id"] == one
        assert (finished.data["reason"], finished.data["answer"]) == (
            "answered",
            "noted, using pnpm",
        )
        assert len(lp.requests) == 2
        second = lp.requests[1]
        # Before the next step: after the tool result, the steered text as a user turn.
        assert [type(m) for m in second.messages] == [UserTurn, AssistantTurn, ToolResult, UserTurn]
        last = second.messages[-1]
        assert isinstance(last, UserTurn) and last.text.endswith("also: we use pnpm")
        transcript = await lp.transcript()
        roles = [(m.info.role, getattr(m.info, "delivery", None)) for m in transcript]
        assert roles == [
            ("user", "queue"),
            ("assistant", None),
            ("user", "steer"),
            ("assistant", None),
        ]
        assert transcript[2].info.id == steer
        assert len(lp.events("turn.finished")) == 1

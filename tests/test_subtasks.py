"""The session tree: the task tool, its children, their permissions, cancel and tracing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from procs import alive_with

from harness.messages.model import Rule, SubtaskPart
from harness.permissions.ruleset import decide

if TYPE_CHECKING:
    from conftest import ScriptedHarness, ToolParts


def task(description: str, prompt: str, call_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "task",
        "arguments": {"description": description, "prompt": prompt, **extra},
        "id": call_id,
    }


async def test_parallel_tasks_return_each_answer_bound_to_its_call(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    turns = [
        {
            "tool_calls": [
                task("first", "say one", "callOne1"),
                task("second", "say two", "callTwo2"),
            ]
        },
        {"text": "both done"},
    ]
    subtasks = {
        "say one": [
            {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
            {"text": "one"},
        ],
        "say two": [{"delay": 0.05, "text": "two"}],
    }
    async with scripted_harness(turns, subtasks) as (h, provider):
        session = await h.create_session(project)
        result = await h.run(session.id, "split the work")
        assert (result.reason, result.answer) == ("answered", "both done")
        parts = {p.call_id: p for p in tool_parts(h, session.id)}
        assert parts["callOne1"].state.status == "completed"
        assert parts["callOne1"].state.output.startswith("one")  # type: ignore[union-attr]
        assert parts["callTwo2"].state.output.startswith("two")  # type: ignore[union-attr]
        children = h.ledger.children(session.id)
        assert sorted(c.title for c in children) == ["first", "second"]
        assert all(c.parent_id == session.id and c.agent == "general" for c in children)
        markers = [
            p for m in h.ledger.messages(session.id) for p in m.parts if isinstance(p, SubtaskPart)
        ]
        assert {m.child_session_id for m in markers} == {c.id for c in children}
        # Each result names its child's session, so the model can continue it later.
        for child in children:
            owner = "callOne1" if child.title == "first" else "callTwo2"
            assert child.id in parts[owner].state.output  # type: ignore[union-attr]
        # The parent's last request carries both results bound to their call ids.
        last = provider.requests[-1]
        results = {m.call_id: m.content for m in last.messages if m.role == "tool"}
        assert results["callOne1"].startswith("one") and results["callTwo2"].startswith("two")


async def test_cancelling_the_parent_stops_the_child_and_its_processes(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    marker = "sleep 300.6161"
    turns = [{"tool_calls": [task("slow", "run the slow thing", "callSlow1")]}, {"text": "x"}]
    subtasks = {
        "run the slow thing": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": f"{marker} & {marker}"}}]},
            {"text": "never"},
        ]
    }
    rules = [Rule(permission="bash", pattern="*", action="allow")]
    async with scripted_harness(turns, subtasks, rules=rules) as (h, _):
        session = await h.create_session(project)
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def run() -> None:
                results.append(await h.run(session.id, "go"))

            nursery.start_soon(run)
            with trio.fail_after(10):
                while len(alive_with(marker)) < 2:
                    await trio.sleep(0.01)
            assert await h.cancel(session.id)
        assert results[0].reason == "cancelled"
        assert alive_with(marker) == []
        [child] = h.ledger.children(session.id)
        assert h.ledger.open_tool_parts(session.id) == []
        assert h.ledger.open_tool_parts(child.id) == []
        [child_tool] = tool_parts(h, child.id)
        assert child_tool.state.status == "error"
        assert h.ledger.claimed_turns() == []  # nothing left to resume by mistake
        finished = [
            e.data["reason"]
            for e in h.ledger.events_after(0, session_ids=[child.id])
            if e.type == "turn.finished"
        ]
        assert finished == ["cancelled"]


async def test_a_child_is_never_allowed_what_the_parent_is_denied(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    (project / ".env").write_text("TOKEN=secret-value-42\n")
    turns = [{"tool_calls": [task("peek", "read the env file", "callEnv1")]}, {"text": "ok"}]
    subtasks = {
        "read the env file": [
            {"tool_calls": [{"name": "read", "arguments": {"path": ".env"}}]},
            {"text": "could not"},
        ]
    }
    # Config allows reading .env everywhere; the parent session itself denies it.
    rules = [Rule(permission="read", pattern="*.env", action="allow")]
    async with scripted_harness(turns, subtasks, rules=rules) as (h, provider):
        session = await h.create_session(
            project, permission=[Rule(permission="read", pattern="*.env", action="deny")]
        )
        await h.run(session.id, "look")
        [child] = h.ledger.children(session.id)
        [read] = tool_parts(h, child.id)
        assert read.state.status == "error"
        assert "denies" in read.state.error  # type: ignore[union-attr]
        seen = json.dumps([str(r.messages) for r in provider.requests])
        assert "secret-value-42" not in seen


async def test_a_childs_ask_without_a_terminal_is_rejected_at_once(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    turns = [{"tool_calls": [task("touch", "make a file", "callAsk1")]}, {"text": "ok"}]
    subtasks = {
        "make a file": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "touch child-made"}}]},
            {"text": "unreachable"},
        ]
    }
    async with scripted_harness(turns, subtasks) as (h, _):
        session = await h.create_session(project)
        with trio.fail_after(5):
            await h.run(session.id, "go")
        assert not (project / "child-made").exists()
        [part] = tool_parts(h, session.id)
        assert part.state.status == "error"
        assert "denied" in part.state.error  # type: ignore[union-attr]
        assert await h.pending_permissions() == []


async def test_depth_beyond_the_limit_is_an_error_the_model_sees(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness, tool_parts: ToolParts
) -> None:
    turns = [{"tool_calls": [task("level one", "go deeper", "callDeep1")]}, {"text": "done"}]
    subtasks = {
        "go deeper": [
            {"tool_calls": [task("level two", "deepest", "callDeep2")]},
            {"text": "could not go deeper"},
        ],
        "deepest": [{"text": "unreachable"}],
    }
    async with scripted_harness(turns, subtasks, max_task_depth=1) as (h, _):
        session = await h.create_session(project)
        result = await h.run(session.id, "go")
        assert result.answer == "done"
        [child] = h.ledger.children(session.id)
        [inner] = tool_parts(h, child.id)
        assert inner.state.status == "error"
        assert "at most 1 deep" in inner.state.error  # type: ignore[union-attr]
        assert h.ledger.children(child.id) == []


def test_an_always_approval_never_overrides_a_deny() -> None:
    rules = [
        Rule(permission="bash", pattern="*", action="ask"),
        Rule(permission="bash", pattern="git push *", action="deny"),
    ]
    approvals = [Rule(permission="bash", pattern="git *", action="allow")]
    assert decide("bash", "git status", [rules], approvals)[0] == "allow"
    assert decide("bash", "git push origin", [rules], approvals)[0] == "deny"
    # A ceiling (the parent's rules) denies what the child's own rules allow.
    child = [Rule(permission="read", pattern="*", action="allow")]
    parent = [Rule(permission="read", pattern="*.env", action="deny")]
    assert decide("read", "/p/.env", [child, parent])[0] == "deny"
    assert decide("read", "/p/a.py", [child, parent])[0] == "ask"


async def test_the_log_alone_rebuilds_the_session_tree(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    turns = [{"tool_calls": [task("sub", "do the sub thing", "callLog1")]}, {"text": "done"}]
    subtasks = {"do the sub thing": [{"text": "sub done"}]}
    async with scripted_harness(turns, subtasks) as (h, _):
        session = await h.create_session(project)
        await h.run(session.id, "go")
        [child] = h.ledger.children(session.id)
    lines = [
        json.loads(line)
        for line in (tmp_path / "home" / "logs" / "test.jsonl").read_text().splitlines()
    ]
    spans = {(line["span_id"], line.get("parent_span_id")) for line in lines if "span_id" in line}
    parent_of = dict(spans)
    assert {line["trace_id"] for line in lines if "trace_id" in line} == {session.id}
    # child session -> the task call -> the parent's step -> the parent session
    call = parent_of[child.id]
    assert call == "callLog1"
    step = parent_of[call]
    assert step.startswith("msg_") and parent_of[step] == session.id
    assert parent_of[session.id] is None


async def test_trace_shows_children_under_the_task_call_that_ran_them(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    from harness.trace import build_trace, render_trace

    turns = [
        {"tool_calls": [task("callers", "find the callers", "callTr1")]},
        {"text": "all done"},
    ]
    subtasks = {
        "find the callers": [
            {"tool_calls": [{"name": "grep", "arguments": {"pattern": "marker"}}]},
            {"text": "notes.txt"},
        ]
    }
    async with scripted_harness(turns, subtasks) as (h, _):
        session = await h.create_session(project, title="refactor")
        await h.run(session.id, "go")
        data = build_trace(h.ledger, session.id)
        drawing = render_trace(data)
        [child] = h.ledger.children(session.id)
    assert data["reason"] == "answered" and [s["step"] for s in data["steps"]] == [1, 2]
    [call] = data["steps"][0]["tools"]
    assert call["call_id"] == "callTr1" and call["status"] == "completed"
    assert call["permissions"] == [
        {"permission": "task", "allowed": True, "source": "rule", "reply": None},
    ]
    [sub] = call["children"]
    assert sub["session_id"] == child.id and sub["parent_id"] == session.id
    assert [t["tool"] for t in sub["steps"][0]["tools"]] == ["grep"]
    assert sub["reason"] == "answered"
    assert f"{child.id} (child)" in drawing and "task callers" in drawing

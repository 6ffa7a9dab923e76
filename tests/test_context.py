"""Context that lasts: the system prompt, compaction, pruning, budgets and titles."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from harness.context.compaction import COMPACTION_PROMPT, COMPACTION_SYSTEM, SECTIONS
from harness.history import PRUNED, SUMMARY_HEADER
from harness.messages.model import AssistantMessage, CompactionPart, ToolPart
from harness.messages.provider import ProviderRequest, ToolResult, UserTurn
from harness.providers.scripted import ScriptedProvider

if TYPE_CHECKING:
    from conftest import ScriptedHarness

SUMMARY = "\n".join(f"## {section}\nnotes about {section.lower()}" for section in SECTIONS)


def read(path: str, **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read", "arguments": {"path": path}}], **extra}


def system_text(request: ProviderRequest) -> str:
    return "\n".join(request.system)


async def test_agents_md_and_the_environment_reach_the_request(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    (project / "AGENTS.md").write_text("Run tests with `make check`. Never touch vendor/.\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "AGENTS.md").write_text("The user prefers short answers.\n")
    await trio.run_process(["git", "init", "-q", str(project)])
    async with scripted_harness([{"text": "ok"}]) as (h, provider):
        session = await h.create_session(project)
        await h.run(session.id, "hello")
    [request] = provider.requests
    text = system_text(request)
    assert "make check" in text and "short answers" in text
    assert f"Working directory: {project.resolve()}" in text
    assert "Git repository: yes" in text and "?? AGENTS.md" in text
    # The documented order: agent, environment, project AGENTS.md, global AGENTS.md.
    marks = ("coding agent", "<environment>", "make check", "prefers short")
    order = [text.index(mark) for mark in marks]
    assert order == sorted(order)


async def test_show_request_publishes_each_block_with_its_source(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    (project / "AGENTS.md").write_text("Project rule.\n")
    async with scripted_harness([{"text": "ok"}], show_request=True) as (h, _):
        session = await h.create_session(project)
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "hello")
            async for event in events:
                if event.type == "step.request":
                    shown = event.data
                    break
    sources = [block["source"] for block in shown["system"]]
    assert sources[:2] == ["agent", "environment"]
    assert sources[2] == f"AGENTS.md: {project.resolve() / 'AGENTS.md'}"
    assert shown["messages"][-1]["text"] == "hello"


async def test_crossing_the_window_compacts_once_and_continues(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    for name in ("a.txt", "b.txt"):
        (project / name).write_text(f"contents of {name}\n" * 60)
    turns = [
        read("a.txt", usage={"input": 1_000, "output": 10}),
        read("b.txt", usage={"input": 19_500, "output": 10}),  # nearly fills 20k
        {"text": SUMMARY, "usage": {"input": 19_600, "output": 200}},
        {"text": "finished after the summary", "usage": {"input": 900, "output": 10}},
    ]
    config = {"model_limits": {"scripted": (20_000, 1_000)}, "compaction_keep_tokens": 300}
    async with scripted_harness(turns, **config) as (h, provider):
        session = await h.create_session(project)
        result = await h.run(session.id, "read both files")
        transcript = h.ledger.messages(session.id)
    assert (result.reason, result.answer) == ("answered", "finished after the summary")
    compacting = [r for r in provider.requests if r.system == (COMPACTION_SYSTEM,)]
    assert len(compacting) == 1
    assert compacting[0].tools == () and compacting[0].tool_choice == "none"
    assert compacting[0].messages[-1] == UserTurn(COMPACTION_PROMPT)
    [part] = [p for m in transcript for p in m.parts if isinstance(p, CompactionPart)]
    assert all(f"## {section}" in part.summary for section in SECTIONS)
    # The next request starts with the summary, then the recent messages verbatim.
    after = provider.requests[-1]
    assert after.messages[0] == UserTurn(SUMMARY_HEADER + SUMMARY)
    [kept] = [m for m in after.messages if isinstance(m, ToolResult)]
    assert "contents of b.txt" in kept.content
    assert not any("contents of a.txt" in str(m) for m in after.messages)
    # The ledger keeps everything: both reads, in full.
    outputs = [p.state.output for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert any("contents of a.txt" in o for o in outputs)  # type: ignore[operator]
    steps = [m.info for m in transcript if isinstance(m.info, AssistantMessage)]
    assert [s.mode for s in steps] == ["step", "step", "compaction", "step"]


async def test_a_provider_overflow_error_compacts_and_retries(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    (project / "a.txt").write_text("alpha\n" * 50)
    turns = [
        read("a.txt", usage={"input": 500, "output": 10}),
        {
            "fail_first": {"kind": "overflow", "message": "prompt is too long", "times": 1},
            "text": SUMMARY,
        },
        {"text": "answered after the retry"},
    ]
    async with scripted_harness(turns, compaction_keep_tokens=50) as (h, provider):
        session = await h.create_session(project)
        result = await h.run(session.id, "go")
    assert (result.reason, result.answer) == ("answered", "answered after the retry")
    kinds = [
        "compaction" if r.system == (COMPACTION_SYSTEM,) else "step" for r in provider.requests
    ]
    assert kinds == ["step", "step", "compaction", "step"]
    assert provider.requests[-1].messages[0] == UserTurn(SUMMARY_HEADER + SUMMARY)


async def test_a_compaction_that_does_not_shrink_stops_with_a_reason(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    (project / "big.txt").write_text("0123456789abcdef\n" * 2_800)  # ~48 KB: one huge result
    turns = [read("big.txt"), {"text": SUMMARY}, {"text": "never"}]
    config = {"model_limits": {"scripted": (12_000, 1_000)}}
    async with scripted_harness(turns, **config) as (h, provider):
        session = await h.create_session(project)
        with trio.fail_after(5):
            result = await h.run(session.id, "read it")
    assert result.reason == "overflow"
    assert result.error is not None and "did not shrink" in result.error
    assert len(provider.requests) == 2  # the step, then one compaction: no loop


async def test_old_tool_outputs_are_pruned_from_the_view_but_kept_in_the_ledger(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    for index in range(3):
        (project / f"f{index}.txt").write_text(f"file {index} line\n" * 120)  # ~600 tokens
    turns = [read("f0.txt"), read("f1.txt"), read("f2.txt"), {"text": "done"}]
    async with scripted_harness(turns, prune_protect_tokens=700) as (h, provider):
        session = await h.create_session(project)
        await h.run(session.id, "read three files")
        transcript = h.ledger.messages(session.id)
    last = [m for m in provider.requests[-1].messages if isinstance(m, ToolResult)]
    assert [("file 2 line" in r.content) for r in last] == [False, False, True]
    assert last[0].content.startswith(PRUNED.split("(")[0])
    outputs = [p.state.output for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert all(f"file {i} line" in outputs[i] for i in range(3))  # type: ignore[operator]


async def test_a_budget_stops_the_whole_tree_with_reason_budget(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    (project / "n.txt").write_text("note\n")
    task = {"name": "task", "arguments": {"description": "sub", "prompt": "spend"}}
    turns = [
        {"tool_calls": [task], "usage": {"input": 5, "output": 5}},
        {"text": "parent wraps up", "usage": {"input": 5, "output": 5}},
    ]
    subtasks = {
        "spend": [
            {**read("n.txt"), "usage": {"input": 20, "output": 10}},
            {
                "tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}],
                "usage": {"input": 20, "output": 10},
            },
            {"text": "child wraps up", "usage": {"input": 1, "output": 1}},
        ]
    }
    async with scripted_harness(turns, subtasks, budget_tokens=50) as (
        h,
        provider,
    ):
        session = await h.create_session(project)
        result = await h.run(session.id, "go")
        [child] = h.ledger.children(session.id)
        child_finished = [
            e.data
            for e in h.ledger.events_after(0, session_ids=[child.id])
            if e.type == "turn.finished"
        ]
    assert result.reason == "budget" and result.answer == "parent wraps up"
    assert child_finished[0]["reason"] == "budget"
    finals = [r for r in provider.requests if any("BUDGET REACHED" in s for s in r.system)]
    assert len(finals) == 2 and all(r.tools == () for r in finals)


async def test_the_title_model_never_delays_the_first_answer(
    tmp_path: Path, project: Path, scripted_harness: ScriptedHarness
) -> None:
    slow_title = ScriptedProvider.from_turns([{"delay": 2, "text": "Un titre tardif"}])
    answer = ScriptedProvider.from_turns([{"text": "quick answer"}])

    def factory(model: str) -> ScriptedProvider:
        return slow_title if model == "scripted:title" else answer

    async with scripted_harness(
        [], provider_factory=factory, title_model="scripted:title"
    ) as (h, _):
        session = await h.create_session(project)
        started = time.monotonic()
        result = await h.run(session.id, "Corrige le test qui échoue dans le parseur")
        elapsed = time.monotonic() - started
        assert result.answer == "quick answer" and elapsed < 1.5
        assert h.session(session.id).title == "Corrige le test qui échoue dans le parseur"
        with trio.fail_after(5):
            while h.session(session.id).title != "Un titre tardif":
                await trio.sleep(0.05)

"""The model's view built step by step is the view built from scratch (issue 14).

``History.chat`` keeps the view it built and only looks again at the messages after the
first one that changed. Every view a turn builds here is checked against a ``History``
made fresh from the ledger at the same moment: through growth, pruning that moves each
step, a summary taking over the head, and a second turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.context.compaction import SECTIONS
from harness.history import PRUNED, History
from harness.messages.provider import ChatMessage, ToolResult

if TYPE_CHECKING:
    from conftest import ScriptedHarness

SUMMARY = "\n".join(f"## {section}\nnotes about {section.lower()}" for section in SECTIONS)


def read(path: str, **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read", "arguments": {"path": path}}], **extra}


@pytest.fixture
def looked_at(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per view the turn's History built: how many messages it derived anew for it."""
    counts: list[int] = []
    view_of, chat = History._view_of, History.chat
    calls = [0]

    def counted_view_of(self: History, message_id: str) -> Any:
        calls[0] += 1
        return view_of(self, message_id)

    def counted_chat(self: History, *, prune_protect: int | None = None) -> list[ChatMessage]:
        calls[0] = 0
        view = chat(self, prune_protect=prune_protect)
        counts.append(calls[0])
        return view

    monkeypatch.setattr(History, "_view_of", counted_view_of)
    monkeypatch.setattr(History, "chat", counted_chat)
    return counts


@pytest.fixture
def checked_views(
    monkeypatch: pytest.MonkeyPatch, looked_at: list[int]
) -> Iterator[list[list[ChatMessage]]]:
    """Every view ``History.chat`` builds, each checked against a fresh History's."""
    views: list[list[ChatMessage]] = []
    fresh: dict[int, History] = {}
    sync, catch_up, chat = History.sync, History.catch_up, History.chat

    def synced(self: History) -> None:
        sync(self)
        # Read at the very moment the turn's History read: the same ledger state.
        other = History(self._ledger, self.session_id)
        sync(other)
        fresh[id(self)] = other

    async def caught_up(self: History) -> None:  # the runner's sync, with the async read
        await catch_up(self)
        other = History(self._ledger, self.session_id)
        sync(other)
        fresh[id(self)] = other

    def checked(self: History, *, prune_protect: int | None = None) -> list[ChatMessage]:
        view = chat(self, prune_protect=prune_protect)
        looked = looked_at.pop()
        assert view == chat(fresh[id(self)], prune_protect=prune_protect)
        looked_at.pop()
        # What the caller gets is its own: changing it changes no later view.
        view.append(view[0])
        assert chat(self, prune_protect=prune_protect) == view[:-1]
        looked_at[-1] = looked
        views.append(view[:-1])
        return view[:-1]

    monkeypatch.setattr(History, "sync", synced)
    monkeypatch.setattr(History, "catch_up", caught_up)
    monkeypatch.setattr(History, "chat", checked)
    yield views


async def test_a_view_that_prunes_more_each_step_is_the_one_built_from_scratch(
    project: Path, scripted_harness: ScriptedHarness, checked_views: list[list[ChatMessage]]
) -> None:
    for index in range(4):
        (project / f"f{index}.txt").write_text(f"file {index} line\n" * 120)  # ~600 tokens
    turns = [read(f"f{i % 4}.txt") for i in range(9)] + [{"text": "done"}]
    async with scripted_harness(turns, prune_protect_tokens=700) as (h, provider):
        session = await h.create_session(project)
        result = await h.run(session.id, "read the files")
    assert result.reason == "answered"
    assert len(checked_views) == len(provider.requests) == 10
    pruned = [
        sum(1 for m in view if isinstance(m, ToolResult) and m.content.startswith(PRUNED[:20]))
        for view in checked_views
    ]
    assert pruned[-1] >= 6 and pruned == sorted(pruned)  # the cut moved on, step by step


async def test_a_step_derives_only_the_messages_that_changed(
    project: Path, scripted_harness: ScriptedHarness, looked_at: list[int]
) -> None:
    # Before issue 14's incremental view every step derived the whole history again.
    for index in range(3):  # in rotation, so the doom-loop guard never fires
        (project / f"f{index}.txt").write_text("a line\n" * 5)
    turns = [read(f"f{i % 3}.txt") for i in range(30)] + [{"text": "done"}]
    async with scripted_harness(turns) as (h, provider):
        session = await h.create_session(project)
        assert (await h.run(session.id, "read it thirty times")).reason == "answered"
    assert len(looked_at) == len(provider.requests) == 31
    assert max(looked_at) <= 3, looked_at


async def test_a_view_under_a_new_summary_is_the_one_built_from_scratch(
    project: Path, scripted_harness: ScriptedHarness, checked_views: list[list[ChatMessage]]
) -> None:
    for name in ("a.txt", "b.txt"):
        (project / name).write_text(f"contents of {name}\n" * 60)
    turns = [
        read("a.txt", usage={"input": 1_000, "output": 10}),
        read("b.txt", usage={"input": 19_500, "output": 10}),  # nearly fills 20k
        {"text": SUMMARY, "usage": {"input": 19_600, "output": 200}},
        read("a.txt", usage={"input": 900, "output": 10}),
        {"text": "finished after the summary", "usage": {"input": 900, "output": 10}},
        read("b.txt", usage={"input": 1_000, "output": 10}),
        {"text": "and again", "usage": {"input": 1_100, "output": 10}},
    ]
    config = {"model_limits": {"scripted": (20_000, 1_000)}, "compaction_keep_tokens": 300}
    async with scripted_harness(turns, **config) as (h, provider):
        session = await h.create_session(project)
        first = await h.run(session.id, "read both")
        second = await h.run(session.id, "and answer")
    assert (first.answer, second.answer) == ("finished after the summary", "and again")
    assert len(checked_views) == len(provider.requests)

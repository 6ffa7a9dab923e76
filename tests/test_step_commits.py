"""A step's writes in as few transactions as its meaning allows (issue 14).

The assistant message a step opens is posted as the model is asked. With the writer's
usual 2 ms group-commit wait it was committed alone whenever the model took longer than
that (a local server does, and one answering a long history always does): a transaction
more per step, and more of them as the history grew. It may wait longer
(``post(within=…)``), for the reply's parts or the step's end, while every other post
keeps its own bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from wire_server import Reply, chunk, wire_server

from harness import Config, open_harness
from harness.messages.events import NewEvent
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents
from harness.messages.model import Session
from harness.storage.ledger import Ledger

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
STEPS = 3
FILES = ("notes.txt", "package.json")
SLOW = 0.1  # a model that answers in 100 ms (a fast real one): 50 times the usual wait


def _step(index: int) -> Reply:
    call = {
        "id": f"call{index:05d}",
        "type": "function",
        # Not the same call three times in a row: that would be a doom loop to ask about.
        "function": {"name": "read", "arguments": json.dumps({"path": FILES[index % 2]})},
        "index": 0,
    }
    events = [chunk(tool_calls=[call]), chunk(finish="tool_calls", usage=USAGE)]
    return Reply(events=events, delay=SLOW)


@pytest.mark.parametrize("model", ["mistral/devstral-medium-latest", "openai/qwen2.5-coder"])
async def test_the_message_a_step_opens_shares_the_transaction_of_its_reply(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    batches: list[list[tuple[str, Any]]] = []
    commit = Ledger._commit

    def recording(self: Ledger, batch: list[WriteEvents]) -> Any:
        batches.append([(e.type, e.data) for request in batch for e in request.events])
        return commit(self, batch)

    monkeypatch.setattr(Ledger, "_commit", recording)
    replies = [_step(i) for i in range(STEPS)]
    replies.append(Reply(events=[chunk("All read."), chunk(finish="stop", usage=USAGE)]))
    async with wire_server(*replies, keep_alive=True) as server:
        config = Config(home=tmp_path / "home", model=model, base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read the files, then answer")
    assert result.answer == "All read."
    opened = [
        batch
        for batch in batches
        if any(kind == "message.created" and data["role"] == "assistant" for kind, data in batch)
    ]
    assert len(opened) == STEPS + 1
    for batch in opened[:STEPS]:
        # Before: the message and its step-start part alone, 100 ms before the reply.
        kinds = [kind for kind, _ in batch]
        tools = [d for kind, d in batch if kind == "part.created" and d["type"] == "tool"]
        assert tools, kinds
        assert "message.updated" in kinds  # the reply's finish, in the same transaction
    # The answer's text part joined its message too.
    assert any(kind == "part.created" and d["type"] == "text" for kind, d in opened[STEPS])


def _session() -> Session:
    now = time.time()
    return Session(id="ses_a", directory="/tmp", model="scripted:x", created=now, updated=now)


def _titled(session: Session, title: str) -> list[NewEvent]:
    titled = session.model_copy(update={"title": title})
    return [NewEvent.of("session.updated", session.id, titled)]


async def _commits(feed: trio.MemoryReceiveChannel[FeedMessage], into: list[Sequence[str]]) -> None:
    async for message in feed:
        if isinstance(message, Publish):
            into.append([event.type for event in message.events])


@asynccontextmanager
async def _writing(ledger: Ledger) -> AsyncIterator[list[Sequence[str]]]:
    """The ledger's writer running, and the event types of each transaction it commits,
    complete once the block has ended (the writer closed, its commits heard)."""
    send, receive = trio.open_memory_channel[FeedMessage](100)
    commits: list[Sequence[str]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, send)
        nursery.start_soon(_commits, receive, commits)
        await trio.testing.wait_all_tasks_blocked()
        yield commits
        ledger.close_writer()
        await trio.testing.wait_all_tasks_blocked()  # the writer ends, its commits heard
        nursery.cancel_scope.cancel()


async def _until_titled(ledger: Ledger, session_id: str, title: str) -> None:
    while (stored := ledger.session(session_id)) is None or stored.title != title:
        await trio.sleep(0.001)


async def test_a_post_that_may_wait_is_committed_by_its_bound_alone(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db", post_delay=0.002)
    session = _session()
    async with _writing(ledger) as commits:
        started = trio.current_time()
        ledger.post([NewEvent.of("session.created", session.id, session)], within=0.5)
        await trio.sleep(0.1)
        assert ledger.session(session.id) is None  # still waiting for company
        with trio.fail_after(5):
            while ledger.session(session.id) is None:
                await trio.sleep(0.005)
        assert trio.current_time() - started >= 0.5
    assert commits == [["session.created"]]
    ledger.close()


@pytest.mark.parametrize("queued", [False, True], ids=["joins-the-wait", "queued-behind"])
async def test_a_post_joining_a_longer_wait_is_committed_within_its_own_bound(
    tmp_path: Path, queued: bool
) -> None:
    """A post made while a longer wait runs ends it by its own bound (2 ms here), not the
    30 s the first asked for; one queued behind it before the writer ran keeps it short."""
    ledger = Ledger(tmp_path / "ledger.db", post_delay=0.002)
    session = _session()
    async with _writing(ledger) as commits:
        ledger.post([NewEvent.of("session.created", session.id, session)], within=30.0)
        if not queued:
            await trio.testing.wait_all_tasks_blocked()  # the writer waits, for 30 s
        ledger.post(_titled(session, "t1"))
        with trio.fail_after(5):
            await _until_titled(ledger, session.id, "t1")
        # A later post that may wait as long, behind a short one: the short bound holds.
        ledger.post(_titled(session, "t2"))
        ledger.post(_titled(session, "t3"), within=30.0)
        with trio.fail_after(5):
            await _until_titled(ledger, session.id, "t3")
    assert commits == [["session.created", "session.updated"], ["session.updated"] * 2]
    ledger.close()


async def test_a_flush_ends_a_longer_wait_at_once(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db", post_delay=0.002)
    session = _session()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await trio.testing.wait_all_tasks_blocked()
        ledger.post([NewEvent.of("session.created", session.id, session)], within=30.0)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(5):
            await ledger.flush()
        assert ledger.session(session.id) is not None
        ledger.close_writer()
    ledger.close()


async def test_without_group_commit_nothing_waits(tmp_path: Path) -> None:
    """``post_delay`` 0 (PostgreSQL's tests, a caller that wants each post alone): a post
    asking to wait longer is committed at once all the same."""
    ledger = Ledger(tmp_path / "ledger.db", post_delay=0)
    session = _session()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await trio.testing.wait_all_tasks_blocked()
        ledger.post([NewEvent.of("session.created", session.id, session)], within=30.0)
        with trio.fail_after(5):
            while ledger.session(session.id) is None:
                await trio.sleep(0.005)
        ledger.close_writer()
    ledger.close()

"""Actor messages that are ready cost no trip through the scheduler (issue 14).

A ``receive`` of a queued item and a ``send`` into a channel with room are each a full
scheduler round in Trio (a checkpoint); a step passes a few dozen messages around. These
count the scheduling rounds of the task under test with a Trio instrument, and check
that cancellation still works the way it did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from task_steps import TaskSteps

from harness.messages.events import Event, NewEvent, wait_turn_finished
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents, ask
from harness.messages.model import Session
from harness.storage.ledger import Ledger, LedgerError


class _Steps(trio.abc.Instrument):
    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


@contextmanager
def scheduled_rounds() -> Iterator[_Steps]:
    """How many times the current task is scheduled again inside the block."""
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        yield steps
    finally:
        trio.lowlevel.remove_instrument(steps)


def _event(kind: str, **data: object) -> Event:
    return Event(1, time.time(), kind, "ses_a", dict(data))  # type: ignore[arg-type]


async def test_queued_events_are_read_in_one_round() -> None:
    send, receive = trio.open_memory_channel[Event](2000)
    for index in range(1000):
        send.send_nowait(_event("part.updated", index=index))
    send.send_nowait(_event("turn.finished", message_id="msg_a", reason="answered", answer="ok"))
    with scheduled_rounds() as rounds:
        result = await wait_turn_finished(receive, message_id="msg_a")
    assert result is not None and result.answer == "ok"
    assert rounds.count <= 2  # before: one round an event, 1,001
    # The channel's end still ends the wait, queued or not.
    send.send_nowait(_event("part.updated"))
    send.close()
    assert await wait_turn_finished(receive, message_id="msg_a") is None


async def test_an_ask_into_a_mailbox_with_room_waits_only_for_the_answer() -> None:
    mailbox, inbox = trio.open_memory_channel[tuple[int, trio.MemorySendChannel[int]]](10)

    async def doubler() -> None:
        async for number, reply in inbox:
            reply.send_nowait(number * 2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(doubler)
        await trio.testing.wait_all_tasks_blocked()
        with scheduled_rounds() as rounds:
            for number in range(50):
                assert await ask(mailbox, lambda reply, n=number: (n, reply)) == number * 2
        assert rounds.count <= 50  # the answer's wait alone; before: 100
        # A cancelled asker still sends nothing.
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await ask(mailbox, lambda reply: (1, reply))
        assert inbox.statistics().current_buffer_used == 0
        nursery.cancel_scope.cancel()


async def test_posts_queue_without_waking_the_writer_and_a_flush_ends_the_wait(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.db", post_delay=5.0)  # a wait only a flush can end
    writer = TaskSteps("run_writer")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(writer)
        session = _session()
        ledger.post([NewEvent.of("session.created", session.id, session)])
        for index in range(100):
            titled = session.model_copy(update={"title": f"t{index}"})
            ledger.post([NewEvent.of("session.updated", session.id, titled)])
            await trio.lowlevel.checkpoint()  # the poster goes on, one post at a time
        with trio.fail_after(2):  # not the 5 s post delay
            await ledger.flush()
        trio.lowlevel.remove_instrument(writer)
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t99"
        assert writer.count <= 6  # before: a round for most posts (67 of 100 here)
        ledger.close_writer()
    ledger.close()


async def test_a_flush_commits_the_queued_posts_itself_and_the_writer_sleeps_on(
    tmp_path: Path,
) -> None:
    """A step's flush finds its posts queued and the writer waiting for company: it
    commits them in its own task, publishes them, and neither it nor the writer is
    scheduled for it. The writer's wait goes on, and later posts still end it."""
    ledger = Ledger(tmp_path / "ledger.db", post_delay=0.002)
    send, receive = trio.open_memory_channel[FeedMessage](10)
    writer = TaskSteps("run_writer")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, send)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(writer)
        session = _session()
        ledger.post([NewEvent.of("session.created", session.id, session)], within=30.0)
        ledger.post(_titled(session, "t1"))
        with scheduled_rounds() as rounds:
            await ledger.flush()
            await ledger.flush()  # nothing queued: nothing to do
            written = await ledger.write(_titled(session, "t2"))
        assert rounds.count == 0 and writer.count == 0
        published = [receive.receive_nowait(), receive.receive_nowait()]
        assert [[e.type for e in m.events] for m in published if isinstance(m, Publish)] == [
            ["session.created", "session.updated"],
            ["session.updated"],
        ]
        assert [e.seq for e in written] == [3]
        trio.lowlevel.remove_instrument(writer)
        # Alone, a post is committed by its bound, by the writer.
        ledger.post(_titled(session, "t3"))
        with trio.fail_after(5):
            message = await receive.receive()
        assert isinstance(message, Publish) and message.events[0].data["title"] == "t3"
        ledger.close_writer()
    ledger.close()


async def test_commits_made_by_their_callers_reach_a_full_feed_in_order(tmp_path: Path) -> None:
    """A feed with no room does not hold up the caller that committed: the writer
    publishes its events once the feed takes them, and later commits' behind them."""
    ledger = Ledger(tmp_path / "ledger.db")
    send, receive = trio.open_memory_channel[FeedMessage](1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, send)
        await trio.testing.wait_all_tasks_blocked()
        session = _session()
        await ledger.write([NewEvent.of("session.created", session.id, session)])  # fills it
        for title in ("t1", "t2"):
            with scheduled_rounds() as rounds:
                await ledger.write(_titled(session, title))
            assert rounds.count == 0
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t2"  # committed, not yet heard
        heard = []
        with trio.fail_after(5):
            for _ in range(3):
                message = await receive.receive()
                assert isinstance(message, Publish)
                heard += [event.seq for event in message.events]
        assert heard == [1, 2, 3]
        ledger.close_writer()
    ledger.close()


async def test_a_write_made_while_the_writer_commits_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch on a worker thread (file contents to compress) is in the writer's hands:
    a write made meanwhile goes to the writer, after it."""
    commit = Ledger._commit

    def slow(self: Ledger, batch: list[WriteEvents]) -> Any:
        if any(request.blobs for request in batch):
            time.sleep(0.2)  # on the worker thread
        return commit(self, batch)

    monkeypatch.setattr(Ledger, "_commit", slow)
    ledger = Ledger(tmp_path / "ledger.db")
    session = _session()
    seqs: dict[str, int | None] = {}

    async def write(events: list[NewEvent], blobs: list[tuple[str, bytes]]) -> None:
        written = await ledger.write(events, blobs=blobs)
        seqs[written[0].data["title"]] = written[0].seq

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await trio.testing.wait_all_tasks_blocked()
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        async with trio.open_nursery() as writers:
            writers.start_soon(write, _titled(session, "t1"), [("ab" * 32, b"x" * 100_000)])
            await trio.sleep(0.05)
            assert ledger._busy
            writers.start_soon(write, _titled(session, "t2"), [])
        assert seqs == {"t1": 2, "t2": 3}
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t2"
        ledger.close_writer()
    ledger.close()


def _titled(session: Session, title: str) -> list[NewEvent]:
    return [NewEvent.of("session.updated", session.id, session.model_copy(update={"title": title}))]


def _session() -> Session:
    now = time.time()
    return Session(id="ses_a", directory="/tmp", model="scripted:x", created=now, updated=now)


async def test_a_failed_commit_made_by_its_caller_fails_its_writers_and_what_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk under a flush that commits the posts itself: the flush raises the
    failure, every later write too (posts dropped), until ``recover``; the ledger holds
    what it held."""
    ledger = Ledger(tmp_path / "ledger.db")
    session = _session()
    commit = Ledger._commit

    def full(self: Ledger, batch: list[WriteEvents]) -> Any:
        raise apsw.FullError("database or disk is full")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await trio.testing.wait_all_tasks_blocked()
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        monkeypatch.setattr(Ledger, "_commit", full)
        ledger.post(_titled(session, "t1"))
        with pytest.raises(LedgerError, match="disk full"):
            await ledger.flush()
        ledger.post(_titled(session, "t2"))
        with pytest.raises(LedgerError, match="disk full"):
            await ledger.write(_titled(session, "t3"))
        monkeypatch.setattr(Ledger, "_commit", commit)
        with pytest.raises(LedgerError, match="disk full"):
            await ledger.flush()  # the failure sticks, the post is dropped
        ledger.recover()
        await ledger.write(_titled(session, "t4"))
        assert [e.seq for e in ledger.events_after(0)] == [1, 2]
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t4"
        ledger.close_writer()
    ledger.close()

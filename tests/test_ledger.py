"""The ledger: one transaction per batch, projections, migrations, clear failures.

The tests that take ``make_ledger`` run against both backends of the ledger port: SQLite
(apsw) and PostgreSQL (skipped, saying why, when no test database is configured).
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents
from harness.messages.model import Session, TextPart, UserMessage
from harness.storage.ledger import Ledger, LedgerError
from harness.storage.port import LedgerMissing, LedgerPort, LedgerRefused, on_worker_thread
from harness.storage.schema import SCHEMA_VERSION


def _session(session_id: str = "ses_a", directory: str = "/tmp") -> Session:
    now = time.time()
    return Session(id=session_id, directory=directory, model="scripted:x", created=now, updated=now)


def _created(session: Session) -> NewEvent:
    return NewEvent("session.created", session.id, session.model_dump(mode="json"))


MakeLedger = Callable[..., LedgerPort]


@pytest.fixture(params=["sqlite", "postgres"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    """``make_ledger(**options)``: a new ledger of the backend under test, the same
    storage each call (a file, or a schema of the test database)."""
    if request.param == "postgres":
        from harness.storage.postgres import PostgresLedger

        url = request.getfixturevalue("postgres_schema")
        return lambda **options: PostgresLedger(url, **options)
    return lambda **options: Ledger(tmp_path / "ledger.db", **options)


@asynccontextmanager
async def running(
    path_or_ledger: Path | LedgerPort, feed: trio.MemorySendChannel[FeedMessage] | None = None
) -> AsyncIterator[LedgerPort]:
    ledger = (
        path_or_ledger if isinstance(path_or_ledger, LedgerPort) else Ledger(path_or_ledger)
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, feed)
        try:
            yield ledger
        finally:
            ledger.close_writer()
    ledger.close()


async def test_events_and_projections_commit_together(make_ledger: MakeLedger) -> None:
    async with running(make_ledger()) as ledger:
        session = _session()
        committed = await ledger.write([_created(session)])
        assert [e.type for e in committed] == ["session.created"]
        assert committed[0].seq is not None
        assert ledger.session("ses_a") == session
        # A projection that fails rolls back the whole request, event rows included.
        before = ledger.last_seq()
        with pytest.raises(LedgerError):
            await ledger.write(
                [
                    _created(_session("ses_b")),
                    NewEvent("part.updated", "ses_b", {"broken": True}),
                ]
            )
        assert ledger.last_seq() == before
        assert ledger.session("ses_b") is None
        # The writer survives a failed batch.
        await ledger.write([_created(_session("ses_c"))])
        assert ledger.session("ses_c") is not None


async def test_a_deleted_session_leaves_no_claimed_turn_behind(make_ledger: MakeLedger) -> None:
    # A claimed turn outliving its session is found by every recovery scan (and, on a
    # shared ledger, claimed every half second for a session that no longer exists).
    async with running(make_ledger()) as ledger:
        await ledger.write([_created(_session())])
        turn = {"message_id": "msg_1", "session_id": "ses_a", "started": 1.0}
        await ledger.write([NewEvent("turn.started", "ses_a", turn)])
        assert ledger.claimed_turns("ses_a") == [("ses_a", "msg_1", 0)]
        await ledger.write([NewEvent("session.deleted", "ses_a", {"id": "ses_a"})])
        assert ledger.claimed_turns() == []


async def test_posts_are_ordered_and_flush_waits_for_them(make_ledger: MakeLedger) -> None:
    async with running(make_ledger()) as ledger:
        session = _session()
        ledger.post([_created(session)])
        for index in range(50):
            ledger.post(
                [
                    NewEvent(
                        "session.updated",
                        session.id,
                        session.model_copy(update={"title": f"t{index}"}).model_dump(mode="json"),
                    )
                ]
            )
        await ledger.flush()
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t49"
        seqs = [e.seq for e in ledger.events_after(0)]
        assert seqs == sorted(seqs) and len(seqs) == 51


class _CountingLedger(Ledger):
    """The SQLite ledger, counting the transactions it runs (its writer's, and those a
    caller commits itself: ``LedgerPort._commit_here``)."""

    commits = 0

    def _commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        self.commits += 1
        return super()._commit(batch)


async def test_a_flush_with_nothing_pending_runs_no_transaction(tmp_path: Path) -> None:
    # A step's flush after its posts were group-committed would otherwise cost a worker
    # thread round trip for an empty transaction (issue 14).
    async with running(_CountingLedger(tmp_path / "ledger.db")) as ledger:
        assert isinstance(ledger, _CountingLedger)
        session = _session()
        await ledger.write([_created(session)])
        assert ledger.commits == 1
        await ledger.flush()
        await ledger.flush()
        assert ledger.commits == 1
        # A flush still waits for what was posted before it, committed first.
        titled = session.model_copy(update={"title": "t"}).model_dump(mode="json")
        ledger.post([NewEvent("session.updated", session.id, titled)])
        await ledger.flush()
        stored = ledger.session(session.id)
        assert stored is not None and stored.title == "t"
        assert ledger.commits == 2


async def test_a_commit_runs_on_a_worker_thread_and_reports_back() -> None:
    def work() -> tuple[int, str]:
        return threading.get_ident(), "done"

    def fail() -> None:
        raise apsw.FullError("database or disk is full")

    ident, answer = await on_worker_thread(work)
    assert answer == "done" and ident != threading.get_ident()
    with pytest.raises(apsw.FullError):
        await on_worker_thread(fail)
    # A cancel while the commit runs waits for it: the work is never left half done.
    finished: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        finished.append("yes")

    with trio.move_on_after(0.05):
        await on_worker_thread(slow)
    assert finished == ["yes"]


async def test_committed_events_reach_the_feed_after_commit(make_ledger: MakeLedger) -> None:
    send, receive = trio.open_memory_channel[FeedMessage](10)
    async with running(make_ledger(), send) as ledger:
        await ledger.write([_created(_session())])
        if ledger.cluster:  # published by the tail, in seq order with other daemons'
            with trio.fail_after(5):
                message = await receive.receive()
        else:
            message = receive.receive_nowait()
        assert isinstance(message, Publish)
        assert [e.type for e in message.events] == ["session.created"]
        # Published only once committed: a fresh connection already sees it.
        other = make_ledger(read_only=True)
        try:
            assert [s.id for s in other.sessions()] == ["ses_a"]
        finally:
            other.close()


async def test_inbox_taken_and_message_written_in_one_transaction(make_ledger: MakeLedger) -> None:
    async with running(make_ledger()) as ledger:
        session = _session()
        await ledger.write(
            [
                _created(session),
                NewEvent(
                    "inbox.added",
                    session.id,
                    {
                        "id": "msg_1",
                        "session_id": session.id,
                        "text": "hello",
                        "delivery": "queue",
                        "created": 1.0,
                    },
                ),
            ]
        )
        assert [i.text for i in ledger.inbox(session.id)] == ["hello"]
        assert ledger.known_message("msg_1")
        user = UserMessage(id="msg_1", session_id=session.id, agent="build", model="m", created=2)
        part = TextPart(id="prt_1", session_id=session.id, message_id="msg_1", text="hello")
        await ledger.write(
            [
                NewEvent("inbox.taken", session.id, {"id": "msg_1"}),
                NewEvent("message.created", session.id, user.model_dump(mode="json")),
                NewEvent("part.created", session.id, part.model_dump(mode="json")),
            ]
        )
        assert ledger.inbox(session.id) == []
        transcript = ledger.messages(session.id)
        assert [m.info.id for m in transcript] == ["msg_1"]
        assert transcript[0].parts == [part]
        assert ledger.known_message("msg_1")


async def test_changes_returns_only_rows_written_since_the_mark(make_ledger: MakeLedger) -> None:
    async with running(make_ledger()) as ledger:
        session = _session()
        user = UserMessage(id="msg_1", session_id=session.id, agent="build", model="m", created=1)
        await ledger.write(
            [_created(session), NewEvent("message.created", session.id, user.model_dump())]
        )
        messages, parts, mark = ledger.changes(session.id, 0)
        assert [m.id for m in messages] == ["msg_1"] and parts == []
        assert ledger.changes(session.id, mark) == ([], [], mark)
        part = TextPart(id="prt_1", session_id=session.id, message_id="msg_1", text="x")
        await ledger.write([NewEvent("part.created", session.id, part.model_dump())])
        messages, parts, new_mark = ledger.changes(session.id, mark)
        assert messages == [] and parts == [part] and new_mark > mark


def test_schema_is_migrated_once_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    conn = apsw.Connection(str(path))
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    conn.close()
    Ledger(path).close()  # reopening does not try to create the tables again


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    conn = apsw.Connection(str(path))
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerError, match="newer than this harness knows"):
        Ledger(path)


def test_a_corrupt_ledger_is_a_clear_error_and_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    garbage = b"this is not a database, but it is somebody's file\n" * 100
    path.write_bytes(garbage)
    with pytest.raises(LedgerError, match="left untouched") as caught:
        Ledger(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == garbage


def test_full_durability_sets_synchronous_full(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db", durability="full")
    try:
        assert ledger._write.execute("PRAGMA synchronous").fetchall()[0][0] == 2
    finally:
        ledger.close()


async def test_one_running_harness_per_ledger(tmp_path: Path) -> None:
    """A second harness on the same ledger would resume the first one's turns: refused."""
    import os
    import sys

    from harness import Config, open_harness
    from harness.storage.lock import LedgerInUseError

    config = Config(home=tmp_path / "home", model="scripted:x")
    async with open_harness(config):
        with pytest.raises(LedgerInUseError, match=f"pid {os.getpid()}"):
            async with open_harness(Config(home=tmp_path / "home", model="scripted:x")):
                pass
        # The CLI says so plainly and exits 1, touching nothing.
        env = dict(os.environ)
        env["HARNESS_HOME"] = str(tmp_path / "home")
        result = await trio.run_process(
            [sys.executable, "-m", "harness", "run", "--embedded", "--model", "scripted:x", "hi"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
        assert result.returncode == 1
        assert b"in use by a running harness" in result.stderr
        assert b"Traceback" not in result.stderr
    # Released when the first one ends (and by the kernel if its process dies).
    async with open_harness(Config(home=tmp_path / "home", model="scripted:x")):
        pass


async def test_a_batch_writing_rows_again_projects_as_if_one_by_one(
    make_ledger: MakeLedger,
) -> None:
    """Several steps in one commit upsert the same rows again (a message created then
    updated, a part then its end), interleaved across sessions, a session deleted and
    made again between them: the rows end as if each event had been applied in turn
    (PostgreSQL merges an id's upserts of one commit into one row, issue 18)."""
    a, b = _session("ses_a"), _session("ses_b")
    user = UserMessage(id="msg_1", session_id=a.id, agent="build", model="m", created=1)
    later = UserMessage(id="msg_2", session_id=a.id, agent="build", model="m", created=2)
    text = TextPart(id="prt_1", session_id=a.id, message_id="msg_1", text="he")
    other = TextPart(id="prt_b", session_id=b.id, message_id="msg_b", text="gone")
    renamed = b.model_copy(update={"title": "again"})

    def event(kind: str, session_id: str, model: Any) -> NewEvent:
        return NewEvent(kind, session_id, model.model_dump(mode="json"))

    async with running(make_ledger(post_delay=0.05)) as ledger:
        for request in (
            [_created(a), _created(b)],
            [event("message.created", a.id, later), event("part.created", b.id, other)],
            [event("message.created", a.id, user), event("part.created", a.id, text)],
            [event("part.updated", a.id, text.model_copy(update={"text": "hello"}))],
            [NewEvent("session.deleted", b.id, {"id": b.id})],
            [event("message.updated", a.id, user.model_copy(update={"model": "m2"}))],
            [_created(b), event("session.updated", b.id, renamed)],
            [event("session.updated", a.id, a.model_copy(update={"title": "t"}))],
        ):
            ledger.post(request)
        await ledger.flush()
        transcript = ledger.messages(a.id)
        # Ordered by the seq each message was created at, not the seq of its last write.
        assert [m.info.id for m in transcript] == ["msg_2", "msg_1"]
        assert transcript[1].info == user.model_copy(update={"model": "m2"})
        assert transcript[1].parts == [text.model_copy(update={"text": "hello"})]
        assert ledger.session(a.id) == a.model_copy(update={"title": "t"})
        assert ledger.session(b.id) == renamed
        assert ledger.messages(b.id) == []  # its part went with the deletion
        assert [e.seq for e in ledger.events_after(0)] == list(range(1, 13))


def _inbox_added(session_id: str, message_id: str = "msg_1") -> NewEvent:
    item = {"id": message_id, "session_id": session_id, "text": "go", "delivery": "queue",
            "created": time.time()}  # fmt: skip
    return NewEvent("inbox.added", session_id, item)


async def test_a_write_that_requires_a_session_is_refused_as_a_whole_without_it(
    make_ledger: MakeLedger,
) -> None:
    """``exists``: checked in the write's own transaction, before its events; a session
    created or deleted by an earlier write of the same batch counts as such."""
    async with running(make_ledger(post_delay=0.05)) as ledger:
        with pytest.raises(LedgerMissing):
            await ledger.write([_inbox_added("ses_a")], exists="ses_a")
        assert ledger.inbox("ses_a") == [] and ledger.events_after(0) == []
        # Created by a post of the same batch (the write ends the post's grouping).
        ledger.post([_created(_session("ses_a"))])
        written = await ledger.write([_inbox_added("ses_a")], exists="ses_a")
        assert [event.type for event in written] == ["inbox.added"]
        assert [item.id for item in ledger.inbox("ses_a")] == ["msg_1"]
        # Deleted by a post of the same batch: refused, and the rest of the batch lands.
        ledger.post([NewEvent("session.deleted", "ses_a", {"id": "ses_a"})])
        with pytest.raises(LedgerMissing):
            await ledger.write([_inbox_added("ses_a", "msg_2")], exists="ses_a")
        assert ledger.session("ses_a") is None
        types = [event.type for event in ledger.events_after(0)]
        assert types == ["session.created", "inbox.added", "session.deleted"]

"""The PostgreSQL ledger's own promises (DESIGN §14): global seqs, leases and fences, the
feed across ledgers, migrations, and the URL rules. Two ``PostgresLedger`` objects on one
schema play two daemons. Skipped (saying why) without a test database; run under CI."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest
import trio

from harness.config import Config, ConfigError
from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents
from harness.messages.model import Session
from harness.storage.pg_schema import PG_SCHEMA_VERSION
from harness.storage.port import ClusterHooks, LedgerError, LedgerFenced
from harness.storage.postgres import LOOP_READERS, PostgresLedger


def _created(session_id: str) -> NewEvent:
    now = time.time()
    session = Session(id=session_id, directory="/tmp", model="scripted:x", created=now, updated=now)
    return NewEvent.of("session.created", session_id, session)


def _titled(session_id: str, title: str) -> NewEvent:
    now = time.time()
    session = Session(
        id=session_id, directory="/tmp", model="scripted:x", created=now, updated=now, title=title
    )
    return NewEvent.of("session.updated", session_id, session)


@asynccontextmanager
async def daemon(
    url: str, feed: trio.MemorySendChannel[FeedMessage] | None = None, **options: float
) -> AsyncIterator[PostgresLedger]:
    ledger = PostgresLedger(url, post_delay=0, **options)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(ledger.run_writer, feed)
        try:
            yield ledger
        finally:
            ledger.close_writer()
    ledger.close()


async def test_seq_is_global_and_gapless_across_ledgers(postgres_schema: str) -> None:
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a")])
        await b.write([_created("ses_b")])

        async def burst(ledger: PostgresLedger, session_id: str) -> None:
            for index in range(30):
                ledger.post([_titled(session_id, f"t{index}")])
            await ledger.flush()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(burst, a, "ses_a")
            nursery.start_soon(burst, b, "ses_b")
        seqs = [e.seq for e in a.events_after(0)]
        assert seqs == list(range(1, 63))
        assert {s.id for s in b.sessions()} == {"ses_a", "ses_b"}
        assert a.session("ses_b") is not None and a.session("ses_b").title == "t29"  # type: ignore[union-attr]


async def test_each_feed_sees_every_ledgers_events_in_order_without_duplicates(
    postgres_schema: str,
) -> None:
    send_a, receive_a = trio.open_memory_channel[FeedMessage](1000)
    send_b, receive_b = trio.open_memory_channel[FeedMessage](1000)
    async with daemon(postgres_schema, send_a) as a, daemon(postgres_schema, send_b) as b:
        await a.write([_created("ses_a")])
        await b.write([_created("ses_b")])
        for index in range(40):
            (a if index % 3 else b).post([_titled("ses_a" if index % 2 else "ses_b", f"{index}")])
        await a.flush()
        await b.flush()
        total = a.last_seq()

        async def seen(receive: trio.MemoryReceiveChannel[FeedMessage]) -> list[int | None]:
            events: list[Event] = []
            with trio.fail_after(10):
                while len(events) < total:
                    message = await receive.receive()
                    assert isinstance(message, Publish)
                    events.extend(message.events)
            return [e.seq for e in events]

        assert total == 42
        assert await seen(receive_a) == list(range(1, 43))
        assert await seen(receive_b) == list(range(1, 43))


async def test_a_lease_is_exclusive_until_it_lapses_then_taken_with_the_next_epoch(
    postgres_schema: str,
) -> None:
    # 1.5 s, not shorter: on a loaded 2-core machine a keeper's renewal can come a few
    # hundred ms late, and at 0.6 s that let b take a live lease (seen once in 4 runs).
    async with daemon(postgres_schema, lease_seconds=1.5) as a, daemon(
        postgres_schema, lease_seconds=1.5
    ) as b:
        await a.write([_created("ses_a")])
        epoch = await a.claim("ses_a")
        assert epoch == 1 and a.holds("ses_a")
        assert await b.claim("ses_a") is None  # held, and renewed by a's keeper
        await trio.sleep(2.0)
        assert await b.claim("ses_a") is None
        # a stops renewing (its process is as good as dead): b takes over after expiry.
        a._held.clear()
        await trio.sleep(1.8)
        taken = await b.claim("ses_a")
        assert taken == 2
        leased = [e for e in b.events_after(0) if e.type == "session.leased"]
        assert [(e.data["owner"], e.data["epoch"], e.data["from"]) for e in leased] == [
            (b.owner, 2, a.owner)
        ]
        # The fence: a's writes with its old epoch are refused and change nothing.
        with pytest.raises(LedgerFenced, match="taken by another daemon"):
            await a.write([_titled("ses_a", "stale")], fence=("ses_a", 1))
        a.post([_titled("ses_a", "stale post")], fence=("ses_a", 1))
        await a.flush()
        assert a.session("ses_a").title == ""  # type: ignore[union-attr]
        await b.write([_titled("ses_a", "fresh")], fence=("ses_a", 2))
        assert a.session("ses_a").title == "fresh"  # type: ignore[union-attr]
        # Given back at turn end: anyone may claim it at once.
        await b.release("ses_a")
        assert await a.claim("ses_a") == 3


async def test_the_keeper_reports_a_lost_lease_and_wakes_orphaned_work(
    postgres_schema: str,
) -> None:
    lost: list[str] = []
    woken: list[str] = []
    async with daemon(postgres_schema, lease_seconds=0.3) as a, daemon(
        postgres_schema, lease_seconds=0.3
    ) as b:
        b.hooks = ClusterHooks(wake=woken.append, lost=lost.append)
        await a.write([_created("ses_a")])
        assert await b.claim("ses_a") == 1
        # Another owner stole it in the database (as after b's partition): b hears of it.
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("UPDATE leases SET owner = 'elsewhere', epoch = 9")
        with trio.fail_after(5):
            while not lost:
                await trio.sleep(0.05)
        assert lost == ["ses_a"] and not b.holds("ses_a")
        # Input nobody runs is work for any daemon, once its lease lapsed.
        item = {"id": "msg_1", "session_id": "ses_a", "text": "hi", "delivery": "queue",
                "created": 1.0}  # fmt: skip
        await a.write([NewEvent("inbox.added", "ses_a", item)])
        with trio.fail_after(5):
            while "ses_a" not in woken:
                await trio.sleep(0.05)


async def test_the_schema_is_migrated_once_and_a_newer_one_refused(postgres_schema: str) -> None:
    PostgresLedger(postgres_schema).close()
    PostgresLedger(postgres_schema).close()
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM harness_schema").fetchall() == [
            (PG_SCHEMA_VERSION,)
        ]
        conn.execute("UPDATE harness_schema SET version = version + 1")
    with pytest.raises(LedgerError, match="newer than this harness knows"):
        PostgresLedger(postgres_schema)
    with pytest.raises(LedgerError, match="schema version"):
        PostgresLedger(postgres_schema, read_only=True)


def test_an_unreachable_database_is_one_clear_error() -> None:
    url = "postgresql://nobody@/harness?host=/nonexistent-dir&port=1"
    with pytest.raises(LedgerError, match=r"cannot reach the ledger database postgresql://"):
        PostgresLedger(url)


def test_a_url_with_a_password_is_refused_and_never_echoed() -> None:
    for url in ("postgresql://u:s3cret@db/h", "postgresql://u@db/h?password=s3cret"):
        with pytest.raises(ConfigError, match="PGPASSWORD") as caught:
            Config(ledger=url)
        assert "s3cret" not in str(caught.value)
        with pytest.raises(LedgerError, match="PGPASSWORD") as refused:
            PostgresLedger(url)
        assert "s3cret" not in str(refused.value)
    with pytest.raises(ConfigError, match="postgresql:// URL"):
        Config(ledger="/some/file.db")


async def test_a_dropped_connection_is_made_again_and_nothing_is_lost(
    postgres_schema: str,
) -> None:
    async with daemon(postgres_schema) as ledger:
        await ledger.write([_created("ses_a")])
        # The server drops every connection of this ledger (a restart, a failover).
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'harness' AND pid <> pg_backend_pid()"
            )
        await ledger.write([_titled("ses_a", "after the drop")])
        ledger.post([_titled("ses_a", "posted after the drop")])
        await ledger.flush()
        assert ledger.session("ses_a").title == "posted after the drop"  # type: ignore[union-attr]
        assert await ledger.claim("ses_a") == 1
        assert [e.seq for e in ledger.events_after(0)] == [1, 2, 3]


async def test_a_tail_behind_reads_the_log_once_for_many_commits_of_another_daemon(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit of another daemon is a NOTIFY; a tail that is behind reads everything
    committed when it wakes, so the wake-ups queued meanwhile must not each cost a read."""
    send, receive = trio.open_memory_channel[FeedMessage](10_000)
    async with daemon(postgres_schema, send) as a, daemon(postgres_schema) as b:
        reads: list[int] = []
        real_read = a._read_log

        def slow_read(after: int) -> list[Event]:
            reads.append(after)
            time.sleep(0.2)  # a tail behind: busy, or the database slow
            return real_read(after)

        monkeypatch.setattr(a, "_read_log", slow_read)
        await b.write([_created("ses_b")])
        for index in range(20):
            await b.write([_titled("ses_b", f"t{index}")])  # 20 commits, 20 NOTIFYs
        events: list[Event] = []
        with trio.fail_after(20):
            while len(events) < 21:
                message = await receive.receive()
                assert isinstance(message, Publish)
                events.extend(message.events)
        assert [e.seq for e in events] == list(range(1, 22))
        await trio.sleep(2.5)  # what the wake-ups queued meanwhile cost (a poll a second)
        assert len(reads) <= 6, reads  # one read per wake-up: 12 in 2.5 s, and more


async def test_a_claim_on_a_busy_row_answers_the_lease_this_daemon_holds(
    postgres_schema: str,
) -> None:
    """Another daemon's claim locks the lease row while it looks; a claim made here
    meanwhile skips the row. If this daemon holds the lease (its orphan scan took the
    session a moment before), that claim must say so: answering "held elsewhere" left a
    lease renewed here that no actor would ever run (a prompt never answered)."""
    async with daemon(postgres_schema) as a:
        await a.write([_created("ses_a")])
        assert await a.claim("ses_a") == 1
        with psycopg.connect(postgres_schema, autocommit=True) as other:
            with other.transaction():
                other.execute("SELECT * FROM leases WHERE session_id = 'ses_a' FOR UPDATE")
                assert await a.claim("ses_a") == 1
            await a.release("ses_a")
            with other.transaction():
                other.execute("SELECT * FROM leases WHERE session_id = 'ses_a' FOR UPDATE")
                assert await a.claim("ses_a") is None  # not held here: busy means no
        assert await a.claim("ses_a") == 1


async def test_hostile_text_round_trips_through_the_commits_quoted_query(
    postgres_schema: str,
) -> None:
    """A commit is one SQL text with its values quoted into it: whatever a model writes
    (quotes, backslashes, placeholders, dollar quotes, comments) is stored as written,
    in one batch of several events and upserts of the same row."""
    hostile = "it's \\' %s %(x)s $$ $a$ ;-- DROP TABLE events; /* \" é 🎉 \t\n"
    async with daemon(postgres_schema) as ledger:
        await ledger.write([_created("ses_a")])
        ledger.post([_titled("ses_a", hostile)])
        ledger.post([_titled("ses_a", hostile + "2")])
        ledger.post([_created("ses_b"), _titled("ses_b", hostile * 50)])
        await ledger.flush()
        assert ledger.session("ses_a").title == hostile + "2"  # type: ignore[union-attr]
        assert ledger.session("ses_b").title == hostile * 50  # type: ignore[union-attr]
        titles = [e.data.get("title") for e in ledger.events_after(0)]
        assert titles == ["", hostile, hostile + "2", "", hostile * 50]
        assert [e.seq for e in ledger.events_after(0)] == [1, 2, 3, 4, 5]


async def test_the_loops_reads_leave_it_free_and_survive_a_cancel_and_a_drop(
    postgres_schema: str,
) -> None:
    """A step's reads, from a database that is not close, run on the event loop without
    blocking it (issue 18): psycopg's generator is driven with Trio's waits on the loop
    reader connection's socket."""
    async with daemon(postgres_schema) as ledger:
        ledger.driven_reads = True  # as for a database farther away than this one
        await ledger.write([_created("ses_a")])
        session = await ledger.session_async("ses_a")
        assert session is not None and session.id == "ses_a"
        assert await ledger.changes_async("ses_a", 0) == ledger.changes("ses_a", 0)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await trio.sleep(0.01)
                ticks += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            rows = await ledger._rows_async("SELECT ?::text FROM pg_sleep(0.3)", ("x",))
            nursery.cancel_scope.cancel()
        assert rows == [("x",)]
        assert ticks >= 10, "the loop was held while the server worked"
        # Cut off mid-read: its connection, a query still in flight, is not used again.
        with trio.move_on_after(0.05) as cut:
            await ledger._rows_async("SELECT 1 FROM pg_sleep(2)")
        assert cut.cancelled_caught
        assert await ledger._rows_async("SELECT ?::int + 1", (41,)) == [(42,)]
        # Dropped by the server: made again, once, and the read answers.
        [reader] = ledger._loop_readers  # reads one at a time: one connection made
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (reader.pgconn.backend_pid,))
        assert await ledger.inbox_async("ses_a") == []
        assert ledger._loop_readers != [reader] and len(ledger._loop_readers) == 1
        # A statement the server refuses raises as with ``_rows``; the connection serves on.
        with pytest.raises(psycopg.errors.UndefinedTable):
            await ledger._rows_async("SELECT 1 FROM no_such_table")
        assert await ledger.claimed_turns_async("ses_a") == []
        # Reads of several tasks are in flight together, each on a connection of its own.
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ledger._rows_async, "SELECT 1 FROM pg_sleep(0.4)")
        assert trio.current_time() - started < 1.0
        assert len(ledger._loop_readers) == 3
        # With every loop reader busy, a read does not queue: it is made as before.
        answers: list[list[tuple[object, ...]]] = []

        async def read(value: int) -> None:
            answers.append(await ledger._rows_async("SELECT ?::int FROM pg_sleep(0.2)", (value,)))

        async with trio.open_nursery() as nursery:
            for value in range(LOOP_READERS + 2):
                nursery.start_soon(read, value)
        assert sorted(answers) == [[(value,)] for value in range(LOOP_READERS + 2)]
        assert len(ledger._loop_readers) == LOOP_READERS
        # A database this close is read blocking, which costs less; the answers are the same.
        ledger.driven_reads = False
        assert await ledger.changes_async("ses_a", 0) == ledger.changes("ses_a", 0)
        assert await ledger._rows_async("SELECT ?::int", (7,)) == [(7,)]


async def test_settle_makes_no_transaction_when_the_sessions_writes_are_all_in(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's start and its release wait for the session's own writes (issue 18): with
    none pending, no transaction; with one pending, it is committed first."""
    async with daemon(postgres_schema) as ledger:
        await ledger.write([_created("ses_a")])
        epoch = await ledger.claim("ses_a")
        assert epoch is not None
        commits: list[int] = []
        commit = ledger._commit

        def counting(batch: list[WriteEvents]) -> list[list[Event] | LedgerFenced]:
            commits.append(len(batch))
            return commit(batch)

        monkeypatch.setattr(ledger, "_commit", counting)
        await ledger.settle("ses_a")
        assert commits == []
        ledger.post([_titled("ses_a", "pending")], fence=("ses_a", epoch))
        await ledger.settle("ses_a")
        assert ledger.session("ses_a").title == "pending"  # type: ignore[union-attr]
        assert commits  # the post, and the flush that waited for it
        done = len(commits)
        await ledger.settle("ses_a")
        assert len(commits) == done
        # A flush still checks the fence, as a transaction of its own.
        await ledger.write((), fence=("ses_a", epoch))
        assert len(commits) == done + 1


async def test_work_heard_of_after_the_supervisor_ended_is_dropped_not_raised(
    postgres_schema: str, tmp_path: Path
) -> None:
    """At shutdown the ledger's orphan scan and tail can still hear of work after the
    supervisor ended: the daemon stopped with a BrokenResourceError traceback."""
    from harness.runtime import open_harness

    config = Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'model.json'}",
        ledger=postgres_schema,
        interactive=False,
    )
    async with open_harness(config) as h:
        hooks = h.ledger.hooks
    assert hooks is not None
    for hook in (hooks.orphan, hooks.wake, hooks.lost, hooks.cancel):
        hook("ses_gone")

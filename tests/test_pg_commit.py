"""A commit on the PostgreSQL ledger in one round trip (issue 18, seventh pass): counted
on the wire (libpq's trace of the writer's connection), and what it must still keep:
gapless seqs, fences that write nothing, sessions that must exist, a prompt's claim,
blobs stored once, a lost connection around the commit, and the tail's own events.
Skipped (saying why) without a test database; run under CI."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import trio
from test_ledger_postgres import _created, _titled, daemon

from harness.messages.events import NewEvent
from harness.messages.mailbox import WriteEvents
from harness.storage import postgres
from harness.storage.port import ClusterHooks, LedgerFenced, LedgerMissing
from harness.storage.postgres import PostgresLedger


@contextmanager
def _traced(ledger: PostgresLedger) -> Iterator[list[str]]:
    """libpq's trace of the writer's connection meanwhile, its lines given at the end."""
    from psycopg.pq import Trace

    lines: list[str] = []
    pgconn = ledger._write.pgconn
    with tempfile.TemporaryFile("w+", errors="replace") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield lines
        finally:
            pgconn.untrace()
            trace.seek(0)
            lines.extend(trace)


@contextmanager
def round_trips(ledger: PostgresLedger) -> Iterator[list[int]]:
    """The round trips the writer's connection makes meanwhile: each query (or a
    statement's parse-bind-execute) ends with the server's ReadyForQuery."""
    counted: list[int] = []
    with _traced(ledger) as lines:
        yield counted
    counted.append(sum(1 for line in lines if line.startswith("B") and "ReadyForQuery" in line))


@contextmanager
def sent_queries(ledger: PostgresLedger) -> Iterator[list[str]]:
    """The text of the simple queries the writer's connection sends meanwhile."""
    sent: list[str] = []
    with _traced(ledger) as lines:
        yield sent
    sent.extend(line for line in lines if line.startswith("F") and "\tQuery\t" in line)


def _inbox(session_id: str, item_id: str) -> NewEvent:
    item = {"id": item_id, "session_id": session_id, "text": "hi", "delivery": "queue",
            "created": 1.0}  # fmt: skip
    return NewEvent("inbox.added", session_id, item)


async def test_a_commit_is_one_round_trip_whatever_its_batch_holds(postgres_schema: str) -> None:
    """A batch with a new session, fenced writes, a blob, a prompt that takes its
    session's lease and a release: one round trip, seqs gapless after the other
    daemon's, the NOTIFY's ``first-last!`` right, the projections written."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a"), _created("ses_p")])
        epoch = await a.claim("ses_a")
        assert epoch is not None
        await b.write([_created("ses_b")])  # the seqs go on from the other daemon's
        heard: list[str] = []
        with psycopg.connect(postgres_schema, autocommit=True) as listener:
            listener.execute(f'LISTEN "{a.channel}"')
            with round_trips(a) as trips:
                batch = [
                    WriteEvents([_titled("ses_a", "one"), _titled("ses_a", "two")],
                                fence=("ses_a", epoch), blobs=[("d1", b"contents")]),
                    WriteEvents([_created("ses_c")]),
                    WriteEvents([_inbox("ses_p", "msg_1")], exists="ses_p", claim=True),
                    WriteEvents([_titled("ses_c", "three")], exists="ses_c"),
                ]  # fmt: skip
                results = await trio.to_thread.run_sync(a._commit, batch)
            heard = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        assert trips == [1]
        assert [[e.seq for e in r] for r in results] == [[4, 5], [6], [7], [8]]  # type: ignore[union-attr]
        assert heard == ["4-8!"]  # inbox.added: handed over
        assert a.commits_in_one >= 1
        a._after_commit()
        assert a.holds("ses_p") and a.take_claim_reads("ses_p") is not None
        assert [e.seq for e in b.events_after(0)] == list(range(1, 9))
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            assert conn.execute("SELECT seq FROM sessions WHERE id = 'ses_c'").fetchall() == [(8,)]
            assert conn.execute("SELECT seq FROM inbox").fetchall() == [(7,)]
            assert conn.execute("SELECT count(*) FROM blobs WHERE hash = 'd1'").fetchone() == (1,)
        assert a.blob("d1") == b"contents"
        # A blob known stored is not sent again; one of another daemon's is, harmlessly.
        with round_trips(a) as trips:
            await a.write([_titled("ses_a", "four")], fence=("ses_a", epoch),
                          blobs=[("d1", b"contents")])  # fmt: skip
            await b.write([_titled("ses_b", "five")], blobs=[("d1", b"contents")])
        assert trips == [1]
        assert b.blob("d1") == b"contents"


async def test_a_fenced_request_writes_nothing_and_the_rest_commits(postgres_schema: str) -> None:
    """A batch whose one request lost its lease: the commit of one round trip is
    aborted (its statement raised), written again in two: the fenced request refused
    with ``LedgerFenced``, the others committed, seqs gapless."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a"), _created("ses_b")])
        epoch = await a.claim("ses_a")
        assert epoch is not None
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("UPDATE leases SET owner = 'elsewhere', epoch = 9")
        two = a.commits_in_two
        with round_trips(a) as trips:
            batch = [
                WriteEvents([_titled("ses_b", "kept")]),
                WriteEvents([_titled("ses_a", "lost")], fence=("ses_a", epoch)),
                WriteEvents([_titled("ses_b", "kept too")]),
            ]
            results = await trio.to_thread.run_sync(a._commit, batch)
        assert trips == [3]  # the one refused, then two (its ROLLBACK in the first)
        assert a.commits_in_two == two + 1
        assert isinstance(results[1], LedgerFenced)
        assert [[e.seq for e in r] for r in (results[0], results[2])] == [[3], [4]]  # type: ignore[union-attr]
        assert [(e.seq, e.session_id) for e in b.events_after(0)] == [
            (1, "ses_a"), (2, "ses_b"), (3, "ses_b"), (4, "ses_b")]  # fmt: skip
        assert b.session("ses_a").title == ""  # type: ignore[union-attr]
        with pytest.raises(LedgerFenced):
            await a.write([_titled("ses_a", "lost")], fence=("ses_a", epoch))
        # The connection serves the next commit, in one round trip again.
        with round_trips(a) as trips:
            await a.write([_titled("ses_b", "after")])
        assert trips == [1]


async def test_a_batch_decided_in_two_round_trips_goes_as_arrays_with_its_seqs_known(
    postgres_schema: str,
) -> None:
    """In two round trips the seqs are known before the writes: a column of plain seqs,
    not offsets, still one array (16 rows or more), and stored in order, gapless."""
    async with daemon(postgres_schema) as a:
        sessions = [f"ses_{index:02d}" for index in range(20)]
        await a.write([_created("ses_a"), *(_created(s) for s in sessions)])
        epoch = await a.claim("ses_a")
        assert epoch is not None
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("UPDATE leases SET owner = 'elsewhere', epoch = 9")
        batch = [
            WriteEvents([_titled("ses_a", "lost")], fence=("ses_a", epoch)),
            WriteEvents([_titled(s, f"title of {s}") for s in sessions]),
        ]
        with sent_queries(a) as queries:
            results = await trio.to_thread.run_sync(a._commit, batch)
        assert isinstance(results[0], LedgerFenced)
        assert [e.seq for e in results[1]] == list(range(22, 42))  # type: ignore[union-attr]
        assert any("FROM unnest('{22,23," in query for query in queries)
        stored = a.events_after(21)
        assert [(e.seq, e.session_id, e.data["title"]) for e in stored] == [
            (22 + index, s, f"title of {s}") for index, s in enumerate(sessions)
        ]
        assert [a.session(s).title for s in sessions] == [  # type: ignore[union-attr]
            f"title of {s}" for s in sessions
        ]


async def test_a_missing_session_is_refused_and_a_deleted_one_decided_in_two(
    postgres_schema: str,
) -> None:
    async with daemon(postgres_schema) as a:
        await a.write([_created("ses_a")])
        with pytest.raises(LedgerMissing):
            await a.write([_inbox("ses_x", "msg_1")], exists="ses_x", claim=True)
        assert not a.holds("ses_x")
        deleted = NewEvent("session.deleted", "ses_a", {"id": "ses_a"})
        batch = [WriteEvents([deleted]), WriteEvents([_inbox("ses_a", "msg_2")], exists="ses_a")]
        one = a.commits_in_one
        results = await trio.to_thread.run_sync(a._commit, batch)
        assert a.commits_in_one == one  # known at once: no round trip wasted
        assert [e.seq for e in results[0]] == [2] and isinstance(results[1], LedgerMissing)  # type: ignore[union-attr]
        assert [e.seq for e in a.events_after(0)] == [1, 2]


async def test_a_commit_that_landed_before_its_connection_died_is_not_written_again(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection dies after the server committed, before the writer read the
    answer (so before it knew the seqs): the writer finds the commit by its first
    event, answers with its seqs, and writes nothing twice; a prompt's claim is read
    back from the leases."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a"), _created("ses_p")])
        await b.write([_created("ses_b")])
        real = postgres._result_sets
        dropped: list[bool] = []

        def lost_answer(cursor: Any) -> Any:
            if not dropped:
                dropped.append(True)
                cursor.connection.close()  # committed: its answer never read
                raise psycopg.OperationalError("the connection was lost")
            return real(cursor)

        monkeypatch.setattr(postgres, "_result_sets", lost_answer)
        events = await a.write([_inbox("ses_p", "msg_1"), _titled("ses_p", "t")],
                               exists="ses_p", claim=True)  # fmt: skip
        assert dropped and [e.seq for e in events] == [4, 5]
        assert a.holds("ses_p")
        assert a.take_claim_reads("ses_p") is None  # lost with the answer: read again
        await a.write([_titled("ses_a", "next")])
        assert [(e.seq, e.type) for e in b.events_after(3)] == [
            (4, "inbox.added"), (5, "session.updated"), (6, "session.updated")]  # fmt: skip


async def test_the_tail_waits_for_a_commit_in_flight_before_telling_its_events_apart(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail reads the log (another daemon's commit woke it) while this daemon's
    commit has landed but its writer has not learned its seqs yet: this daemon's own
    input is not handed over as another daemon's."""
    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)  # no wake but the tail's
    woken: list[str] = []
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        a.hooks = ClusterHooks(wake=woken.append, lost=lambda session_id: None,
                               subscribers=lambda: 1)  # fmt: skip
        await b.write([_created("ses_a"), _created("ses_b")])
        with trio.fail_after(5):
            while a._known_seq < 2:
                await trio.sleep(0.02)
        numbered = a._numbered

        def slow(*args: Any) -> None:
            time.sleep(0.6)  # committed, its answer not read yet: the tail reads meanwhile
            numbered(*args)

        monkeypatch.setattr(a, "_numbered", slow)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.write, [_inbox("ses_a", "msg_own")])
            await trio.sleep(0.2)
            await b.write([_inbox("ses_b", "msg_theirs")])
        with trio.fail_after(5):
            while "ses_b" not in woken:
                await trio.sleep(0.02)
        await trio.sleep(0.2)
        assert woken == ["ses_b"]


async def test_a_prompt_taking_a_lapsed_lease_of_another_daemon_is_decided_in_two(
    postgres_schema: str,
) -> None:
    """The change of hands adds ``session.leased`` to the commit, which one round trip
    cannot number: refused there (nothing written, the lease untouched), made in two."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a")])
        assert await b.claim("ses_a") == 1
        b._held.pop("ses_a")  # b stopped renewing, and its lease lapsed
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("UPDATE leases SET expires = 1")
        two = a.commits_in_two
        with round_trips(a) as trips:
            events = await a.write([_inbox("ses_a", "msg_1")], exists="ses_a", claim=True)
        assert trips == [3] and a.commits_in_two == two + 1
        assert [(e.seq, e.type) for e in events] == [(2, "inbox.added"), (3, "session.leased")]
        assert events[1].data == {"session_id": "ses_a", "owner": a.owner, "epoch": 2,
                                  "from": b.owner}  # fmt: skip
        assert a.holds("ses_a") and a.held_epoch("ses_a") == 2
        assert [e.seq for e in b.events_after(0)] == [1, 2, 3]


async def test_a_commit_whose_server_was_away_a_while_is_looked_up_not_sent_twice(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection dies around the commit (it landed) and the server cannot be
    reached at once to ask: the writer's next try looks the commit up first, and the
    events are written once."""
    async with daemon(postgres_schema) as a:
        await a.write([_created("ses_a")])
        real_sets, real_connect = postgres._result_sets, a._connect_raw
        dropped: list[bool] = []
        refused: list[bool] = []

        def lost_answer(cursor: Any) -> Any:
            if not dropped:
                dropped.append(True)
                cursor.connection.close()
                raise psycopg.OperationalError("the connection was lost")
            return real_sets(cursor)

        def away_once() -> Any:
            if not refused:
                refused.append(True)
                raise psycopg.OperationalError("the server is restarting")
            return real_connect()

        monkeypatch.setattr(postgres, "_result_sets", lost_answer)
        monkeypatch.setattr(a, "_connect_raw", away_once)
        events = await a.write([_titled("ses_a", "once")])
        assert dropped and refused and [e.seq for e in events] == [2]
        await a.write([_titled("ses_a", "next")])
        assert [(e.seq, e.data.get("title")) for e in a.events_after(1)] == [
            (2, "once"), (3, "next")]  # fmt: skip


# Text an array literal must carry as is: its own syntax, SQL's quote, escapes, the word
# NULL, white space, non-ASCII, and a model's text written to break out of the literal
# (it reaches these rows unchanged: a tool's output, a title). Each is a session title,
# so it goes through the events INSERT and the sessions upsert of one commit.
_AWKWARD_TITLES = [
    "\"}'::text[]); DROP TABLE events; --", "x\\", "\\'", "\\\"", "'}", "\"\"",
    "", "NULL", "null", '"', "\\", "\\\\", "'", "''", "{", "}", "{a,b}", ",", " lead", "trail ",
    "a\"b\\c'd", "\\N", "tab\there", "new\nline", "crlf\r\n", "é ü 漢字 🚀", "\\x00 as text",
    "E'x'", "$$dollar$$", "');DROP TABLE events;--", "\u2028\u2029", "\x7f\x01",
]  # fmt: skip


@pytest.mark.parametrize("arrays", ["on", "off"])
async def test_awkward_text_is_stored_exactly_as_arrays_and_as_values(
    postgres_schema: str, arrays: str
) -> None:
    """A commit's rows go as one array a column (``on``), or as ``VALUES`` where the
    connection's string literals would bend backslashes (``off``): either way, what is
    read back is what was written, byte for byte, in the events and in the sessions."""
    async with daemon(postgres_schema) as a:
        a._write.execute(f"SET standard_conforming_strings = {arrays}")
        sessions = [f"ses_t{index}" for index in range(len(_AWKWARD_TITLES))]
        await a.write([_created(session_id) for session_id in sessions])
        titles = [f"{index}:{title}" for index, title in enumerate(_AWKWARD_TITLES)]
        with sent_queries(a) as queries:
            written = await a.write(
                [_titled(s, title) for s, title in zip(sessions, titles, strict=True)]
            )
        assert queries[0].count("FROM unnest(") == (2 if arrays == "on" else 0)
        assert [event.data["title"] for event in written] == titles
        stored = a.events_after(written[0].seq - 1, session_ids=sessions)  # type: ignore[operator]
        assert [event.data["title"] for event in stored] == titles
        for session_id, title in zip(sessions, titles, strict=True):
            session = a.session(session_id)
            assert session is not None and session.title == title and session.parent_id is None


def test_columns_that_cannot_be_arrays_and_small_batches_are_left_to_values() -> None:
    from harness.storage.pg_arrays import ARRAYS_FROM_ROWS, SeqOffset, unnest_insert

    def rows(*row: Any) -> list[tuple[Any, ...]]:
        return [row] * ARRAYS_FROM_ROWS

    sql = "INSERT INTO t(a, b) VALUES (?, ?)"
    assert unnest_insert(sql, rows(1, "x")[1:]) is None  # fewer rows: VALUES costs less
    assert unnest_insert(sql, [(SeqOffset(1), "x"), *rows(2, "y")]) is None  # offsets, seqs
    assert unnest_insert(sql, [(None, "x"), *rows(2, "y")]) is None  # a NULL number
    assert unnest_insert(sql, rows(True, "x")) is None  # a type not rendered here
    assert unnest_insert(sql, rows(1, "a\x00b")) is None  # libpq would cut the query
    assert unnest_insert(sql, rows(1, "\udc80")) is None  # not UTF-8
    made = unnest_insert(sql + " ON CONFLICT(a) DO NOTHING", rows(SeqOffset(1), None))
    assert made is not None
    assert made.startswith(b"INSERT INTO t(a, b) SELECT base.b + u.c0, u.c1 FROM unnest(")
    assert made.endswith(b" ON CONFLICT(a) DO NOTHING")

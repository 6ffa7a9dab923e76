"""The PostgreSQL ledger (DESIGN §14): one database that every daemon shares.

Behind the same port as the SQLite ledger (harness/storage/port.py): the same writer
actor, the same reads and projections. What differs, and why:

- psycopg 3's synchronous connections. Its ``AsyncConnection`` (and asyncpg) fail under
  Trio, so commits, claims and renewals run in ``trio.to_thread``; the small indexed reads
  run on the caller's thread, as SQLite's do. LISTEN needs no thread:
  ``trio.lowlevel.wait_readable`` on the connection's socket.
- Seqs are global: each append takes one advisory lock and numbers its events after
  ``max(seq)``, so they are gapless and committed in order across daemons.
- Committed events reach this daemon's feed in seq order, its own and other daemons'
  alike (``_tail``): ``NOTIFY`` carries the new seq as a wake-up, the tail reads the
  events by seq. A batch of its own that follows the last seq it published needs no read.
- Leases: a session actor claims its session before it runs a turn (``claim``, with
  ``FOR UPDATE SKIP LOCKED``), the keeper renews every lease held, and each write carries
  its lease's epoch (``WriteEvents.fence``): an append whose epoch is no longer the
  session's is refused, so a daemon that lost a session can never write to it.
- The password never comes from the URL (refused by ``check_dsn``): libpq reads it from
  ``PGPASSWORD``, ``PGPASSFILE`` or ``~/.pgpass``.
- A lost connection is re-made with backoff: a commit is retried (sessions wait, nothing
  is lost) for up to ``RECONNECT_SECONDS``; a read reconnects once, then fails clearly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
import trio

from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, Publish, RegisterChild, WriteEvents
from harness.messages.model import InboxItem, Message, Part, Session
from harness.storage.ledger import stored_text
from harness.storage.pg_arrays import SeqOffset, unnest_insert
from harness.storage.pg_live import LiveRelay
from harness.storage.pg_schema import PG_MIGRATIONS, PG_SCHEMA_VERSION
from harness.storage.port import (
    _MESSAGE,
    _PART,
    ClaimReads,
    LedgerError,
    LedgerFenced,
    LedgerMissing,
    LedgerPort,
    LedgerRefused,
    on_worker_thread,
)
from harness.storage.projections import PROJECTIONS

if TYPE_CHECKING:
    import psycopg

log = structlog.get_logger("harness.ledger")

T = TypeVar("T")

RECONNECT_SECONDS = 120.0  # how long a commit waits for the database to come back
# Reads of the event loop in flight at once, each on its own connection: with one, each
# read waited for the reads queued before it, a scheduler round each (issue 18).
LOOP_READERS = 4
# How long a loop's read waits for its answer before letting the loop go on (benchmarks/
# pg_reads.py): a scheduler round on a busy loop is longer than a local answer.
READ_SPIN_SECONDS = 0.001
# The round trip (median of a few, at start) from which the loop's hot reads are driven
# non-blocking: a database farther than a scheduler round on a busy loop (1-3 ms). Below
# it, a blocking read is cheaper: at saturation, with the database on the same machine,
# the driven reads cost 0.3 ms of CPU a step more and a fifth of the throughput
# (benchmarks/pg_turns.py, issue 18).
DRIVEN_READS_FROM_SECONDS = 0.002
_POLL_SECONDS = 1.0  # the tail reads the log this often even without a NOTIFY
TAKEOVER_BATCH = 256  # sessions one scan claims at most: the rest go to the next daemon's
ORPHAN_SCAN_SECONDS = 0.5  # how often a daemon looks for work whose holder stopped renewing
_PG_SQL: dict[str, str] = {}
_END = "end"  # what tells the tail that the writer has ended
_POLL = "poll"  # the tail's wait ended with nothing: it reads the log, in case
_TAIL_CHUNK = 1000  # seqs the tail reads at most at once
# What another daemon commits that this one acts on, subscriber or not (``_saw_inbox``,
# ``_hand_over``, ``_register_children``): all the tail reads while this daemon's feed
# has no subscriber to hear the rest (``_filtering``).
_HANDED_OVER = [
    "inbox.added",
    "permission.replied",
    "question.replied",
    "question.rejected",
    "cancel.requested",
    "session.deleted",
    "session.created",
]
_HANDED_OVER_TYPES = frozenset(_HANDED_OVER)
_FULL_READ = (
    "SELECT seq, ts, type, session_id, data FROM events WHERE seq > %s"
    f" ORDER BY seq LIMIT {_TAIL_CHUNK}"
)
# The same seqs, only the events of those types, and a last row (its type NULL) with the
# highest seq committed among them: the tail's cursor moves over the events left out.
# Both parts see the same snapshot; seqs are committed in order, gapless.
_FILTERED_READ = (
    "SELECT seq, ts, type, session_id, data FROM events"
    f" WHERE seq > %s AND seq <= %s + {_TAIL_CHUNK} AND type = ANY(%s)"
    " UNION ALL SELECT max(seq), NULL, NULL, NULL, NULL FROM events"
    f" WHERE seq > %s AND seq <= %s + {_TAIL_CHUNK} ORDER BY 1, 3 NULLS LAST"
)


# A commit of one round trip found committed after a lost connection: its results,
# given the connection and the seq before its first.
_Landed = Callable[["psycopg.Connection[tuple[Any, ...]]", int], list[list[Event] | LedgerRefused]]


class _Attempt:
    """One append's progress: its first event (to tell, after a lost connection, whether
    the commit landed) and its results, complete before the commit.

    A commit in one round trip (``_append_in_one``) sends its events before their seqs
    are known: ``first`` has seq 0, ``after`` is a seq below the commit's first, and
    ``landed`` gives the results once the first seq is found."""

    __slots__ = ("after", "first", "landed", "result")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.first: tuple[int, float, str, str] | None = None
        self.result: list[list[Event] | LedgerRefused] = []
        self.after = 0
        self.landed: _Landed | None = None


class _Assumed(Exception):
    """A commit in one round trip found untrue what it assumed (``_REFUSALS``): it
    wrote nothing, and is made again in two."""


# What a commit in one round trip assumed and found untrue, by the SQLSTATE its
# statement raised (``harness_refuse``, PG_MIGRATIONS[2]).
_REFUSALS = {
    "HX001": "a lease is no longer the writer's",
    "HX002": "a session does not exist",
    "HX003": "a prompt's claim takes the lease from another daemon",
}
# A commit in one round trip's head (PG_MIGRATIONS[2]): the lock, its checks, and the
# max(seq) its seqs are numbered from, which it answers with; each ``SeqOffset`` adds its
# offset to it.
_BEGIN_IN_ONE = (
    "SELECT harness_append_begin(?, CAST(? AS TEXT[]), CAST(? AS BIGINT[]), ?,"
    " CAST(? AS TEXT[]))"
)
_SEQ_SQL = b"(CAST(current_setting('harness.base') AS BIGINT)+%d)"
_NOTIFY_IN_ONE = "SELECT pg_notify(?, CAST(? AS TEXT) || '-' || CAST(? AS TEXT) || ?)"
_RELEASE_IN_BATCH = (
    "UPDATE leases SET expires = 0 WHERE session_id = ? AND epoch = ? AND owner = ?"
)
_BLOB_INSERT = "INSERT INTO blobs(hash, size, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
_KNOWN_BLOBS = 4096  # digests this daemon knows are stored, kept at most (never deleted)


def is_postgres_url(ledger: str | None) -> bool:
    return bool(ledger) and str(ledger).startswith(("postgresql://", "postgres://"))


def check_dsn(dsn: str) -> str:
    """``dsn`` if it is a usable PostgreSQL URL without a password; else ``LedgerError``.

    A password in a URL ends up in shell histories, process lists and logs: it is
    refused, never stripped silently. libpq reads it from ``PGPASSWORD`` or ``~/.pgpass``.
    """
    from psycopg import conninfo

    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except Exception as error:  # psycopg.ProgrammingError: not a connection string
        raise LedgerError(f"not a PostgreSQL URL: {_first_line(error)}") from None
    if parts.get("password"):
        raise LedgerError(
            "the ledger URL holds a password: remove it and give it to libpq through "
            "PGPASSWORD, PGPASSFILE or ~/.pgpass (a URL is shown in logs and process lists)"
        )
    return dsn


def describe_dsn(dsn: str) -> str:
    """The database a URL names, fit for a log line: user, host, port, database."""
    from psycopg import conninfo

    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except Exception:
        return "postgresql://(unparsable)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def _application_name(dsn: str) -> str:
    """What the daemon's connections are called in ``pg_stat_activity``: the URL's
    ``application_name`` if it names one (to tell daemons apart), else ``harness``."""
    from psycopg import conninfo

    return str(conninfo.conninfo_to_dict(dsn).get("application_name") or "harness")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _pg(sql: str) -> str:
    """The port's ``?`` placeholders as psycopg's ``%s`` (the port's SQL has no ``%``)."""
    converted = _PG_SQL.get(sql)
    if converted is None:
        converted = _PG_SQL[sql] = sql.replace("?", "%s")
    return converted


def _lock_key(schema: str, purpose: str) -> int:
    """An advisory lock key (signed 64 bits) of one schema: tests share a database."""
    value = zlib.crc32(f"{schema}/{purpose}".encode()) | (zlib.crc32(purpose.encode()) << 32)
    return value - (1 << 64) if value >= 1 << 63 else value


# Projection upserts whose conflict target is their first value (the row's id): those a
# transaction makes are sent as one multi-row INSERT per table, at the first statement
# that may touch the table, with an id's writes merged into one row (PostgreSQL refuses
# to update one row twice in one statement).
_MULTI_ROW = ("INSERT INTO sessions(", "INSERT INTO messages(", "INSERT INTO parts(")
_MULTI_SQL: dict[tuple[str, int], str] = {}
_EVENT_INSERT = "INSERT INTO events(seq, ts, session_id, type, data) VALUES (?, ?, ?, ?, ?)"
_UPSERTED_TABLES = re.compile(r"\b(sessions|messages|parts)\b|^(COMMIT|ROLLBACK)")
_MERGE: dict[str, tuple[int, ...] | None] = {}
_ORDERED: dict[str, bool] = {}


def _merge_columns(sql: str) -> tuple[int, ...] | None:
    """The positions of the columns an upsert's ``ON CONFLICT … DO UPDATE`` sets, each to
    its ``excluded`` value; None if it sets anything else (its writes are not merged).

    An id's later upsert in a transaction changes exactly these columns of its row, so
    its writes merge into one row: the first write's values but for these, the last's.
    """
    if sql in _MERGE:
        return _MERGE[sql]
    columns = [c.strip() for c in sql.partition("(")[2].partition(")")[0].split(",")]
    assignments = sql.partition(" DO UPDATE SET ")[2].split(",")
    positions: list[int] | None = []
    for assignment in assignments:
        column, _, value = (part.strip() for part in assignment.partition("="))
        if positions is None or column not in columns or value != f"excluded.{column}":
            positions = None
            break
        positions.append(columns.index(column))
    merged = _MERGE[sql] = tuple(positions) if positions else None
    return merged


def _ordered(sql: str) -> bool:
    """Whether a statement must come after the pending upserts: it may touch their
    tables (a deletion), or it ends the transaction."""
    ordered = _ORDERED.get(sql)
    if ordered is None:
        ordered = _ORDERED[sql] = _UPSERTED_TABLES.search(sql) is not None
    return ordered


def _multi_row(sql: str, rows: int) -> str:
    """``sql`` (one ``VALUES (?, ...)``) with ``rows`` rows of values, in ``%s`` style."""
    converted = _MULTI_SQL.get((sql, rows))
    if converted is None:
        head, _, rest = sql.partition(" VALUES (")
        values, _, tail = rest.partition(")")
        row = f"({values})"
        converted = _MULTI_SQL[(sql, rows)] = _pg(
            f"{head} VALUES {', '.join([row] * rows)}{tail}"
        )
    return converted


def _sessions_to_find(batch: list[WriteEvents]) -> list[str] | None:
    """The sessions a commit in one round trip checks exist: those the batch's requests
    need (``WriteEvents.exists``) and do not create before; None if one needs a session
    the batch deleted before it (refused: two round trips decide each request)."""
    made: set[str] = set()
    gone: set[str] = set()
    needed: set[str] = set()
    for request in batch:
        if request.exists is not None:
            if request.exists in gone:
                return None
            if request.exists not in made:
                needed.add(request.exists)
        for new in request.events:
            if new.type == "session.created":
                made.add(new.session_id)
                gone.discard(new.session_id)
            elif new.type == "session.deleted":
                gone.add(new.session_id)
                made.discard(new.session_id)
    return sorted(needed)


def _result_sets(cursor: psycopg.Cursor[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
    """Every statement's rows of a multi-statement query, in order ([] for a command)."""
    sets: list[list[tuple[Any, ...]]] = []
    while True:
        sets.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return sets


_PIECES: dict[str, tuple[bytes, ...]] = {}
# What a session actor reads once it holds its lease (``ClaimReads``), sent with its claim.
_CLAIM_READS = (
    ("SELECT session_id, message_id, resumes FROM turns WHERE session_id = ? ORDER BY started", 1),
    ("SELECT data FROM inbox WHERE session_id = ? ORDER BY seq", 1),
    ("SELECT data FROM sessions WHERE id = ?", 1),
    ("SELECT 0, seq, created_seq, data FROM messages WHERE session_id = ?"
     " UNION ALL SELECT 1, seq, seq, data FROM parts WHERE session_id = ? ORDER BY 1, 3", 2),
)  # fmt: skip
_TAKEN = "SELECT epoch, owner FROM ins UNION ALL SELECT epoch, owner FROM upd"
# A claim in one statement: a session never leased is taken by its insert (one row
# written; it was inserted free, then updated); a free or lapsed lease by the update,
# a row locked (being claimed, or share-locked by an append) skipped: held. Both parts
# see one snapshot, so the update never sees the row the insert makes.
_CLAIM_FREE_OR_LAPSED = (
    " old AS (SELECT session_id, owner, epoch FROM leases WHERE session_id = ?"
    " FOR UPDATE SKIP LOCKED),"
    " upd AS (UPDATE leases l SET owner = ?,"
    " epoch = CASE WHEN old.owner = ? THEN old.epoch ELSE old.epoch + 1 END,"
    " expires = extract(epoch FROM clock_timestamp()) + ?"
    " FROM old WHERE l.session_id = old.session_id"
    " AND (old.owner = ? OR l.expires <= extract(epoch FROM clock_timestamp()))"
    " RETURNING l.epoch, CAST(old.owner AS TEXT) AS owner) " + _TAKEN
)
_CLAIM = (
    "WITH ins AS (INSERT INTO leases(session_id, owner, epoch, expires)"
    " VALUES (?, ?, 1, extract(epoch FROM clock_timestamp()) + ?) ON CONFLICT DO NOTHING"
    " RETURNING epoch, CAST('' AS TEXT) AS owner)," + _CLAIM_FREE_OR_LAPSED
)
# The same, in the writer's transaction for a prompt (``WriteEvents.claim``), and only
# if the session exists: the session, this daemon, the lease time, as ``?`` values.
_CLAIM_WITH_PROMPT = (
    "WITH ins AS (INSERT INTO leases(session_id, owner, epoch, expires)"
    " SELECT ?, ?, 1, extract(epoch FROM clock_timestamp()) + ?"
    " WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?) ON CONFLICT DO NOTHING"
    " RETURNING epoch, CAST('' AS TEXT) AS owner)," + _CLAIM_FREE_OR_LAPSED
)
# The same in a commit of one round trip, which cannot add the ``session.leased`` of a
# change of hands (its seqs are numbered before it is sent): refused (``_REFUSALS``),
# the commit is made in two. This daemon's id once more, as a last ``?`` value.
_CLAIM_WITH_PROMPT_IN_ONE = (
    _CLAIM_WITH_PROMPT.removesuffix(f" {_TAKEN}")
    + f", taken AS ({_TAKEN}) SELECT epoch, owner, CASE WHEN owner NOT IN ('', ?)"
    " THEN harness_refuse('HX003', 'changes hands') END FROM taken"
)
# A claim's epoch, the previous owner if another, and with reads their rows.
_ClaimOutcome = tuple[
    int,
    str | None,
    tuple[list[tuple[Any, ...]], ...] | None,
]
_CHANGES = (
    "SELECT 0, seq, created_seq, data FROM messages WHERE session_id = ? AND seq > ?"
    " UNION ALL SELECT 1, seq, seq, data FROM parts WHERE session_id = ? AND seq > ?"
    " ORDER BY 1, 3"
)


def _changes(
    rows: list[tuple[Any, ...]], after_seq: int
) -> tuple[list[Message], list[Part], int]:
    mark = after_seq
    messages: list[Message] = []
    parts: list[Part] = []
    for kind, seq, _, data in rows:
        if kind == 0:
            messages.append(_MESSAGE.validate_json(data))
        else:
            parts.append(_PART.validate_json(data))
        mark = max(mark, seq)
    return messages, parts, mark


async def _fetch_nonblocking(
    conn: psycopg.Connection[tuple[Any, ...]], query: str, args: tuple[Any, ...], spin: float
) -> list[tuple[Any, ...]]:
    """Run one query on ``conn`` from the event loop, waiting with Trio, and its rows.

    ``Cursor._execute_gen`` is what psycopg's sync and async cursors both run (its
    generators yield what they wait for: the socket readable, writable, or either); it
    is private, hence psycopg pinned below 3.4 and this tested against each backend.

    An answer that comes within ``spin`` seconds is taken at once; only a slower one
    waits for Trio to report the socket readable, which costs a scheduler round: on a
    busy loop, longer than a database on the same machine takes to answer.
    """
    import select

    from psycopg.waiting import Ready, Wait

    fd = conn.pgconn.socket
    cursor = conn.cursor()
    generator = cursor._execute_gen(query, args)
    poller: select.poll | None = None
    try:
        wanted = next(generator)
        while True:
            if wanted == Wait.R:
                if spin > 0:
                    if poller is None:
                        poller = select.poll()
                        poller.register(fd, select.POLLIN)
                    if not poller.poll(spin * 1000):
                        spin = 0.0  # slow: the loop goes on meanwhile, from now on
                        await trio.lowlevel.wait_readable(fd)
                else:
                    await trio.lowlevel.wait_readable(fd)
                wanted = generator.send(Ready.R)
            elif wanted == Wait.W:
                await trio.lowlevel.wait_writable(fd)
                wanted = generator.send(Ready.W)
            else:
                wanted = generator.send(await _readable_or_writable(fd))
    except StopIteration:
        pass
    return cursor.fetchall()


async def _readable_or_writable(fd: int) -> int:
    """Wait until ``fd`` is readable or writable: psycopg's ``Ready`` value for it.

    A socket asked for both is nearly always writable at once; failing that, it is
    looked at again every few milliseconds, so a reply that comes first is not missed.
    """
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLOUT)
    while True:
        events = poller.poll(0)
        if events:
            mask = events[0][1]
            return (1 if mask & (select.POLLIN | select.POLLHUP | select.POLLERR) else 0) | (
                2 if mask & select.POLLOUT else 0
            )
        with trio.move_on_after(0.005):
            await trio.lowlevel.wait_writable(fd)


def _pieces(sql: str) -> tuple[bytes, ...]:
    """A statement (``%s`` placeholders) cut at its placeholders, encoded."""
    pieces = _PIECES.get(sql)
    if pieces is None:
        pieces = _PIECES[sql] = tuple(piece.encode() for piece in sql.split("%s"))
    return pieces


class _Statements:
    """A transaction's statements, in order, rendered as one simple query.

    One call and one round trip for a whole batch. The values are quoted by psycopg's
    own literal adapters (what its ``ClientCursor`` does); the query is assembled here
    from statements cut once at their placeholders, where ``ClientCursor`` would parse
    the whole, never-repeated text again (a quarter of a daemon's CPU).

    A batch holds many upserts by id of a few tables (a step's message and parts,
    created then updated, the session), several batches' worth of sessions interleaved.
    They wait, one row per id, merged as the database would apply them in turn, and go
    as one multi-row INSERT per table, before the first later statement that may touch
    that table: a step made ~6 statements and rows, and ~13 steps share a batch at
    saturation (issue 18). What the other statements see is unchanged.
    """

    __slots__ = ("_pending", "_statements")

    def __init__(self) -> None:
        # A statement cut at its placeholders and its values; or None and (the SQL of
        # one VALUES row, the rows) for ``add_rows``.
        self._statements: list[tuple[tuple[bytes, ...] | None, Sequence[Any]]] = []
        # Upsert statement -> id -> the row to write, in the order the ids came.
        self._pending: dict[str, dict[Any, tuple[Any, ...]]] = {}

    def execute(self, sql: str, args: tuple[Any, ...]) -> None:
        """A projection's write (``?`` placeholders)."""
        if sql.startswith(_MULTI_ROW) and (merge := _merge_columns(sql)) is not None:
            rows = self._pending.get(sql)
            if rows is None:
                rows = self._pending[sql] = {}
            earlier = rows.get(args[0])
            if earlier is not None:
                row = list(earlier)
                for position in merge:
                    row[position] = args[position]
                args = tuple(row)
            rows[args[0]] = args
            return
        self.add(sql, args)

    def add(self, sql: str, args: Sequence[Any]) -> int:
        """Add a statement; its position among the query's result sets."""
        if self._pending and _ordered(sql):
            self._flush()
        self._statements.append((_pieces(_pg(sql)), args))
        return len(self._statements) - 1

    def add_rows(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """One statement of ``rows`` rows (``sql`` has one ``VALUES`` row), for a table
        no upsert here touches: as column arrays (harness/storage/pg_arrays.py) where
        the connection allows, else ``VALUES``, decided when the query is made."""
        self._statements.append((None, (sql, rows)))

    def query(self, conn: psycopg.Connection[tuple[Any, ...]]) -> bytes:
        from psycopg.adapt import Transformer

        self._flush()
        literal = Transformer(conn).as_literal
        # Backslashes in an array literal's text must reach the array parser as written,
        # and its text is encoded here.
        arrays = (
            conn.info.parameter_status("standard_conforming_strings") == "on"
            and conn.info.encoding == "utf-8"
        )
        out: list[bytes] = []
        for statement, args in self._statements:
            if statement is None:
                sql, rows = args
                unnested = unnest_insert(sql, rows) if arrays else None
                if unnested is not None:
                    out += (unnested, b"; ")
                    continue
                pieces = _pieces(_multi_row(sql, len(rows)))
                args = [value for row in rows for value in row]
            else:
                pieces = statement
            if len(pieces) != len(args) + 1:
                raise LedgerError(f"{len(args)} values for {b'?'.join(pieces).decode()}")
            out.append(pieces[0])
            for value, piece in zip(args, pieces[1:], strict=True):
                out.append(_SEQ_SQL % value if type(value) is SeqOffset else literal(value))
                out.append(piece)
            out.append(b"; ")
        return b"".join(out)

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        for sql, rows in pending.items():
            self.add_rows(sql, list(rows.values()))


class PostgresLedger(LedgerPort):
    """The PostgreSQL backend: a ledger any number of daemons share."""

    cluster = True
    _COMPLETED_IS_NULL = "(data::json ->> 'completed') IS NULL"

    def __init__(
        self,
        dsn: str,
        *,
        lease_seconds: float = 10.0,
        post_delay: float = 0.002,
        read_only: bool = False,
    ) -> None:
        super().__init__(post_delay=post_delay, read_only=read_only)
        self.dsn = check_dsn(dsn)
        self._application = _application_name(dsn)
        self.where = self.location = describe_dsn(dsn)
        self.lease_seconds = lease_seconds
        # Who this daemon is in the leases table: unique per process start.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._held: dict[str, int] = {}  # session_id -> epoch, the leases this daemon holds
        # Sessions whose input no daemon has claimed, each with when this daemon's scan
        # first saw it so (``_keep_leases``): past a lease's time, taken whatever the load.
        self._unclaimed: dict[str, float] = {}
        # Input on a free lease that the last orphan scan saw waiting, (session_id, its
        # first seq): taken if the next scan sees it still waiting (``_orphans_now``).
        self._seen_waiting: set[tuple[str, int]] = set()
        # Leases the writer's last transaction took with prompts: session -> (epoch, the
        # previous owner, the claim's reads), for ``_after_commit``.
        self._claimed_now: dict[str, tuple[int, str | None, tuple[Any, ...] | None]] = {}
        # What those claims read, for the session's actor (``take_claim_reads``), with
        # the epoch and the count of the session's fenced writes settled by then.
        self._prompt_claims: dict[str, tuple[int, ClaimReads, int]] = {}
        self._fenced_settled: dict[str, int] = {}  # per session, fenced writes settled
        # Claims, releases and renewals share one connection from several worker threads:
        # one transaction at a time on it.
        self._control_lock = threading.Lock()
        self._read = self._connect()
        try:
            self.schema = str(self._read.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
            self.channel = f"harness_events_{zlib.crc32(self.schema.encode()):08x}"
            self._append_key = _lock_key(self.schema, "append")
            if read_only:
                self._check_version()
            else:
                self._migrate()
            self._write = self._connect()
            self._control = self._connect()
            self.live = self._live = LiveRelay(self.schema, lease_seconds, self._connect_raw)
        except BaseException:
            self._read.close()
            raise
        self._tail_send, self._tail_receive = trio.open_memory_channel[
            list[Event] | str | None
        ](1024)
        self._tail_done = trio.Event()
        self._wake_queued = False
        # Other daemons' commits heard of (NOTIFY) holding nothing this daemon acts on:
        # first seq -> last. With no subscriber, the tail moves over them unread
        # (``_skip_quiet``), and needs no read while it has reached every seq heard of
        # (``_heard``) and nothing was missed (``_read_due``: a LISTEN remade, a notice
        # not understood).
        self._quiet: dict[int, int] = {}
        self._heard = 0
        self._read_due = True
        self._tail_read: psycopg.Connection[tuple[Any, ...]] | None = None  # made by the tail
        # Seqs this daemon's writer committed (or is committing, the append lock held)
        # that the tail has not published yet: read back from the log, they are this
        # daemon's own, not input from another daemon to hand over (``_catch_up``).
        self._own_seqs: set[int] = set()
        # Set while a commit of the writer is in flight: one of one round trip learns
        # its seqs only from its answer, so the tail, whose read may have seen them
        # already, waits for it before it tells its own events from the others'.
        self._committing: trio.Event | None = None
        self._known_seq = 0  # a seq known committed: below any commit sent from now on
        self._stored_blobs: set[str] = set()  # digests known stored (``_stored``)
        # A batch whose connection was lost around its commit and whose landing is not
        # known yet (the server was away): looked up before it is sent again.
        self._unresolved: tuple[list[WriteEvents], _Attempt] | None = None
        self.commits_in_one = 0  # commits made in one round trip, and in two (counted)
        self.commits_in_two = 0
        # The hot reads of the event loop (a step's, a turn's): a few connections driven
        # non-blocking from the loop, one query at a time each, made as needed. The idle
        # ones, and how many reads may be in flight.
        self._loop_readers: list[psycopg.Connection[tuple[Any, ...]]] = []
        self._loop_reader_slots = trio.Semaphore(LOOP_READERS)
        self.read_spin = READ_SPIN_SECONDS
        self.driven_reads = self._round_trip() >= DRIVEN_READS_FROM_SECONDS

    # --- connections ---------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        try:
            return psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=10, application_name=self._application
            )
        except psycopg.Error as error:
            raise LedgerError(
                f"cannot reach the ledger database {self.where}: {_first_line(error)}"
            ) from None

    def _version(self, conn: psycopg.Connection[tuple[Any, ...]]) -> int:
        exists = conn.execute("SELECT to_regclass('harness_schema') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return 0
        row = conn.execute("SELECT version FROM harness_schema").fetchone()
        return int(row[0]) if row else 0

    def _check_version(self) -> None:
        version = self._version(self._read)
        if version != PG_SCHEMA_VERSION:
            fix = (
                "upgrade harness"
                if version > PG_SCHEMA_VERSION
                else "run `harness ledger migrate`"
            )
            raise LedgerError(
                f"the ledger database {self.where} has schema version {version} and this "
                f"harness reads {PG_SCHEMA_VERSION}: {fix}"
            )

    def _migrate(self) -> int:
        """Bring the schema up to date, once even when several daemons start together."""
        conn = self._read
        import psycopg

        try:
            with conn.transaction():
                key = _lock_key(self.schema, "migrate")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                conn.execute("CREATE TABLE IF NOT EXISTS harness_schema (version INTEGER NOT NULL)")
                version = self._version(conn)
                if version > PG_SCHEMA_VERSION:
                    raise LedgerError(
                        f"the ledger database {self.where} has schema version {version}, newer "
                        f"than this harness knows ({PG_SCHEMA_VERSION}); upgrade harness"
                    )
                for index in range(version, PG_SCHEMA_VERSION):
                    for statement in PG_MIGRATIONS[index]:
                        conn.execute(statement)
                conn.execute("DELETE FROM harness_schema")
                conn.execute(
                    "INSERT INTO harness_schema(version) VALUES (%s)", (PG_SCHEMA_VERSION,)
                )
        except psycopg.Error as error:
            raise LedgerError(
                f"cannot migrate the ledger database {self.where}: {_first_line(error)}"
            ) from None
        if version < PG_SCHEMA_VERSION:
            log.info("ledger migrated", database=self.where, version=PG_SCHEMA_VERSION)
        return PG_SCHEMA_VERSION - version

    def close(self) -> None:
        self.close_writer()
        for name in ("_read", "_write", "_control", "_tail_read"):
            conn = getattr(self, name, None)
            if conn is not None:
                conn.close()
        for conn in self._loop_readers:
            conn.close()

    def _retrying(self, name: str, work: Callable[[psycopg.Connection[tuple[Any, ...]]], T]) -> T:
        """Run ``work`` on connection ``name``, re-made once if the server dropped it."""
        import psycopg

        with self._control_lock if name == "_control" else contextlib.nullcontext():
            conn: psycopg.Connection[tuple[Any, ...]] = getattr(self, name)
            try:
                return work(conn)
            except psycopg.OperationalError:
                if not conn.closed and not conn.broken:
                    raise
            setattr(self, name, self._connect())
            return work(getattr(self, name))

    # --- reading ---------------------------------------------------------------------------

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            return self._retrying("_read", lambda conn: conn.execute(_pg(sql), args).fetchall())
        except psycopg.OperationalError as error:
            raise LedgerError(
                f"the ledger database {self.where} cannot be read: {_first_line(error)}"
            ) from None

    def _round_trip(self) -> float:
        """The read connection's round trip to the server now: the median of five."""
        import psycopg

        times = []
        try:
            for _ in range(5):
                start = time.perf_counter()
                self._read.execute("SELECT 1", prepare=False).fetchall()
                times.append(time.perf_counter() - start)
        except psycopg.Error:
            return 0.0  # reads will say what is wrong
        return sorted(times)[2]

    async def _rows_async(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One read on a loop reader connection; the loop is not held for a slow answer.

        Only for a database whose round trip is ``DRIVEN_READS_FROM_SECONDS`` or more
        (``driven_reads``, measured when the ledger opens); a closer one is read
        blocking, on the read connection, which costs less.

        psycopg's own execution generator is driven here with Trio's waits on the
        connection's socket, as its ``AsyncCursor`` drives it with asyncio's (which fails
        under Trio). A blocking read held the loop for as long as the server took; a read
        in a worker thread cost ~1 ms more CPU per step (measured, issue 18). An answer
        within ``read_spin`` is taken at once, as a blocking read would: on a busy loop a
        scheduler round (what waiting with Trio costs) is 1-3 ms, a local answer 0.1 ms
        (benchmarks/pg_reads.py). A dropped connection is made again once; a read cut
        off (cancelled) closes its connection, since its query may still be in flight.
        """
        import psycopg

        if not self.driven_reads:
            return self._rows(sql, args)  # the database is close: blocking is cheaper
        slots = self._loop_reader_slots
        try:
            slots.acquire_nowait()  # not ``async with``: its checkpoint costs a round
        except trio.WouldBlock:
            # Every loop reader is busy: read as before, blocking. Waiting for a slot
            # queued a busy loop's reads behind each other, a scheduler round each, and
            # throttled the steps of a saturated daemon (its prompts took 2.5 x longer).
            return self._rows(sql, args)
        try:
            conn = self._loop_readers.pop() if self._loop_readers else None
            try:
                for attempt in (1, 2):
                    try:
                        if conn is None or conn.closed or conn.broken:
                            conn = await trio.to_thread.run_sync(self._connect_raw)
                        return await _fetch_nonblocking(conn, _pg(sql), args, self.read_spin)
                    except psycopg.OperationalError as error:
                        if attempt == 2 or (conn is not None and not (conn.closed or conn.broken)):
                            raise LedgerError(
                                f"the ledger database {self.where} cannot be read: "
                                f"{_first_line(error)}"
                            ) from None
                    except BaseException:
                        if conn is not None and conn.pgconn.transaction_status != 0:  # not IDLE
                            conn.close()  # cancelled mid-query: never reuse it half-read
                        raise
                raise AssertionError("unreachable")
            finally:
                if conn is not None and not (conn.closed or conn.broken):
                    self._loop_readers.append(conn)
        finally:
            slots.release()

    # --- writing ---------------------------------------------------------------------------

    async def _run_commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """Commit, waiting out a lost connection with backoff for ``RECONNECT_SECONDS``."""
        import psycopg

        delay, waited = 0.1, 0.0
        while True:
            committing = self._committing = trio.Event()
            try:
                return await on_worker_thread(lambda: self._commit(batch))
            except psycopg.OperationalError as error:
                if waited >= RECONNECT_SECONDS:
                    raise
                log.warning(
                    "ledger database unreachable, retrying",
                    database=self.where,
                    error=_first_line(error),
                    retry_in=delay,
                )
                await trio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 5.0)
            finally:
                self._committing = None
                committing.set()

    def _commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        import psycopg

        conn = self._write
        if conn.closed or conn.broken:
            conn = self._write = self._connect_raw()
        unresolved, self._unresolved = self._unresolved, None
        pending = unresolved[1] if unresolved is not None and unresolved[0] is batch else None
        while True:
            if pending is not None:
                try:
                    landed = self._landed(conn, pending)
                except psycopg.OperationalError:
                    self._unresolved = (batch, pending)
                    raise
                if landed is not None:
                    return landed
            attempt = _Attempt()
            try:
                return self._append(conn, batch, attempt)
            except psycopg.OperationalError:
                if attempt.first is None or not (conn.closed or conn.broken):
                    raise  # nothing was sent, or the server refused: safe to send again
            # The connection died around the commit: whether it landed is found out
            # before anything is sent again, here or at the writer's next try (the
            # server may be away a while), so an event is never written twice.
            self._unresolved = (batch, attempt)
            conn = self._write = self._connect_raw()
            self._unresolved = None
            pending = attempt

    def _landed(
        self, conn: psycopg.Connection[tuple[Any, ...]], attempt: _Attempt
    ) -> list[list[Event] | LedgerRefused] | None:
        """An append's results if it was committed (its connection was lost around the
        commit), else None."""
        assert attempt.first is not None
        seq, ts, session_id, kind = attempt.first
        if attempt.landed is not None:
            # Sent in one round trip, its seqs not yet known: its first event is the
            # first after ``attempt.after`` that matches.
            found = conn.execute(
                "SELECT seq FROM events WHERE seq > %s AND ts = %s AND session_id = %s"
                " AND type = %s ORDER BY seq LIMIT 1",
                (attempt.after, ts, session_id, kind),
            ).fetchone()
            return None if found is None else attempt.landed(conn, int(found[0]) - 1)
        row = conn.execute(
            "SELECT ts, session_id, type FROM events WHERE seq = %s", (seq,)
        ).fetchone()
        if row is not None and (float(row[0]), row[1], row[2]) == (ts, session_id, kind):
            return attempt.result
        return None

    def _connect_raw(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A new connection for a worker thread; psycopg's error if the server is away."""
        import psycopg

        return psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=10, application_name=self._application
        )

    def _append(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        batch: list[WriteEvents],
        attempt: _Attempt,
    ) -> list[list[Event] | LedgerRefused]:
        """Append a batch in one round trip, or, if what that assumes does not hold (a
        fence, a session, a claim's change of hands: rare), in two."""
        # Prompts whose lease this transaction takes, if free: not one this daemon holds
        # (nor gives back in this batch: ``_held`` is left before the release is posted).
        releasing = {r.fence[0] for r in batch if r.release and r.fence is not None}
        held = self._held  # changed by the event loop meanwhile: looked up, not iterated
        claims = sorted(
            {
                r.exists
                for r in batch
                if r.claim and r.exists is not None
                and r.exists not in releasing and r.exists not in held
            }
        )  # fmt: skip
        required = _sessions_to_find(batch)
        if required is not None:
            try:
                result = self._append_in_one(conn, batch, attempt, claims, required)
            except _Assumed as why:
                log.debug("commit made in two round trips", reason=str(why))
                attempt.reset()
            else:
                self.commits_in_one += 1
                return result
        self.commits_in_two += 1
        return self._append_in_two(conn, batch, attempt, claims, rollback=required is not None)

    def _append_in_one(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        batch: list[WriteEvents],
        attempt: _Attempt,
        claims: list[str],
        required: list[str],
    ) -> list[list[Event] | LedgerRefused]:
        """Append a batch in one call and one round trip, whatever its size: BEGIN, the
        append lock, the checks, ``max(seq)``, every insert, the projections, the
        NOTIFY, the COMMIT and the prompts' claims' reads, as one simple query.

        Sent before anything is read, it assumes every fence holds, every session it
        needs exists and no prompt's claim takes a lease from another daemon. Each is
        checked under the lock by a statement that, finding one untrue, aborts the
        transaction with its own SQLSTATE (``_REFUSALS``): nothing is written, and
        ``_Assumed`` tells ``_append`` to decide request by request in two round trips.
        The seqs are numbered in SQL from ``max(seq)`` (``SeqOffset``); the results, once
        its answer gives that number. Under load, each round trip of the writer waited
        for a PostgreSQL backend and the worker thread to be scheduled again, on every
        step's critical path (issue 18).
        """
        import psycopg

        now = time.time()
        owner = self.owner
        writes = _Statements()
        writes.add("BEGIN", ())
        fenced = sorted({request.fence for request in batch if request.fence is not None})
        sessions = [session_id for session_id, _ in fenced]
        epochs = [epoch for _, epoch in fenced]
        base_at = writes.add(
            _BEGIN_IN_ONE, (self._append_key, sessions, epochs, owner, required)
        )
        lease = self.lease_seconds
        claim_at: dict[str, int] = {}
        for session_id in claims:
            claim_at[session_id] = writes.add(
                _CLAIM_WITH_PROMPT_IN_ONE, (session_id, owner, lease, session_id, session_id,
                                            owner, owner, lease, owner, owner)
            )  # fmt: skip
        stored_blobs = self._stored_blobs
        sent: list[str] = []
        offset = 0
        rows: list[tuple[Any, ...]] = []
        made: list[list[tuple[int, Any, str, dict[str, Any]]]] = []
        for request in batch:
            if request.release and request.fence is not None:
                writes.add(_RELEASE_IN_BATCH, (*request.fence, owner))
            for digest, data in request.blobs:
                if digest not in stored_blobs and digest not in sent:
                    sent.append(digest)
                    writes.add(_BLOB_INSERT, (digest, len(data), zlib.compress(data, 1)))
            events: list[tuple[int, Any, str, dict[str, Any]]] = []
            for new in request.events:
                stored, text = stored_text(new.data)
                offset += 1
                seq = SeqOffset(offset)
                rows.append((seq, now, new.session_id, new.type, text))
                project = PROJECTIONS.get(new.type)
                if project is not None:
                    project(writes.execute, seq, stored, text)
                events.append((offset, new.type, new.session_id, stored))
            made.append(events)
        if rows:
            writes.add_rows(_EVENT_INSERT, rows)
            # Delivered by the server at commit, as in two round trips (``_append_in_two``).
            handed = any(row[3] in _HANDED_OVER_TYPES for row in rows)
            notice = (self.channel, SeqOffset(1), SeqOffset(offset), "!" if handed else "")
            writes.add(_NOTIFY_IN_ONE, notice)
        writes.add("COMMIT", ())
        reads_at: dict[str, list[int]] = {}
        for session_id in claims:
            # After the commit, not under the append lock, as in two round trips; read
            # for every claim sent, kept for those that took their lease.
            positions = reads_at[session_id] = []
            for sql, count in _CLAIM_READS:
                positions.append(writes.add(sql, (session_id,) * count))

        def landed(
            conn: psycopg.Connection[tuple[Any, ...]], base: int
        ) -> list[list[Event] | LedgerRefused]:
            """The results of this commit, found committed after a lost connection: which
            prompts' claims took their lease is read again (their reads are not)."""
            self._numbered(made, now, base, offset, attempt)
            if claims:
                taken = conn.execute(
                    "SELECT session_id, epoch FROM leases WHERE session_id = ANY(%s)"
                    " AND owner = %s AND expires > extract(epoch FROM clock_timestamp())",
                    (claims, owner),
                ).fetchall()
                self._claimed_now = {row[0]: (int(row[1]), None, None) for row in taken}
            return attempt.result

        attempt.after = self._known_seq
        if rows:
            attempt.first = (0, now, rows[0][2], rows[0][3])
        attempt.landed = landed
        cursor = conn.cursor()
        try:
            cursor.execute(writes.query(conn), prepare=False)
            sets = _result_sets(cursor)
        except psycopg.Error as error:
            if error.sqlstate in _REFUSALS and not (conn.closed or conn.broken):
                # The transaction is aborted: ``_append_in_two`` rolls it back first.
                raise _Assumed(_REFUSALS[str(error.sqlstate)]) from None
            if not (conn.closed or conn.broken):
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")  # a statement failed: the rest was skipped
            raise
        finally:
            cursor.close()
        self._numbered(made, now, int(sets[base_at][0][0]), offset, attempt)
        self._stored(sent)
        claimed_now: dict[str, tuple[int, str | None, tuple[Any, ...] | None]] = {}
        for session_id, position in claim_at.items():
            if sets[position]:  # taken: free, lapsed or this daemon's (else refused)
                reads = tuple(sets[i] for i in reads_at[session_id])
                claimed_now[session_id] = (int(sets[position][0][0]), None, reads)
        self._claimed_now = claimed_now
        return attempt.result

    def _numbered(
        self,
        made: list[list[tuple[int, Any, str, dict[str, Any]]]],
        now: float,
        base: int,
        count: int,
        attempt: _Attempt,
    ) -> None:
        """A commit of one round trip's results, its seqs after ``base``: this daemon's
        own for the tail from now on (the tail waits for them: ``_committing``)."""
        attempt.result[:] = [
            [Event(base + offset, now, kind, session_id, data)
             for offset, kind, session_id, data in events]
            for events in made
        ]  # fmt: skip
        if count:
            self._own_seqs.update(range(base + 1, base + count + 1))
        self._known_seq = max(self._known_seq, base + count)

    def _stored(self, digests: Sequence[str]) -> None:
        """Blobs known stored: a later commit does not send them again."""
        if len(self._stored_blobs) + len(digests) > _KNOWN_BLOBS:
            self._stored_blobs.clear()
        self._stored_blobs.update(digests)

    def _append_in_two(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        batch: list[WriteEvents],
        attempt: _Attempt,
        claims: list[str],
        rollback: bool,
    ) -> list[list[Event] | LedgerRefused]:
        """Append a batch in two calls and two round trips, whatever its size, deciding
        each request on what the first reads (``rollback``: after an aborted one).

        The first sends BEGIN, the advisory lock, the fence check, the blobs already
        stored and ``max(seq)``, each a statement of its own (so ``max`` is read once
        the lock is held); the second, every insert, the projections, the NOTIFY and the
        COMMIT. One call per statement cost the writer ~50 µs of CPU each, a dozen a
        step, and a worker thread must win the GIL back from the event loop at each
        round trip.
        """
        import psycopg

        now = time.time()
        out = attempt.result
        fences = sorted({request.fence[0] for request in batch if request.fence is not None})
        digests = [digest for request in batch for digest, _ in request.blobs]
        required = sorted({request.exists for request in batch if request.exists is not None})
        cursor = conn.cursor()
        owned = range(0)  # the seqs this append numbers, once it sends its commit
        try:
            head = _Statements()
            if rollback:
                head.add("ROLLBACK", ())
            head.add("BEGIN", ())
            head.add("SELECT pg_advisory_xact_lock(?)", (self._append_key,))
            if fences:
                # Share-locked until the commit: a claim cannot slip in between this
                # check and the append (it skips a locked row and tries again later).
                head.add(
                    "SELECT session_id, owner, epoch FROM leases"
                    " WHERE session_id = ANY(?) FOR SHARE",
                    (fences,),
                )
            if required:
                # Under the append lock: a deletion is an append too, so none lands
                # between this look and the commit.
                head.add("SELECT id FROM sessions WHERE id = ANY(?)", (required,))
            owner, lease = self.owner, self.lease_seconds
            for session_id in claims:
                head.add(_CLAIM_WITH_PROMPT, (session_id, owner, lease, session_id,
                                              session_id, owner, owner, lease, owner))  # fmt: skip
            if digests:
                head.add("SELECT hash FROM blobs WHERE hash = ANY(?)", (digests,))
            head.add("SELECT coalesce(max(seq), 0) FROM events", ())
            # Without values, psycopg sends a simple query: several statements, never
            # prepared (its text holds the values).
            cursor.execute(head.query(conn), prepare=False)
            results = _result_sets(cursor)[2 + rollback :]  # after BEGIN and the lock
            seq = int(results.pop()[0][0])
            current = {row[0]: (row[1], int(row[2])) for row in results.pop(0)} if fences else {}
            present = {row[0] for row in results.pop(0)} if required else set()
            # Each prompt's claim: (epoch, previous owner) when it took the lease.
            taken: dict[str, tuple[int, str]] = {}
            for session_id in claims:
                claimed = results.pop(0)
                if claimed:
                    taken[session_id] = (int(claimed[0][0]), str(claimed[0][1]))
            claimed_now: dict[str, tuple[int, str | None, list[int]]] = {}
            known = {row[0] for row in results.pop(0)} if digests else set()
            self._stored(list(known))
            rows: list[tuple[Any, ...]] = []
            writes = _Statements()
            for request in batch:
                if request.exists is not None and request.exists not in present:
                    out.append(LedgerMissing(f"no session {request.exists}"))
                    if request.exists in taken:
                        # Deleted earlier in this batch: its lease goes back at once.
                        epoch = taken.pop(request.exists)[0]
                        writes.add(
                            "UPDATE leases SET expires = 0"
                            " WHERE session_id = ? AND epoch = ? AND owner = ?",
                            (request.exists, epoch, owner),
                        )
                    continue
                if request.fence is not None:
                    session_id, epoch = request.fence
                    if current.get(session_id, (self.owner, epoch)) != (self.owner, epoch):
                        out.append(
                            LedgerFenced(
                                f"session {session_id}: its lease (epoch "
                                f"{epoch}) was taken by another daemon"
                            )
                        )
                        continue
                if request.release and request.fence is not None:
                    writes.add(
                        "UPDATE leases SET expires = 0"
                        " WHERE session_id = ? AND epoch = ? AND owner = ?",
                        (*request.fence, self.owner),
                    )
                for digest, data in request.blobs:
                    if digest not in known:
                        known.add(digest)
                        writes.add(
                            "INSERT INTO blobs(hash, size, data) VALUES (?, ?, ?)"
                            " ON CONFLICT DO NOTHING",
                            (digest, len(data), zlib.compress(data, 1)),
                        )
                events: list[Event] = []
                extra: list[NewEvent] = []
                if request.claim and request.exists in taken:
                    session_id = request.exists
                    epoch, previous = taken.pop(session_id)
                    other = previous if previous and previous != owner else None
                    claimed_now[session_id] = (epoch, other, [])
                    if other is not None:  # the change of hands, in the same commit
                        leased = {"session_id": session_id, "owner": owner, "epoch": epoch,
                                  "from": other}  # fmt: skip
                        extra.append(NewEvent("session.leased", session_id, leased))
                for new in (*request.events, *extra):
                    if new.type == "session.created":
                        present.add(new.session_id)  # a later request of the batch sees it
                    elif new.type == "session.deleted":
                        present.discard(new.session_id)
                    stored, text = stored_text(new.data)
                    seq += 1
                    rows.append((seq, now, new.session_id, new.type, text))
                    project = PROJECTIONS.get(new.type)
                    if project is not None:
                        project(writes.execute, seq, stored, text)
                    events.append(Event(seq, now, new.type, new.session_id, stored))
                out.append(events)
            if rows:
                first = rows[0]
                attempt.first = (first[0], first[1], first[2], first[3])
                # One statement for the batch's events (their seqs are distinct).
                writes.add_rows(_EVENT_INSERT, rows)
            if rows:
                # Delivered by the server at commit: a wake-up for every daemon's tail,
                # with the seqs and whether any of them is of a type a daemon acts on
                # (``!``): a tail with no subscriber moves over the others (``_quiet``).
                handed = any(row[3] in _HANDED_OVER_TYPES for row in rows)
                notice = f"{rows[0][0]}-{seq}{'!' if handed else ''}"
                writes.add("SELECT pg_notify(?, ?)", (self.channel, notice))
            writes.add("COMMIT", ())
            for session_id, (_, _, positions) in claimed_now.items():
                # What the session's actor reads once it holds the lease, in the same
                # round trip, each read in a transaction of its own after the commit:
                # not under the append lock, which every daemon's commits wait for.
                for sql, count in _CLAIM_READS:
                    positions.append(writes.add(sql, (session_id,) * count))
            if rows:
                # Before the commit, while the lock keeps every other daemon from these
                # seqs: the tail may read them back before this thread returns.
                owned = range(rows[0][0], rows[-1][0] + 1)
                self._own_seqs.update(owned)
            cursor.execute(writes.query(conn), prepare=False)
            self._stored(digests)
            self._known_seq = max(self._known_seq, seq)
            if claimed_now:
                sets = _result_sets(cursor)
                self._claimed_now = {
                    session_id: (epoch, previous, tuple(sets[i] for i in positions))
                    for session_id, (epoch, previous, positions) in claimed_now.items()
                }
        except BaseException:
            # Not committed, or not known to be (a connection lost around the commit):
            # forgotten at once (before a ROLLBACK lets the lock go), so that another
            # daemon's events at these seqs are not taken for this one's.
            self._own_seqs.difference_update(owned)
            if not (conn.closed or conn.broken):
                # A statement failed (the rest of the text was skipped): end the
                # transaction, so the connection can serve the next batch.
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
        finally:
            cursor.close()
        return out

    async def _published(
        self, events: list[Event], feed: trio.MemorySendChannel[FeedMessage] | None
    ) -> None:
        # In seq order with the other daemons' events: the tail publishes.
        with contextlib.suppress(trio.BrokenResourceError):  # it ended: shutting down
            await self._tail_send.send(events)

    # --- the feed across daemons -------------------------------------------------------------

    async def run_writer(
        self,
        feed: trio.MemorySendChannel[FeedMessage] | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The writer, with the tail that feeds every daemon's events in seq order, the
        listener that wakes it, and the keeper of this daemon's leases."""
        start = self.last_seq()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tail, feed, start)
            nursery.start_soon(self._listen)
            nursery.start_soon(self._keep_leases)
            nursery.start_soon(self._live.run, feed)
            try:
                await LedgerPort.run_writer(self, feed, task_status=task_status)
            finally:
                with trio.CancelScope(shield=True):
                    await self._release_all()
                    with contextlib.suppress(trio.BrokenResourceError):
                        await self._tail_send.send(_END)  # the tail publishes the rest, ends
                    await self._tail_done.wait()
                nursery.cancel_scope.cancel()

    async def _tail(self, feed: trio.MemorySendChannel[FeedMessage] | None, start: int) -> None:
        """Publish committed events in seq order: this daemon's batches as they commit,
        and, at each wake-up (``None``, from the listener or the poll), whatever the
        other daemons committed, read from the log after the last seq published."""
        cursor = start
        try:
            async with self._tail_receive:
                while True:
                    item: list[Event] | str | None = _POLL
                    with trio.move_on_after(_POLL_SECONDS):
                        item = await self._tail_receive.receive()
                    if item is None:
                        self._wake_queued = False  # taken: commits from now on wake again
                        if self._filtering():
                            cursor = self._skip_quiet(cursor)
                            if cursor >= self._heard and not self._read_due:
                                continue  # every commit heard of is one it may skip
                    if isinstance(item, list) and item:
                        last, first = item[-1].seq or 0, item[0].seq or 0
                        if last <= cursor:
                            continue  # read from the log already
                        if first != cursor + 1 and self._filtering():
                            cursor = self._skip_quiet(cursor)
                        if first == cursor + 1:
                            cursor = last  # nothing of another daemon's lies between
                            self._own_seqs.difference_update(range(first, last + 1))
                            await self._publish(feed, item, theirs=[])
                            continue
                    cursor = await self._catch_up(feed, cursor)
                    if item == _END:
                        return
        finally:
            self._tail_done.set()

    def _skip_quiet(self, cursor: int) -> int:
        """The tail's cursor moved over the other daemons' commits that follow it and
        hold nothing this daemon acts on (``_quiet``), as a filtered read of them would
        move it, without the read. Only while the feed has no subscriber
        (``_filtering``): those commits were heard of, so made, before any subscriber
        that registers from now on (see ``_filtering``)."""
        quiet = self._quiet
        while (last := quiet.pop(cursor + 1, None)) is not None:
            cursor = last
        if len(quiet) > _TAIL_CHUNK:  # left behind by reads that went past them
            for first in [first for first in quiet if first <= cursor]:
                del quiet[first]
        return cursor

    def _heard_of(self, notice: str) -> None:
        """Another daemon's commit notice, ``first-last`` with ``!`` when it holds events
        of a type this daemon acts on; anything else makes the next wake read."""
        handed = notice.endswith("!")
        first, dash, last = notice.rstrip("!").partition("-")
        if not (dash and first.isdigit() and last.isdigit()):
            self._read_due = True
            return
        self._heard = max(self._heard, int(last))
        if not handed:
            if len(self._quiet) >= 4 * _TAIL_CHUNK:
                self._quiet.clear()  # kept while a subscriber reads all: those are read
            self._quiet[int(first)] = int(last)

    async def _catch_up(
        self, feed: trio.MemorySendChannel[FeedMessage] | None, cursor: int
    ) -> int:
        self._read_due = False  # this read covers whatever was missed until now
        while True:
            filtered = self._filtering()
            try:
                # One read at a time, never cancelled mid-way (as the writer's commits):
                # a cached worker thread, without ``to_thread``'s bookkeeping and its
                # naming of the thread at each call (three system calls).
                read = functools.partial(self._read_log, cursor, filtered)
                events, last = await on_worker_thread(read)
            except LedgerError as error:
                log.warning("the feed cannot read the ledger", error=str(error))
                return cursor
            if filtered and not self._filtering():
                # A subscriber came while the read ran: its replay's snapshot may be older
                # than what was left out. Read the same seqs again, in full.
                continue
            if last <= cursor:
                return cursor
            committing = self._committing
            if committing is not None:
                await committing.wait()  # its seqs may be among these: known once done
            self._known_seq = max(self._known_seq, last)
            own = self._own_seqs
            theirs = [event for event in events if event.seq not in own]
            own.difference_update(range(cursor + 1, last + 1))
            whole = last < cursor + _TAIL_CHUNK  # all that was committed when it read
            cursor = last
            if events:
                await self._publish(feed, events, theirs=theirs)
            if whole:
                # Seqs are gapless and committed in order: a read short of its chunk saw
                # everything. Read again, it found nothing, once a catch-up (issue 18);
                # what commits from now on wakes the tail again.
                return cursor

    def _filtering(self) -> bool:
        """Whether the tail may leave out what only a subscriber would hear: this
        daemon's feed has none now (``ClusterHooks.subscribers``).

        Without a subscriber to hear them, a daemon read, decoded and published every
        event the others commit: O(daemons) work per step (issue 18). No subscriber
        misses anything: a read that left events out is used only if the feed had no
        subscriber when it returned, so all it left out (this daemon's own events read
        back from the log included) was committed before any subscriber there now
        registered, hence before its replay's snapshot, its prompt, or its child's input.
        """
        hooks = self.hooks
        return hooks is not None and hooks.subscribers is not None and hooks.subscribers() == 0

    def _read_log(self, after: int, filtered: bool = False) -> tuple[list[Event], int]:
        """The events after seq ``after``, decoded, on the tail's own connection, and the
        last seq read: with ``filtered``, only those of the ``_HANDED_OVER`` types (the
        last seq read counts the others).

        In a worker thread: a daemon follows every other daemon's commits, and the event
        loop must not wait on the database (nor decode) while it does. A dropped
        connection is made again once.
        """
        import psycopg

        def read() -> list[tuple[Any, ...]]:
            conn = self._tail_read
            if conn is None or conn.closed or conn.broken:
                conn = self._tail_read = self._connect_raw()
            if filtered:
                args = (after, after, _HANDED_OVER, after, after)
                return conn.execute(_FILTERED_READ, args).fetchall()
            return conn.execute(_FULL_READ, (after,)).fetchall()

        try:
            try:
                rows = read()
            except psycopg.OperationalError:
                if self._tail_read is not None and not self._tail_read.broken:
                    raise
                rows = read()
        except psycopg.OperationalError as error:
            raise LedgerError(
                f"the ledger database {self.where} cannot be read: {_first_line(error)}"
            ) from None
        last = after
        if filtered:
            # The row typed NULL: the highest seq read, NULL when there was none.
            last = next(row[0] for row in rows if row[2] is None) or after
            rows = [row for row in rows if row[2] is not None]
        elif rows:
            last = rows[-1][0]
        return [Event(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows], last

    async def _publish(
        self,
        feed: trio.MemorySendChannel[FeedMessage] | None,
        events: list[Event],
        *,
        theirs: list[Event],
    ) -> None:
        """Publish ``events`` in order; ``theirs``, those of them other daemons committed,
        are what this daemon also acts on (input, replies, cancels, new children)."""
        if theirs:
            self._saw_inbox(theirs)  # before the wake below: the woken actor reads the inbox
        if feed is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                if theirs:
                    await self._register_children(feed, theirs)
                await feed.send(Publish(events))
        if theirs and self.hooks is not None:
            self._hand_over(theirs)

    @staticmethod
    async def _register_children(
        feed: trio.MemorySendChannel[FeedMessage], events: list[Event]
    ) -> None:
        """A child session another daemon made belongs to its parent's tree here too, so
        that a subscriber to the parent hears the child's events (before they come)."""
        for event in events:
            if event.type == "session.created" and event.data.get("parent_id"):
                await feed.send(RegisterChild(str(event.data["parent_id"]), event.session_id))

    def _hand_over(self, events: list[Event]) -> None:
        """What another daemon wrote that this one must act on, to the harness's hooks."""
        hooks = self.hooks
        assert hooks is not None
        for event in events:
            kind = event.type
            if kind == "inbox.added":
                hooks.wake(event.session_id)
            elif kind in ("permission.replied", "question.replied", "question.rejected"):
                if event.data.get("remote"):
                    if kind == "permission.replied":
                        hooks.replied(event.data)
                    else:
                        hooks.answered(kind, event.data)
            elif kind in ("cancel.requested", "session.deleted") and self.holds(event.session_id):
                hooks.cancel(event.session_id)  # a turn run here stops: cancelled, or gone

    async def _listen(self) -> None:
        """LISTEN on the channel; every notification wakes the tail. No thread: the
        connection's socket is waited on by Trio, and read when readable."""
        import psycopg

        delay = 0.1
        while True:
            try:
                conn = await trio.to_thread.run_sync(self._connect_raw)
            except psycopg.OperationalError as error:
                log.warning(
                    "ledger LISTEN cannot connect", error=_first_line(error), retry_in=delay
                )
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            try:
                conn.execute(f'LISTEN "{self.channel}"')
                self._live.listening(conn)
                self._read_due = True  # notices may have been missed meanwhile
                self._wake_tail()  # what was committed while we were away
                pgconn = conn.pgconn
                while True:
                    await trio.lowlevel.wait_readable(conn.fileno())
                    pgconn.consume_input()
                    woken = False
                    ours = self._write.pgconn.backend_pid
                    while (notify := pgconn.notifies()) is not None:
                        if self._live.heard(notify.relname.decode(), notify.extra.decode()):
                            continue  # live events, or who watches them (pg_live.py)
                        # A commit of this daemon's writer reaches the tail as it is: no
                        # need to read it back from the log.
                        if notify.be_pid != ours:
                            self._heard_of(notify.extra.decode())
                            woken = True
                    if woken:
                        self._wake_tail()
                    if pgconn.status != 0:  # CONNECTION_OK
                        raise psycopg.OperationalError("the LISTEN connection was lost")
            except psycopg.Error as error:
                log.warning("ledger LISTEN connection lost", error=_first_line(error))
            finally:
                conn.close()

    def _wake_tail(self) -> None:
        # One wake-up queued at a time: the tail reads everything committed up to when
        # it takes it, so more would each cost a read that finds nothing (one for each
        # commit of another daemon, under load).
        if self._wake_queued:
            return
        # WouldBlock: the tail is busy with this daemon's batches; Broken: it ended.
        with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
            self._tail_send.send_nowait(None)
            self._wake_queued = True

    def changes(self, session_id: str, after_seq: int) -> tuple[list[Message], list[Part], int]:
        """As ``LedgerPort.changes``, in one round trip instead of two (once a step)."""
        args = (session_id, after_seq, session_id, after_seq)
        return _changes(self._rows(_CHANGES, args), after_seq)

    async def changes_async(
        self, session_id: str, after_seq: int
    ) -> tuple[list[Message], list[Part], int]:
        """``changes``, the loop free while the server works (``_rows_async``)."""
        args = (session_id, after_seq, session_id, after_seq)
        return _changes(await self._rows_async(_CHANGES, args), after_seq)

    def open_asks(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Asks of turns in flight, neither replied to nor decided (on whichever daemon)."""
        rows = self._rows(
            "SELECT a.data FROM events a JOIN turns t ON t.session_id = a.session_id"
            " WHERE a.type = 'permission.asked' AND a.ts >= t.started"
            " AND (CAST(? AS TEXT) IS NULL OR a.session_id = ?)"
            " AND NOT EXISTS (SELECT 1 FROM events r WHERE r.session_id = a.session_id"
            " AND r.seq > a.seq AND r.type IN ('permission.replied', 'permission.decided')"
            " AND coalesce(r.data::json ->> 'id', r.data::json ->> 'request_id')"
            " = a.data::json ->> 'id') ORDER BY a.seq",
            (session_id, session_id),
        )
        return [json.loads(row[0]) for row in rows]

    def cancel_pending(self, session_id: str) -> bool:
        """A ``cancel.requested`` written since the session's turn last started: by seq,
        so that the clocks of the daemons involved do not matter."""
        rows = self._rows(
            "SELECT 1 FROM events WHERE session_id = ? AND type = 'cancel.requested'"
            " AND seq > (SELECT coalesce(max(seq), 0) FROM events WHERE session_id = ?"
            " AND type = 'turn.started') LIMIT 1",
            (session_id, session_id),
        )
        return bool(rows)

    def open_questions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Questions of turns in flight, neither answered nor dropped (on whichever daemon)."""
        rows = self._rows(
            "SELECT a.data FROM events a JOIN turns t ON t.session_id = a.session_id"
            " WHERE a.type = 'question.asked' AND a.ts >= t.started"
            " AND (CAST(? AS TEXT) IS NULL OR a.session_id = ?)"
            " AND NOT EXISTS (SELECT 1 FROM events r WHERE r.session_id = a.session_id"
            " AND r.seq > a.seq AND r.type IN ('question.replied', 'question.rejected')"
            " AND r.data::json ->> 'id' = a.data::json ->> 'id') ORDER BY a.seq",
            (session_id, session_id),
        )
        return [json.loads(row[0]) for row in rows]

    # --- leases (DESIGN §14) -----------------------------------------------------------------

    def holds(self, session_id: str) -> bool:
        return session_id in self._held

    def held_epoch(self, session_id: str) -> int | None:
        return self._held.get(session_id)

    async def claim(self, session_id: str) -> int | None:
        """Lease the session to this daemon; its epoch, or None while another holds it.

        A lease that lapsed (its holder died or was cut off) is taken with the next
        epoch, and the change of hands is recorded as ``session.leased``.
        """
        return (await self._claim(session_id, reads=False))[0]

    async def claim_with_reads(self, session_id: str) -> tuple[int | None, ClaimReads | None]:
        """``claim``, with the session's claimed turns, inbox, row, messages and parts
        read in the same round trip, after the lease was taken (a session actor's next
        reads)."""
        return await self._claim(session_id, reads=True)

    async def _claim(
        self, session_id: str, *, reads: bool
    ) -> tuple[int | None, ClaimReads | None]:
        mark = self.inbox_mark(session_id)  # before the inbox is read: later input moves it
        try:
            outcome = await trio.to_thread.run_sync(self._claim_sync, session_id, reads)
        except LedgerError as error:
            log.warning("lease claim failed", session_id=session_id, error=str(error))
            outcome = None
        if outcome is None:
            # The row was busy (another daemon's claim has it locked), yet this daemon
            # may hold the lease: taken over by its orphan scan while this claim ran.
            # Answering None then would leave a lease renewed here that no actor runs.
            return self._held.get(session_id), None
        epoch, previous, read = outcome
        claim_reads = None
        if read is not None:
            turns, inbox, session, history = read
            claim_reads = ClaimReads(
                mark,
                [(row[0], row[1], int(row[2])) for row in turns],
                [InboxItem.model_validate_json(row[0]) for row in inbox],
                Session.model_validate_json(session[0][0]) if session else None,
                _changes(history, 0),
            )
        self._held[session_id] = epoch
        if previous is not None and previous != self.owner:
            data = {"session_id": session_id, "owner": self.owner, "epoch": epoch, "from": previous}
            from harness.messages.events import NewEvent

            try:
                await self.write(
                    [NewEvent("session.leased", session_id, data)], fence=(session_id, epoch)
                )
            except LedgerError:
                self._held.pop(session_id, None)
                return None, None
            log.info("session taken over", session_id=session_id, epoch=epoch, previous=previous)
        return epoch, claim_reads

    def _claim_sync(self, session_id: str, reads: bool = False) -> _ClaimOutcome | None:
        """One round trip: the lease taken if missing, free or lapsed (``_CLAIM``), in
        one implicit transaction; five round trips before, each a wait on the control
        connection that every claim of this daemon shares. With ``reads``, the session's
        claimed turns, inbox, row, messages and parts follow in the same query: each
        statement sees what was committed before it began, the lease taken first."""
        import psycopg

        def work(conn: psycopg.Connection[tuple[Any, ...]]) -> _ClaimOutcome | None:
            # Assembled from the statements cut once at their placeholders, as a commit
            # is: psycopg's ClientCursor parsed the whole text again at every claim.
            statements = _Statements()
            owner, lease = self.owner, self.lease_seconds
            statements.add(_CLAIM, (session_id, owner, lease, session_id, owner, owner, lease,
                                    owner))  # fmt: skip
            if reads:
                for sql, count in _CLAIM_READS:
                    statements.add(sql, (session_id,) * count)
            with conn.cursor() as cursor:
                cursor.execute(statements.query(conn), prepare=False)
                sets = _result_sets(cursor)
            rows = sets[0]
            if not rows:
                return None  # another daemon's lease has not lapsed, or the row is busy
            epoch, previous = int(rows[0][0]), str(rows[0][1])
            read = tuple(sets[1:5]) if reads else None
            return epoch, (previous or None) if previous != owner else None, read

        try:
            return self._retrying("_control", work)
        except psycopg.Error as error:
            raise LedgerError(f"lease of {session_id}: {_first_line(error)}") from None

    def _settled(self, batch: list[WriteEvents]) -> None:
        super()._settled(batch)
        counts = self._fenced_settled
        for request in batch:
            if request.fence is not None:
                counts[request.fence[0]] = counts.get(request.fence[0], 0) + 1

    def _after_commit(self) -> None:
        """Hold the leases the batch's prompts took, and keep what their claims read for
        the sessions' actors, woken here (``take_claim_reads``)."""
        claimed, self._claimed_now = self._claimed_now, {}
        for session_id, (epoch, previous, read) in claimed.items():
            self._held[session_id] = epoch
            if previous is not None:
                log.info("session taken over", session_id=session_id, epoch=epoch,
                         previous=previous)  # fmt: skip
            if read is not None and not self._unsettled.get(session_id):
                # Else a write of the session may land after the reads: none kept (nor
                # when a lost connection lost them).
                turns, inbox, session, history = read
                reads = ClaimReads(
                    self.inbox_mark(session_id),  # the inbox was read after this batch's
                    [(row[0], row[1], int(row[2])) for row in turns],
                    [InboxItem.model_validate_json(row[0]) for row in inbox],
                    Session.model_validate_json(session[0][0]) if session else None,
                    _changes(history, 0),
                )
                settled = self._fenced_settled.get(session_id, 0)
                self._prompt_claims[session_id] = (epoch, reads, settled)

    def take_claim_reads(self, session_id: str) -> ClaimReads | None:
        kept = self._prompt_claims.pop(session_id, None)
        if kept is None:
            return None
        epoch, reads, settled = kept
        if (
            self._held.get(session_id) != epoch
            or self._unsettled.get(session_id)
            or self._fenced_settled.get(session_id, 0) != settled
        ):
            return None  # the lease changed hands, or the session was written since
        return reads

    async def release(self, session_id: str) -> None:
        self._prompt_claims.pop(session_id, None)
        epoch = self._held.pop(session_id, None)
        if epoch is None:
            return
        try:
            await trio.to_thread.run_sync(self._release_sync, [(session_id, epoch)])
        except Exception as error:  # it lapses by itself
            log.warning("lease release failed", session_id=session_id, error=_first_line(error))

    def post_release(self, session_id: str) -> None:
        """The lease goes back in the writer's next transaction, with the turn's last
        events: a release made its own transaction on the control connection, which
        every claim of this daemon waits for, once per turn (issue 18). Not held from
        now on (so not renewed); until that commit the fence still holds for this epoch.
        """
        self._prompt_claims.pop(session_id, None)
        epoch = self._held.pop(session_id, None)
        if epoch is not None:
            self._enqueue(WriteEvents((), fence=(session_id, epoch), release=True))

    async def _release_all(self) -> None:
        held, self._held = list(self._held.items()), {}
        if held:
            try:
                await trio.to_thread.run_sync(self._release_sync, held)
            except Exception as error:
                log.warning("lease release failed", error=_first_line(error))

    def _release_sync(self, held: Sequence[tuple[str, int]]) -> None:
        def work(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
            conn.execute(
                "UPDATE leases l SET expires = 0"
                " FROM unnest(%s::text[], %s::bigint[]) AS h(sid, ep)"
                " WHERE l.session_id = h.sid AND l.epoch = h.ep AND l.owner = %s",
                ([s for s, _ in held], [e for _, e in held], self.owner),
            )

        self._retrying("_control", work)

    async def _keep_leases(self) -> None:
        """Renew this daemon's leases; report those lost; wake sessions whose holder lapsed."""
        import psycopg

        renew_every = max(self.lease_seconds / 3, 0.05)
        # Orphans are looked for more often than leases are renewed: a dead holder's
        # sessions then wait at most the lease plus this, not the lease plus a renewal.
        scan_every = min(renew_every, ORPHAN_SCAN_SECONDS)
        renewed = trio.current_time()
        while True:
            await trio.sleep(scan_every)
            renew = trio.current_time() - renewed >= renew_every - scan_every / 2
            held = list(self._held.items()) if renew else []
            if renew:
                renewed = trio.current_time()
            try:
                kept, orphans = await trio.to_thread.run_sync(self._renew_sync, held)
            except (psycopg.Error, LedgerError) as error:
                log.warning("lease renewal failed", error=_first_line(error))
                continue
            for session_id, epoch in held:
                if session_id not in kept and self._held.get(session_id) == epoch:
                    del self._held[session_id]
                    log.warning("lease lost", session_id=session_id, epoch=epoch)
                    if self.hooks is not None:
                        self.hooks.lost(session_id)
            # Claimed turns whose holder lapsed are taken whatever the load (failover);
            # input never claimed only as far as this daemon has room to start it, unless
            # it has waited a whole lease (the daemon it was sent to died before claiming
            # it): a busy daemon would otherwise leave it waiting for good.
            room = self.hooks.room() if self.hooks is not None else 0
            free = [(s, turn) for s, turn in orphans if s not in self._held]
            now = trio.current_time()
            seen = self._unclaimed
            self._unclaimed = {s: seen.get(s, now) for s, turn in free if not turn}
            inputs = [s for s, turn in free if not turn]
            overdue = [s for s in inputs if now - self._unclaimed[s] >= self.lease_seconds]
            late = set(overdue)
            inputs = overdue + [s for s in inputs if s not in late][: max(room, 0)]
            await self._take_over([s for s, turn in free if turn] + inputs)

    async def _take_over(self, orphans: list[str]) -> None:
        """Claim, in one transaction, a batch of sessions whose holder stopped renewing,
        record each change of hands, and have them run here."""
        if not orphans or self.hooks is None:
            return
        try:
            taken = await trio.to_thread.run_sync(self._take_over_sync, orphans[:TAKEOVER_BATCH])
        except Exception as error:
            log.warning("taking over orphaned sessions failed", error=_first_line(error))
            return
        from harness.messages.events import NewEvent

        for session_id, epoch, previous in taken:
            self._held[session_id] = epoch
            if previous and previous != self.owner:
                data = {"session_id": session_id, "owner": self.owner, "epoch": epoch,
                        "from": previous}  # fmt: skip
                self.post([NewEvent("session.leased", session_id, data)], fence=(session_id, epoch))
        if taken:
            log.info("sessions taken over", count=len(taken))
        for session_id, _, _ in taken:
            self.hooks.orphan(session_id)

    def _take_over_sync(self, orphans: list[str]) -> list[tuple[str, int, str]]:
        def work(conn: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[str, int, str]]:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO leases(session_id, owner, epoch, expires)"
                    " SELECT unnest(%s::text[]), '', 0, 0 ON CONFLICT DO NOTHING",
                    (orphans,),
                )
                rows = conn.execute(
                    "SELECT session_id, owner, epoch FROM leases WHERE session_id = ANY(%s)"
                    " AND expires < extract(epoch FROM clock_timestamp())"
                    " FOR UPDATE SKIP LOCKED",
                    (orphans,),
                ).fetchall()
                taken = [
                    (str(s), int(e) if o == self.owner else int(e) + 1, str(o))
                    for s, o, e in rows
                ]
                if taken:
                    conn.execute(
                        "UPDATE leases l SET owner = %s, epoch = h.ep,"
                        " expires = extract(epoch FROM clock_timestamp()) + %s"
                        " FROM unnest(%s::text[], %s::bigint[]) AS h(sid, ep)"
                        " WHERE l.session_id = h.sid",
                        (self.owner, self.lease_seconds, [t[0] for t in taken],
                         [t[1] for t in taken]),
                    )  # fmt: skip
                return taken

        return self._retrying("_control", work)

    def _orphans_now(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, bool]]:
        """The sessions of an orphan scan's rows to take now, each with whether it has a
        claimed turn (work in flight, taken over whatever the load) or only input
        waiting (a new turn, which ``_keep_leases`` takes as far as there is room).

        A claimed turn, or input on a lease that lapsed (its holder stopped renewing),
        at once. Input on a free lease only once the scan before saw the same input
        waiting (the same first seq), so at least a scan interval ago: fresh input is
        being claimed by the daemon it was sent to, which woke its own actor with it.
        Taken at once, a burst of prompts went, hundreds a scan, to whichever daemon
        scanned first, whose actors then read what their claim would have brought,
        while the prompted daemon's claims met rows taken (issue 18).
        """
        now: list[tuple[str, bool]] = []
        waiting: set[tuple[str, int]] = set()
        for session_id, turn, first, expires in rows:
            sid = str(session_id)
            if turn:
                now.append((sid, True))
                continue
            key = (sid, int(first))
            if float(expires) > 0 or key in self._seen_waiting:
                now.append((sid, False))
            # Still waiting at the next scan, if nobody takes it (a busy daemon leaves
            # it to one with room): then it is still not fresh.
            waiting.add(key)
        self._seen_waiting = waiting
        return sorted(now)

    def _renew_sync(
        self, held: Sequence[tuple[str, int]]
    ) -> tuple[set[str], list[tuple[str, bool]]]:
        """The leases of ``held`` still this daemon's, renewed; and the sessions with
        work no live lease covers, to take now (``_orphans_now``)."""

        def work(
            conn: psycopg.Connection[tuple[Any, ...]],
        ) -> tuple[set[str], list[tuple[str, bool]]]:
            kept: set[str] = set()
            if held:
                rows = conn.execute(
                    "UPDATE leases l SET expires = extract(epoch FROM clock_timestamp()) + %s"
                    " FROM unnest(%s::text[], %s::bigint[]) AS h(sid, ep)"
                    " WHERE l.session_id = h.sid AND l.epoch = h.ep AND l.owner = %s"
                    " RETURNING l.session_id",
                    (self.lease_seconds, [s for s, _ in held], [e for _, e in held], self.owner),
                ).fetchall()
                kept = {row[0] for row in rows}
            # Work whose lease lapsed or was never taken: a claimed turn, or input
            # waiting, with the first seq of the input and the lease's expiry (0: free,
            # never taken or given back), for ``_orphans_now``.
            rows = conn.execute(
                "SELECT w.session_id, bool_or(w.turn), min(w.first), coalesce(max(l.expires), 0)"
                " FROM (SELECT session_id, true AS turn, NULL::bigint AS first FROM turns"
                " UNION ALL SELECT session_id, false, seq FROM inbox) w"
                " LEFT JOIN leases l ON l.session_id = w.session_id"
                " WHERE l.session_id IS NULL OR l.expires < extract(epoch FROM clock_timestamp())"
                " GROUP BY w.session_id"
            ).fetchall()
            return kept, self._orphans_now(rows)

        return self._retrying("_control", work)

"""The SQLite ledger (DESIGN §4): an append-only event log plus projections.

The embedded default backend of the ledger port (harness/storage/port.py, which holds
the writer actor and the reads). One write connection, used by one commit at a time:
each batch in one transaction. A step's batch (a few dozen events, no file contents)
commits on the event loop's own thread, by the step's flush itself when the writer
waits with no batch in hand (``LedgerPort._commit_here``): with ``synchronous=NORMAL``
a WAL commit only appends pages to the WAL file (~0.1–0.3 ms), and a worker thread's
round trip cost about as much CPU again (issue 14). What used to stall a commit
10–25 ms now and then, the WAL checkpoint, runs on a worker thread of its own
(``_checkpoint``); larger batches, and every batch with ``durability="full"`` (an
fsync each), still commit on a worker thread, from the writer. Reads go through a
second connection, on the caller's thread: they are small, indexed and do not wait
for writers in WAL mode.

What a commit survives: with ``durability="normal"`` (``synchronous=NORMAL``) a committed
transaction survives a crash of the process; a power loss may lose the last
transactions but never corrupts the file. ``durability="full"`` (``synchronous=FULL``)
also survives a power loss, at the price of an fsync per batch.
"""

from __future__ import annotations

import errno
import json
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import apsw
import outcome
import structlog
import trio
from pydantic_core import PydanticSerializationError
from pydantic_core import to_json as _to_json

from harness.messages.events import Event, EventType, NewEvent
from harness.messages.mailbox import WriteEvents
from harness.messages.names import shown_data
from harness.private import FILE_MODE, private_dir, private_file, tighten
from harness.secrets import has_secrets, redact
from harness.storage.port import (
    FileChangeRow,
    LedgerError,
    LedgerMissing,
    LedgerPort,
    LedgerRefused,
    on_worker_thread,
)
from harness.storage.projections import (
    PROJECTIONS,
    Execute,
    LastRows,
    Projection,
    upsert_session,
)
from harness.storage.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["Durability", "FileChangeRow", "Ledger", "LedgerError", "LedgerPort"]

log = structlog.get_logger("harness.ledger")

Durability = Literal["normal", "full"]

# How long a fire-and-forget post waits for company (``LedgerPort.post``): the posts of a
# step, from its reply's first part to the flush before its next request, share one
# transaction. With 2 ms a step split in two whenever its work after that part took
# longer, which a loaded machine makes it do (every step at load 5: a second
# transaction, a second publish and the wake-ups of both, ~7 % of a wire step's
# instructions under callgrind). A flush ends the wait at once, so no request waits for
# it; what it delays is only what observers see of a post nothing flushes soon (a
# read-only tool's "running"), and by less than the 50 ms that live deltas are gathered.
POST_DELAY = 0.02


# json.dumps with any argument of its own builds a JSONEncoder per call: the writer
# encodes every event of a step (~8), so one encoder, made once, does it (the same text).
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _encodable(text: str) -> bool:
    if text.isascii():  # most events; no copy made to find out
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encoded(data: dict[str, Any]) -> str:
    """``_dumps(data)``, by pydantic-core where it can: ~2.5 times faster (the writer
    encodes ~10 events a step). The same text for what events hold (UTF-8 strings, ints,
    floats, NaN and infinities as Python writes them) but for the spelling of some small
    floats (``0.00001`` for ``1e-05``, the same number). What it refuses (a lone
    surrogate: it encodes only UTF-8; a key that is no string) takes the json path, which
    handles it as before."""
    try:
        return _to_json(data, inf_nan_mode="constants").decode()
    except (PydanticSerializationError, ValueError, TypeError):
        return _dumps(data)


def stored_text(
    data: dict[str, Any], redacting: bool | None = None
) -> tuple[dict[str, Any], str]:
    """An event's data as stored, and its JSON text: shown when not UTF-8, redacted.

    ``redacting``: whether any secret is known (``has_secrets()``), when the caller
    asked once for a whole batch."""
    stored = data
    try:  # ``_encoded``'s way, without its call: a commit stores ~10 events a step
        text = _to_json(stored, inf_nan_mode="constants").decode()
    except (PydanticSerializationError, ValueError, TypeError):
        text = _dumps(stored)
    if not text.isascii() and not _encodable(text):
        # A name that is not UTF-8 (or a model's lone surrogate): SQLite and every
        # reader need text, so it is stored as shown (\xff).
        stored = shown_data(stored)
        text = _encoded(stored)
    if has_secrets() if redacting is None else redacting:
        # One pass over the serialized text; parsed again only when it held a secret,
        # so what is stored and what is published agree.
        clean = redact(text)
        if clean != text:
            text, stored = clean, json.loads(clean)
    return stored, text


class Ledger(LedgerPort):
    """The SQLite (apsw) backend: one file, one running harness (harness/storage/lock.py)."""

    def __init__(
        self,
        path: Path,
        *,
        durability: Durability = "normal",
        post_delay: float = POST_DELAY,
        read_only: bool = False,
    ) -> None:
        """Open (and migrate) the ledger; ``read_only`` for the commands that only read:
        they then work on a read-only file or filesystem and can never change the file."""
        super().__init__(post_delay=post_delay, read_only=read_only)
        self.path = path
        self.location = str(path)
        self.durability = durability
        self._projections: dict[EventType, Projection] = PROJECTIONS
        # Commits on the event loop's thread (small batches) with checkpoints off it.
        self._inline = durability == "normal" and not read_only
        self._checkpoints: apsw.Connection | None = None  # opened by the first checkpoint
        self._checkpointing = threading.Lock()  # held while one runs; close() waits on it
        self._wal_pages = 0  # the WAL's size after the last commit, and at the last
        self._checkpoint_mark = 0  # checkpoint's start (0 after the WAL restarted)
        self._copied = 0  # the WAL frames the last checkpoint copied (-1: it failed)
        self._catch_up = False  # it could not copy them all: the next commit does
        try:
            if read_only:
                self._read = self._write = self._connect_read_only(path)
            else:
                private_dir(path.parent)
                # SQLite gives the -wal and -shm files the mode of the database file: 0600.
                private_file(path)
                self._write = self._connect(path)
                self._migrate(self._write)
                self._projections = _sqlite_projections(self._write)
                if self._inline:
                    self._write.wal_autocheckpoint(0)
                    self._write.setwalhook(self._wal_grew)
                self._read = self._connect(path)
                for suffix in ("-wal", "-shm"):  # made by an older, looser harness
                    tighten(path.with_name(path.name + suffix), FILE_MODE)
        except OSError as error:
            raise LedgerError(
                f"cannot open the ledger at {path}: {error.strerror or error}"
            ) from error
        except apsw.Error as error:
            # Never "repair" by recreating: the file may hold someone's only record.
            raise LedgerError(
                f"cannot open the ledger at {path}: {error}. "
                "The file was left untouched; move it aside to start a new ledger."
            ) from error

    def _connect(self, path: Path) -> apsw.Connection:
        conn = apsw.Connection(str(path))
        conn.setbusytimeout(5000)
        # One statement per execute(): apsw runs a multi-statement string lazily.
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        sync = "FULL" if self.durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute("PRAGMA foreign_keys=ON")
        # Fail now, with a clear error, on a file that is not a database.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return conn

    @staticmethod
    def _connect_read_only(path: Path) -> apsw.Connection:
        if not path.is_file():
            raise LedgerError(f"no ledger at {path}")
        try:
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
            conn.setbusytimeout(5000)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except apsw.CantOpenError:
            # A WAL ledger on a read-only filesystem: no -shm can be made, so no writer
            # can be running either, and the file may be read as immutable.
            uri = f"file:{quote(str(path.resolve()))}?immutable=1"
            conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        version = int(str(conn.execute("PRAGMA user_version").fetchall()[0][0]))
        if version != SCHEMA_VERSION:
            conn.close()
            fix = "upgrade harness" if version > SCHEMA_VERSION else "run harness to migrate it"
            raise LedgerError(
                f"the ledger at {path} has schema version {version} and this harness reads "
                f"{SCHEMA_VERSION}: {fix}"
            )
        return conn

    @staticmethod
    def _migrate(conn: apsw.Connection) -> None:
        version = int(str(conn.execute("PRAGMA user_version").fetchall()[0][0]))
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger has schema version {version}, newer than this harness knows "
                f"({SCHEMA_VERSION}); upgrade harness to open it"
            )
        for index in range(version, SCHEMA_VERSION):
            with conn:
                for statement in MIGRATIONS[index]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={index + 1}")

    def close(self) -> None:
        self.close_writer()
        with self._checkpointing:  # a checkpoint under way ends first
            if self._checkpoints is not None:
                self._checkpoints.close()
                self._checkpoints = None
        self._read.close()
        if self._write is not self._read:
            self._write.close()  # the last connection: SQLite checkpoints the WAL away

    # --- checkpoints, off the event loop ----------------------------------------------------

    def _wal_grew(self, conn: apsw.Connection, name: str, pages: int) -> int:
        """After each commit (SQLite's WAL hook), the WAL holding ``pages`` pages: every
        ``_CHECKPOINT_PAGES`` more (SQLite's own auto-checkpoint interval) a PASSIVE
        checkpoint starts on a worker thread, unless one runs. It copies the WAL into
        the database while commits go on. If none came while it ran (a step's wait for
        its model is longer), the next commit starts the WAL again from its beginning;
        else the commit after this one copies the rest itself (``_catch_up``)."""
        if pages < self._wal_pages:
            self._checkpoint_mark = 0  # the WAL started again
        self._wal_pages = pages
        if not self._checkpointing.acquire(blocking=False):
            return apsw.SQLITE_OK  # one runs: the commits after it look again
        if self._checkpoint_mark and self._copied < pages:
            # The last one could not copy it all (or failed): before another starts.
            self._catch_up = True
        elif pages - self._checkpoint_mark >= _CHECKPOINT_PAGES:
            self._checkpoint_mark = pages
            trio.lowlevel.start_thread_soon(self._checkpoint, _checkpointed)  # it releases
            return apsw.SQLITE_OK
        self._checkpointing.release()
        return apsw.SQLITE_OK

    def _checkpoint(self) -> None:
        """On a worker thread, holding ``_checkpointing``: one checkpoint, on a
        connection of its own (a connection serves one thread at a time)."""
        self._copied = -1
        try:
            if self._checkpoints is None:
                self._checkpoints = self._connect(self.path)
            _, self._copied = self._checkpoints.wal_checkpoint(
                mode=apsw.SQLITE_CHECKPOINT_PASSIVE
            )
        finally:
            self._checkpointing.release()

    # --- writing (the actor itself is LedgerPort.run_writer) -------------------------------

    def _failure(self, error: Exception) -> tuple[LedgerError, bool]:
        if _disk_full(error):
            # The transaction rolled back whole: the ledger holds what it held.
            return (
                LedgerError(
                    f"disk full: a ledger write failed ({error}); the ledger at {self.path} "
                    "is intact: free some space and run again to resume"
                ),
                True,
            )
        return super()._failure(error)

    async def _run_commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """A step's batch on the event loop's thread; a large one, one with file contents
        (compressed here) or one that syncs to disk on a worker thread."""
        if self._inline:
            if self._catch_up or self._wal_pages >= _WAL_PAGES_MOST:
                return await on_worker_thread(lambda: self._commit_and_checkpoint(batch))
            if _small(batch):
                return self._commit_on_loop(batch)
        return await super()._run_commit(batch)

    def _commits_on_loop(self, events: int, blobs: bool) -> bool:
        return (
            self._inline
            and not blobs
            and events <= _INLINE_EVENTS
            and not self._catch_up
            and self._wal_pages < _WAL_PAGES_MOST
        )

    @trio.lowlevel.enable_ki_protection
    def _commit_on_loop(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """``_commit``, where a Ctrl-C waits for its end (Trio then raises it in the main
        task): on a worker thread it could not cut a commit short, and it must not here
        either, or the writer would die with its batch neither answered nor known lost."""
        return self._commit(batch)

    def _commit_and_checkpoint(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """A commit, then a checkpoint on the write connection, as SQLite's own
        auto-checkpoint makes, on a worker thread: commits that never pause (a busy
        daemon's, a zero-latency benchmark's) would keep every checkpoint made beside
        them from copying the whole WAL, and the WAL from starting again. No commit
        comes between this one and its checkpoint, which copies only what came during
        the last one (or everything, past ``_WAL_PAGES_MOST``: none could run)."""
        committed = self._commit(batch)
        with self._checkpointing:  # after the one under way, if any
            self._catch_up = False
            try:
                _, self._copied = self._write.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.Error as error:  # committed all the same: the next one copies it
                log.debug("wal checkpoint failed", error=str(error))
        return committed

    def _commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        conn = self._write
        now = time.time()
        out: list[list[Event] | LedgerRefused] = []
        rows = LastRows(conn.executemany, self._projections)
        redacting = has_secrets()
        # Events whose requests were checked, appended together (``_append``) before
        # the next check, which may depend on their projections.
        appending: list[tuple[list[Event], Sequence[NewEvent]]] = []
        with conn:
            for request in batch:
                if request.exists is not None:
                    if appending:
                        self._append(appending, now, rows, redacting)
                        appending = []
                    if not conn.execute(
                        "SELECT 1 FROM sessions WHERE id = ?", (request.exists,)
                    ).fetchall():
                        out.append(LedgerMissing(f"no session {request.exists}"))
                        continue
                for digest, data in request.blobs:
                    _store_blob(conn, digest, data)
                events: list[Event] = []
                out.append(events)
                if request.events:
                    appending.append((events, request.events))
            if appending:
                self._append(appending, now, rows, redacting)
            rows.flush()
        return out

    def _append(
        self,
        appending: list[tuple[list[Event], Sequence[NewEvent]]],
        now: float,
        rows: LastRows,
        redacting: bool,
    ) -> None:
        """Append requests' events in one statement, then apply them in order, each
        request's filling its list. One statement, not one an event: a step appends ~9,
        each an ``execute`` (its cursor, its look-up in the statement cache) and a
        ``last_insert_rowid``. The seqs are the rowids SQLite gives, one more than the
        largest each time: the last one's, counted back."""
        conn = self._write
        stored: list[tuple[dict[str, Any], str]] = []
        values: list[tuple[float, str, str, str]] = []
        for _, news in appending:
            for new in news:
                data, text = stored_text(new.data, redacting)
                stored.append((data, text))
                values.append((now, new.session_id, new.type, text))
        conn.executemany(_EVENT_INSERT, values)
        seq = conn.last_insert_rowid() - len(values)
        execute = conn.execute
        at = 0
        for events, news in appending:
            for new in news:
                seq += 1
                data, text = stored[at]
                at += 1
                rows.apply(execute, new.type, seq, data, text)
                events.append(Event(seq, now, new.type, new.session_id, data))

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._read.execute(sql, args).fetchall()


_EVENT_INSERT = "INSERT INTO events(ts, session_id, type, data) VALUES (?, ?, ?, ?)"
# SQLite's default auto-checkpoint interval, in WAL pages (4 KiB each).
_CHECKPOINT_PAGES = 1000
# A WAL this large was not started again by the checkpoints beside the commits: the
# next commit checkpoints it itself.
_WAL_PAGES_MOST = 4 * _CHECKPOINT_PAGES
# The most events a batch committed on the event loop's thread holds: a step makes ~10;
# a busy daemon's batch of many sessions' steps goes to a worker thread, so the loop
# waits on no commit longer than a few steps' (~40 us an event).
_INLINE_EVENTS = 64


def _small(batch: list[WriteEvents]) -> bool:
    count = 0
    for request in batch:
        if request.blobs:
            return False
        count += len(request.events)
    return count <= _INLINE_EVENTS


def _checkpointed(result: outcome.Outcome[None]) -> None:
    """A checkpoint's end, on its worker thread: one that failed (a reader kept it
    busy; a full disk) is left for the next one, which copies the same pages."""
    if isinstance(result, outcome.Error):
        log.debug("wal checkpoint failed", error=str(result.error))


# A session's row when its status and parent stay as they were (every step's
# session.updated): the upsert of projections.py also rewrites their two index
# entries, two pages more in every commit's WAL frames (~20 a step).
_SESSION_KEPT = (
    "INSERT INTO sessions(id, parent_id, status, updated, seq, data) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(id) DO UPDATE SET updated=excluded.updated, seq=excluded.seq,"
    " data=excluded.data"
    " WHERE sessions.status IS excluded.status AND sessions.parent_id IS excluded.parent_id"
)


def _sqlite_projections(conn: apsw.Connection) -> dict[EventType, Projection]:
    """PROJECTIONS, with the session upsert that leaves unchanged index entries alone
    (it needs SQLite's ``changes()``): the same rows."""

    def session(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
        row = (data["id"], data.get("parent_id"), data["status"], data["updated"], seq, text)
        execute(_SESSION_KEPT, row)
        if not conn.changes():  # its status or parent changed: the upsert that sets them
            upsert_session(execute, seq, data, text)

    return {**PROJECTIONS, "session.created": session, "session.updated": session}


def _disk_full(error: BaseException) -> bool:
    if isinstance(error, apsw.FullError):
        return True
    return isinstance(error, OSError) and error.errno == errno.ENOSPC


def _store_blob(conn: apsw.Connection, digest: str, data: bytes) -> None:
    """Store a content once: compressed here, on the writer's thread, only when new."""
    if conn.execute("SELECT 1 FROM blobs WHERE hash = ?", (digest,)).fetchall():
        return
    conn.execute(
        "INSERT INTO blobs(hash, size, data) VALUES (?, ?, ?)",
        (digest, len(data), zlib.compress(data, 1)),
    )

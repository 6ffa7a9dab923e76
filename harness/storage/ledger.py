"""The SQLite ledger (DESIGN §4): an append-only event log plus projections.

One write connection belongs to the writer task (``run_writer``), which drains its
mailbox and commits each batch in one transaction inside ``trio.to_thread`` (a commit
stalls 10–25 ms now and then on a WAL checkpoint; the event loop must not). Reads go
through a second connection, on the caller's thread: they are small, indexed and do not
wait for writers in WAL mode.

What a commit survives: with ``durability="normal"`` (``synchronous=NORMAL``) a committed
transaction survives a crash of the process; a power loss may lose the last
transactions but never corrupts the file. ``durability="full"`` (``synchronous=FULL``)
also survives a power loss, at the price of an fsync per batch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import apsw
import structlog
import trio
from pydantic import TypeAdapter

from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents
from harness.messages.model import (
    AssistantMessage,
    InboxItem,
    Message,
    MessageWithParts,
    Part,
    Rule,
    Session,
    TextPart,
    ToolPart,
    UserMessage,
)
from harness.messages.names import shown_data
from harness.messages.todo import Todo
from harness.private import FILE_MODE, private_dir, private_file, tighten
from harness.secrets import has_secrets, redact
from harness.storage.projections import PROJECTIONS
from harness.storage.schema import MIGRATIONS, SCHEMA_VERSION

log = structlog.get_logger("harness.ledger")

Durability = Literal["normal", "full"]

_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
_PART: TypeAdapter[Part] = TypeAdapter(Part)
_MAX_BATCH = 1024


class LedgerError(Exception):
    """The ledger cannot be opened or written; the message says where and why."""


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Ledger:
    def __init__(
        self,
        path: Path,
        *,
        durability: Durability = "normal",
        post_delay: float = 0.002,
        read_only: bool = False,
    ) -> None:
        """Open (and migrate) the ledger; ``read_only`` for the commands that only read:
        they then work on a read-only file or filesystem and can never change the file."""
        self.path = path
        self.durability = durability
        self.post_delay = post_delay  # how long a fire-and-forget write may wait for company
        self.read_only = read_only
        # Set by a commit that found the disk full: every later write fails with it until
        # ``recover``, so nothing lands after a lost post and the ledger stays as of its
        # last good commit.
        self.failure: LedgerError | None = None
        try:
            if read_only:
                self._read = self._write = self._connect_read_only(path)
            else:
                private_dir(path.parent)
                # SQLite gives the -wal and -shm files the mode of the database file: 0600.
                private_file(path)
                self._write = self._connect(path)
                self._migrate(self._write)
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
        self._mailbox_send, self._mailbox_receive = trio.open_memory_channel[WriteEvents](math.inf)

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
        self._mailbox_send.close()
        self._read.close()
        if self._write is not self._read:
            self._write.close()

    # --- writing ---------------------------------------------------------------------------

    async def run_writer(
        self,
        feed: trio.MemorySendChannel[FeedMessage] | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The writer actor: commit batches in order, then answer and publish.

        Ends when ``close_writer`` is called and the mailbox is drained, so shielded
        cleanup writes made while the rest of the harness is cancelled still land.
        """
        task_status.started()
        async with self._mailbox_receive:
            while True:
                try:
                    first = await self._mailbox_receive.receive()
                except trio.EndOfChannel:
                    return
                batch = [first]
                if first.reply is None and self.post_delay > 0:
                    # Group commit: nobody waits on a post, so give the posts that follow
                    # it (a step makes several) a moment to share one transaction. A
                    # write that someone awaits ends the wait at once.
                    with trio.move_on_after(self.post_delay):
                        while len(batch) < _MAX_BATCH and batch[-1].reply is None:
                            try:
                                batch.append(await self._mailbox_receive.receive())
                            except trio.EndOfChannel:
                                break
                while len(batch) < _MAX_BATCH:
                    try:
                        batch.append(self._mailbox_receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with trio.CancelScope(shield=True):
                    await self._commit_and_answer(batch, feed)

    def recover(self) -> None:
        """Accept writes again after a failure (new input: there may be space now)."""
        self.failure = None

    async def _commit_and_answer(
        self, batch: list[WriteEvents], feed: trio.MemorySendChannel[FeedMessage] | None
    ) -> None:
        if self.failure is not None:
            for request in batch:
                if request.reply is not None:
                    request.reply.send_nowait(self.failure)
            return
        try:
            committed = await trio.to_thread.run_sync(self._commit, batch)
        except Exception as error:
            failure = LedgerError(f"ledger write failed: {error}")
            if _disk_full(error):
                # The transaction rolled back whole: the ledger holds what it held.
                failure = LedgerError(
                    f"disk full: a ledger write failed ({error}); the ledger at {self.path} "
                    "is intact: free some space and run again to resume"
                )
            for request in batch:
                if request.reply is not None:
                    request.reply.send_nowait(failure)
            if _disk_full(error):
                # The writer lives on (a dead one would leave shielded waiters waiting
                # for good): the failure goes to every later write, posts dropped.
                self.failure = failure
                log.error("ledger write failed: disk full", error=str(error))
            elif not any(request.reply is not None for request in batch):
                raise failure from error
            return
        published: list[Event] = []
        for request, events in zip(batch, committed, strict=True):
            if request.reply is not None:
                request.reply.send_nowait(events)
            published.extend(events)
        if feed is not None and published:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await feed.send(Publish(published))

    def _commit(self, batch: list[WriteEvents]) -> list[list[Event]]:
        conn = self._write
        now = time.time()
        out: list[list[Event]] = []
        with conn:
            for request in batch:
                for digest, data in request.blobs:
                    _store_blob(conn, digest, data)
                events: list[Event] = []
                for new in request.events:
                    stored = new.data
                    text = _dumps(stored)
                    if not _encodable(text):
                        # A name that is not UTF-8 (or a model's lone surrogate): SQLite and
                        # every reader need text, so it is stored as shown (\xff).
                        stored = shown_data(stored)
                        text = _dumps(stored)
                    if has_secrets():
                        # One pass over the serialized text; parsed again only when it
                        # held a secret, so what is stored and what is published agree.
                        clean = redact(text)
                        if clean != text:
                            text, stored = clean, json.loads(clean)
                    conn.execute(
                        "INSERT INTO events(ts, session_id, type, data) VALUES (?, ?, ?, ?)",
                        (now, new.session_id, new.type, text),
                    )
                    seq = conn.last_insert_rowid()
                    project = PROJECTIONS.get(new.type)
                    if project is not None:
                        project(conn, seq, stored, text)
                    events.append(Event(seq, now, new.type, new.session_id, stored))
                out.append(events)
        return out

    def post(self, events: Sequence[NewEvent], *, blobs: Sequence[tuple[str, bytes]] = ()) -> None:
        """Fire-and-forget write, ordered with every other write."""
        self._mailbox_send.send_nowait(WriteEvents(events, blobs=blobs))

    async def write(
        self, events: Sequence[NewEvent], *, blobs: Sequence[tuple[str, bytes]] = ()
    ) -> list[Event]:
        """Write and wait until the events (and the file contents they name) are committed."""
        # Not ``mailbox.ask``: its ``await send`` is a checkpoint, so a caller already
        # cancelled would never post the write. Posted with send_nowait (the mailbox is
        # unbounded) the events reach the writer whatever happens to the caller next.
        reply_send, reply_receive = trio.open_memory_channel[list[Event] | Exception](1)
        self._mailbox_send.send_nowait(WriteEvents(events, reply_send, blobs))
        answer = await reply_receive.receive()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def flush(self) -> None:
        """Wait until every write posted before this call is committed."""
        await self.write(())

    def close_writer(self) -> None:
        self._mailbox_send.close()

    # --- reading ---------------------------------------------------------------------------

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._read.execute(sql, args).fetchall()

    def session(self, session_id: str) -> Session | None:
        rows = self._rows("SELECT data FROM sessions WHERE id = ?", (session_id,))
        return Session.model_validate_json(rows[0][0]) if rows else None

    def sessions(self, status: str | None = None) -> list[Session]:
        if status is None:
            rows = self._rows("SELECT data FROM sessions ORDER BY updated DESC")
        else:
            rows = self._rows(
                "SELECT data FROM sessions WHERE status = ? ORDER BY updated DESC", (status,)
            )
        return [Session.model_validate_json(row[0]) for row in rows]

    def children(self, session_id: str) -> list[Session]:
        rows = self._rows(
            "SELECT data FROM sessions WHERE parent_id = ? ORDER BY id", (session_id,)
        )
        return [Session.model_validate_json(row[0]) for row in rows]

    def messages(self, session_id: str) -> list[MessageWithParts]:
        """A session's transcript: messages in order, each with its parts in order."""
        messages = [
            _MESSAGE.validate_json(row[0])
            for row in self._rows(
                "SELECT data FROM messages WHERE session_id = ? ORDER BY created_seq",
                (session_id,),
            )
        ]
        parts: dict[str, list[Part]] = {}
        for row in self._rows(
            "SELECT message_id, data FROM parts WHERE session_id = ? ORDER BY id", (session_id,)
        ):
            parts.setdefault(row[0], []).append(_PART.validate_json(row[1]))
        return [MessageWithParts(info=m, parts=parts.get(m.id, [])) for m in messages]

    def changes(self, session_id: str, after_seq: int) -> tuple[list[Message], list[Part], int]:
        """Messages and parts of a session written after ``after_seq``, and the new mark.

        Messages come in the order they were created, parts in the order they changed.

        The runner reads only what changed since its last step, so a step costs the same
        at step 200 as at step 2.
        """
        mark = after_seq
        messages: list[Message] = []
        for seq, data in self._rows(
            "SELECT seq, data FROM messages WHERE session_id = ? AND seq > ? ORDER BY created_seq",
            (session_id, after_seq),
        ):
            messages.append(_MESSAGE.validate_json(data))
            mark = max(mark, seq)
        parts: list[Part] = []
        for seq, data in self._rows(
            "SELECT seq, data FROM parts WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after_seq),
        ):
            parts.append(_PART.validate_json(data))
            mark = max(mark, seq)
        return messages, parts, mark

    def inbox(self, session_id: str) -> list[InboxItem]:
        return [
            InboxItem.model_validate_json(row[0])
            for row in self._rows(
                "SELECT data FROM inbox WHERE session_id = ? ORDER BY seq", (session_id,)
            )
        ]

    def claimed_turns(self, session_id: str | None = None) -> list[tuple[str, str, int]]:
        """Turns started and never finished: ``(session_id, message_id, resumes)``."""
        if session_id is None:
            rows = self._rows("SELECT session_id, message_id, resumes FROM turns ORDER BY started")
        else:
            rows = self._rows(
                "SELECT session_id, message_id, resumes FROM turns WHERE session_id = ?"
                " ORDER BY started",
                (session_id,),
            )
        return [(row[0], row[1], int(row[2])) for row in rows]

    def sessions_with_inbox(self) -> list[str]:
        return [row[0] for row in self._rows("SELECT DISTINCT session_id FROM inbox")]

    def known_message(self, message_id: str) -> bool:
        """Whether an id is already taken by a message or a queued input (idempotency)."""
        rows = self._rows(
            "SELECT 1 FROM messages WHERE id = ? UNION ALL SELECT 1 FROM inbox WHERE id = ?",
            (message_id, message_id),
        )
        return bool(rows)

    def prompt_origin(self, message_id: str) -> tuple[str, str] | None:
        """The session and text a message id was first prompted with, or None if unused.

        A queued input still holds its text; a taken one is the user message's first
        text part (the prompt, verbatim).
        """
        rows = self._rows("SELECT session_id, data FROM inbox WHERE id = ?", (message_id,))
        if rows:
            return rows[0][0], InboxItem.model_validate_json(rows[0][1]).text
        rows = self._rows(
            "SELECT m.session_id, p.data FROM messages m LEFT JOIN parts p"
            " ON p.message_id = m.id AND p.type = 'text' WHERE m.id = ? AND m.role = 'user'"
            " ORDER BY p.id LIMIT 1",
            (message_id,),
        )
        if not rows:
            return None
        part = _PART.validate_json(rows[0][1]) if rows[0][1] else None
        return rows[0][0], part.text if isinstance(part, TextPart) else ""

    def user_message(self, message_id: str) -> UserMessage | None:
        rows = self._rows(
            "SELECT data FROM messages WHERE id = ? AND role = 'user'", (message_id,)
        )
        message = _MESSAGE.validate_json(rows[0][0]) if rows else None
        return message if isinstance(message, UserMessage) else None

    def open_tool_parts(self, session_id: str) -> list[ToolPart]:
        rows = self._rows(
            "SELECT data FROM parts WHERE session_id = ? AND type = 'tool'"
            " AND status IN ('pending', 'running') ORDER BY id",
            (session_id,),
        )
        return [ToolPart.model_validate_json(row[0]) for row in rows]

    def assistant_messages(
        self, session_id: str, *, unfinished_or_in: set[str]
    ) -> list[AssistantMessage]:
        """Assistant messages never completed, plus those whose ids are given."""
        found: list[AssistantMessage] = []
        for (data,) in self._rows(
            "SELECT data FROM messages WHERE session_id = ? AND role = 'assistant'"
            " AND (json_extract(data, '$.completed') IS NULL"
            f" OR id IN ({','.join('?' for _ in unfinished_or_in) or 'NULL'}))"
            " ORDER BY created_seq",
            (session_id, *unfinished_or_in),
        ):
            found.append(AssistantMessage.model_validate_json(data))
        return found

    def todos(self, session_id: str) -> list[Todo]:
        """A session's task list as ``todowrite`` last stored it (empty if never)."""
        rows = self._rows("SELECT data FROM todos WHERE session_id = ?", (session_id,))
        if not rows:
            return []
        return [Todo.model_validate(item) for item in json.loads(rows[0][0])["todos"]]

    def approvals(self, project: str) -> list[Rule]:
        return [
            Rule(permission=row[0], pattern=row[1], action="allow")
            for row in self._rows(
                "SELECT permission, pattern FROM approvals WHERE project = ? ORDER BY created",
                (project,),
            )
        ]

    def events_after(
        self, after_seq: int, *, session_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> list[Event]:
        if session_ids is None:
            rows = self._rows(
                "SELECT seq, ts, type, session_id, data FROM events WHERE seq > ?"
                " ORDER BY seq LIMIT ?",
                (after_seq, limit),
            )
        else:
            marks = ",".join("?" for _ in session_ids)
            rows = self._rows(
                "SELECT seq, ts, type, session_id, data FROM events"
                f" WHERE seq > ? AND session_id IN ({marks}) ORDER BY seq LIMIT ?",
                (after_seq, *session_ids, limit),
            )
        return [Event(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def mcp_processes(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(session_id, server, identity)`` of each MCP server process group recorded
        and not recorded as ended since: what a harness that died left running."""
        rows = self._rows(
            "SELECT session_id, type, data FROM events"
            " WHERE type IN ('mcp.process', 'mcp.exited', 'mcp.failed') ORDER BY seq"
        )
        open_groups: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for session_id, kind, data in rows:
            payload = json.loads(data)
            identity = payload.get("process")
            if not isinstance(identity, dict):
                continue
            key = json.dumps(identity, sort_keys=True)
            if kind == "mcp.process":
                open_groups[key] = (session_id, str(payload.get("server", "")), identity)
            else:
                open_groups.pop(key, None)
        return list(open_groups.values())

    def last_seq(self) -> int:
        rows = self._rows("SELECT max(seq) FROM events")
        value = rows[0][0]
        return int(value) if value is not None else 0

    # --- file snapshots (harness/snapshots.py) ---------------------------------------------

    def blob(self, digest: str) -> bytes | None:
        rows = self._rows("SELECT data FROM blobs WHERE hash = ?", (digest,))
        return zlib.decompress(rows[0][0]) if rows else None

    def file_changes(self, session_ids: Sequence[str]) -> list[FileChangeRow]:
        """Every recorded file change of these sessions, in the order they happened."""
        marks = ",".join("?" for _ in session_ids)
        rows = self._rows(
            "SELECT seq, session_id, message_id, call_id, kind, path, before, after, done"
            f" FROM file_changes WHERE session_id IN ({marks}) ORDER BY seq, path",
            tuple(session_ids),
        )
        return [
            FileChangeRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], done=bool(r[8]))
            for r in rows
        ]

    def message_seq(self, message_id: str) -> tuple[str, int] | None:
        """A message's session and the seq that orders it (``created_seq``)."""
        rows = self._rows(
            "SELECT session_id, created_seq FROM messages WHERE id = ?", (message_id,)
        )
        return (str(rows[0][0]), int(rows[0][1])) if rows else None


@dataclass(slots=True, frozen=True)
class FileChangeRow:
    seq: int
    session_id: str
    message_id: str
    call_id: str
    kind: str  # "tool" or "revert"
    path: str
    before: str | None
    after: str | None
    done: bool


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

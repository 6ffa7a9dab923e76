"""How each durable event changes the projection tables.

Runs inside the writer's transaction, right after the event row is appended, so an
event and its effect are committed together or not at all. The keys are exactly the
``ProjectedType`` names of messages/events.py (mypy refuses a key that is no event
type; tests/test_event_types.py refuses a projected type without an entry and an entry
for a type that is not projected); a ``LoggedType``
(permission.*, question.*, sandbox.unavailable) lives in the event log only.

Both backends run these same statements (``?`` placeholders, upserts both SQLite and
PostgreSQL speak), through the ``execute`` of their write connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from harness.messages.events import EventType

# A write connection's ``execute(sql, args)``; what it returns is not used.
Execute = Callable[[str, tuple[Any, ...]], object]
# Its ``executemany(sql, rows)``: one statement, run for each row in turn.
ExecuteMany = Callable[[str, list[tuple[Any, ...]]], object]

# INSERT OR REPLACE, said in the upsert both engines speak: the row of (call_id, path)
# takes every new value.
_REPLACE_CHANGE = (
    "ON CONFLICT(call_id, path) DO UPDATE SET seq=excluded.seq, session_id=excluded.session_id,"
    " message_id=excluded.message_id, kind=excluded.kind, before=excluded.before,"
    " after=excluded.after, done=excluded.done"
)


def upsert_session(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO sessions(id, parent_id, status, updated, seq, data) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET parent_id=excluded.parent_id, status=excluded.status,"
        " updated=excluded.updated, seq=excluded.seq, data=excluded.data",
        (data["id"], data.get("parent_id"), data["status"], data["updated"], seq, text),
    )


def _delete_session(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    session_id = data["id"]
    # Its claimed turn too: left behind (a holder that died after the deletion), the turn
    # would be found by every recovery scan, claimed for a session that no longer exists.
    for table in ("parts", "messages", "inbox", "todos", "turns"):
        execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    execute("DELETE FROM sessions WHERE id = ?", (session_id,))


_MESSAGE_UPSERT = (
    "INSERT INTO messages(id, session_id, role, seq, created_seq, data)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(id) DO UPDATE SET seq=excluded.seq, data=excluded.data"
)
_PART_UPSERT = (
    "INSERT INTO parts(id, session_id, message_id, type, status, seq, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(id) DO UPDATE SET status=excluded.status, seq=excluded.seq,"
    " data=excluded.data"
)


def _message_values(
    first_seq: int, first: dict[str, Any], seq: int, text: str
) -> tuple[Any, ...]:
    """A message's row as of its event at ``seq`` (``text``), when the first event of it
    in the transaction was ``first`` at ``first_seq``: what a new row takes from its
    first event (its session, role and place) and what it takes from its last."""
    return (first["id"], first["session_id"], first["role"], seq, first_seq, text)


def _part_values(
    first: dict[str, Any], seq: int, data: dict[str, Any], text: str
) -> tuple[Any, ...]:
    """A part's row as of its event at ``seq`` (``data``), ``first`` as for messages."""
    state = data.get("state")
    status = state.get("status") if isinstance(state, dict) else None
    return (first["id"], first["session_id"], first["message_id"], first["type"], status, seq, text)


def _upsert_message(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(_MESSAGE_UPSERT, _message_values(seq, data, seq, text))


def _upsert_part(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(_PART_UPSERT, _part_values(data, seq, data, text))


def _add_inbox(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO inbox(id, session_id, delivery, seq, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (data["id"], data["session_id"], data["delivery"], seq, text),
    )


def _take_inbox(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute("DELETE FROM inbox WHERE id = ?", (data["id"],))


def _add_approval(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO approvals(project, permission, pattern, created)"
        " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (data["project"], data["permission"], data["pattern"], data["created"]),
    )


def _snapshot_files(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        execute(
            "INSERT INTO file_changes(seq, session_id, message_id, call_id, kind, path,"
            " before, after, done) VALUES (?, ?, ?, ?, 'tool', ?, ?, NULL, 0)"
            f" {_REPLACE_CHANGE}",
            (
                seq,
                data["session_id"],
                data["message_id"],
                data["call_id"],
                file["path"],
                file["before"],
            ),
        )


def _files_changed(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        execute(
            "UPDATE file_changes SET after = ?, done = 1 WHERE call_id = ? AND path = ?",
            (file["after"], data["call_id"], file["path"]),
        )


def _reverted(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        execute(
            "INSERT INTO file_changes(seq, session_id, message_id, call_id, kind, path,"
            " before, after, done) VALUES (?, ?, ?, ?, 'revert', ?, ?, ?, 1)"
            f" {_REPLACE_CHANGE}",
            (
                seq,
                data["session_id"],
                data["message_id"],
                data["id"],
                file["path"],
                file["before"],
                file["after"],
            ),
        )


def _claim_turn(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO turns(message_id, session_id, started) VALUES (?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (data["message_id"], data["session_id"], data["started"]),
    )


def _resume_turn(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "UPDATE turns SET resumes = ? WHERE message_id = ?", (data["resumes"], data["message_id"])
    )


def _release_turn(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute("DELETE FROM turns WHERE message_id = ?", (data["message_id"],))


def _set_todos(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO todos(session_id, seq, data) VALUES (?, ?, ?)"
        " ON CONFLICT(session_id) DO UPDATE SET seq=excluded.seq, data=excluded.data",
        (data["session_id"], seq, text),
    )


Projection = Callable[[Execute, int, dict[str, Any], str], None]

PROJECTIONS: Final[dict[EventType, Projection]] = {
    "session.created": upsert_session,
    "session.updated": upsert_session,
    "session.deleted": _delete_session,
    "session.reverted": _reverted,
    "file.snapshot": _snapshot_files,
    "file.changed": _files_changed,
    "message.created": _upsert_message,
    "message.updated": _upsert_message,
    "part.created": _upsert_part,
    "part.updated": _upsert_part,
    "inbox.added": _add_inbox,
    "inbox.taken": _take_inbox,
    "approval.added": _add_approval,
    "turn.started": _claim_turn,
    "turn.resumed": _resume_turn,
    "turn.finished": _release_turn,
    "todo.updated": _set_todos,
}


# The projected types whose statements touch neither messages nor parts: a message or
# part row held back by ``LastRows`` may be written after theirs.
_APART_FROM_ROWS: Final = frozenset(
    (
        "session.created",
        "session.updated",
        "session.reverted",
        "file.snapshot",
        "file.changed",
        "inbox.added",
        "inbox.taken",
        "approval.added",
        "turn.started",
        "turn.resumed",
        "turn.finished",
        "todo.updated",
    )
)
_ROW_TYPES: Final = frozenset(
    ("message.created", "message.updated", "part.created", "part.updated")
)


class LastRows:
    """The projections of a transaction's events, with each message and part row written
    once, as of its last event in the transaction.

    A step's events upsert the same rows several times in one commit (its assistant
    message created then updated; its tool part pending, running, completed): the
    rows after the commit are those of their last upserts, so only those are made (a
    ``read`` step: 8 statements → 5), each table's in one ``executemany``. The events
    themselves are all appended, as before. A row held back is written before any
    projection that could touch the messages or parts tables (a session's deletion),
    and at ``flush``, before the commit: no read inside the transaction sees them
    missing.
    """

    __slots__ = ("_executemany", "_projections", "_rows")

    def __init__(
        self, executemany: ExecuteMany, projections: dict[EventType, Projection] | None = None
    ) -> None:
        self._executemany = executemany
        self._projections = PROJECTIONS if projections is None else projections
        # (table, id) -> [first seq, first data, last seq, last data, last text]
        self._rows: dict[tuple[str, str], list[Any]] = {}

    def apply(
        self, execute: Execute, kind: EventType, seq: int, data: dict[str, Any], text: str
    ) -> None:
        if kind in _ROW_TYPES:
            key = (kind[0], data["id"])  # "m" or "p"
            row = self._rows.get(key)
            if row is None:
                self._rows[key] = [seq, data, seq, data, text]
            else:
                row[2:] = (seq, data, text)
            return
        project = self._projections.get(kind)
        if project is None:
            return
        if kind not in _APART_FROM_ROWS:
            self.flush()
        project(execute, seq, data, text)

    def flush(self) -> None:
        """Write the rows held back, each table's in the order their first events came
        (the order, and so the rowids, of one statement a row)."""
        messages: list[tuple[Any, ...]] = []
        parts: list[tuple[Any, ...]] = []
        for (table, _), (first_seq, first, seq, data, text) in self._rows.items():
            if table == "m":
                messages.append(_message_values(first_seq, first, seq, text))
            else:
                parts.append(_part_values(first, seq, data, text))
        if messages:
            self._executemany(_MESSAGE_UPSERT, messages)
        if parts:
            self._executemany(_PART_UPSERT, parts)
        self._rows.clear()

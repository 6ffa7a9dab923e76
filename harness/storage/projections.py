"""How each durable event changes the projection tables.

Runs inside the writer's transaction, right after the event row is appended, so an
event and its effect are committed together or not at all. The keys are exactly the
``ProjectedType`` names of messages/events.py (mypy refuses a key that is no event
type; tests/test_event_types.py refuses a projected type without an entry and an entry
for a type that is not projected); a ``LoggedType``
(permission.*, question.*, sandbox.unavailable) lives in the event log only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import apsw

from harness.messages.events import EventType


def _upsert_session(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT INTO sessions(id, parent_id, status, updated, seq, data) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET parent_id=excluded.parent_id, status=excluded.status,"
        " updated=excluded.updated, seq=excluded.seq, data=excluded.data",
        (data["id"], data.get("parent_id"), data["status"], data["updated"], seq, text),
    )


def _delete_session(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    session_id = data["id"]
    for table in ("parts", "messages", "inbox", "todos"):
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def _upsert_message(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT INTO messages(id, session_id, role, seq, created_seq, data)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET seq=excluded.seq, data=excluded.data",
        (data["id"], data["session_id"], data["role"], seq, seq, text),
    )


def _upsert_part(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    state = data.get("state")
    status = state.get("status") if isinstance(state, dict) else None
    conn.execute(
        "INSERT INTO parts(id, session_id, message_id, type, status, seq, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET status=excluded.status, seq=excluded.seq,"
        " data=excluded.data",
        (data["id"], data["session_id"], data["message_id"], data["type"], status, seq, text),
    )


def _add_inbox(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO inbox(id, session_id, delivery, seq, data) VALUES (?, ?, ?, ?, ?)",
        (data["id"], data["session_id"], data["delivery"], seq, text),
    )


def _take_inbox(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute("DELETE FROM inbox WHERE id = ?", (data["id"],))


def _add_approval(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO approvals(project, permission, pattern, created)"
        " VALUES (?, ?, ?, ?)",
        (data["project"], data["permission"], data["pattern"], data["created"]),
    )


def _snapshot_files(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        conn.execute(
            "INSERT OR REPLACE INTO file_changes(seq, session_id, message_id, call_id, kind, path,"
            " before, after, done) VALUES (?, ?, ?, ?, 'tool', ?, ?, NULL, 0)",
            (
                seq,
                data["session_id"],
                data["message_id"],
                data["call_id"],
                file["path"],
                file["before"],
            ),
        )


def _files_changed(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        conn.execute(
            "UPDATE file_changes SET after = ?, done = 1 WHERE call_id = ? AND path = ?",
            (file["after"], data["call_id"], file["path"]),
        )


def _reverted(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    for file in data["files"]:
        conn.execute(
            "INSERT OR REPLACE INTO file_changes(seq, session_id, message_id, call_id, kind, path,"
            " before, after, done) VALUES (?, ?, ?, ?, 'revert', ?, ?, ?, 1)",
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


def _claim_turn(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO turns(message_id, session_id, started) VALUES (?, ?, ?)",
        (data["message_id"], data["session_id"], data["started"]),
    )


def _resume_turn(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "UPDATE turns SET resumes = ? WHERE message_id = ?", (data["resumes"], data["message_id"])
    )


def _release_turn(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute("DELETE FROM turns WHERE message_id = ?", (data["message_id"],))


def _set_todos(conn: apsw.Connection, seq: int, data: dict[str, Any], text: str) -> None:
    conn.execute(
        "INSERT INTO todos(session_id, seq, data) VALUES (?, ?, ?)"
        " ON CONFLICT(session_id) DO UPDATE SET seq=excluded.seq, data=excluded.data",
        (data["session_id"], seq, text),
    )


Projection = Callable[[apsw.Connection, int, dict[str, Any], str], None]

PROJECTIONS: Final[dict[EventType, Projection]] = {
    "session.created": _upsert_session,
    "session.updated": _upsert_session,
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

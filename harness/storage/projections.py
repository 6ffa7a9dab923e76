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

# INSERT OR REPLACE, said in the upsert both engines speak: the row of (call_id, path)
# takes every new value.
_REPLACE_CHANGE = (
    "ON CONFLICT(call_id, path) DO UPDATE SET seq=excluded.seq, session_id=excluded.session_id,"
    " message_id=excluded.message_id, kind=excluded.kind, before=excluded.before,"
    " after=excluded.after, done=excluded.done"
)


def _upsert_session(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
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


def _upsert_message(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    execute(
        "INSERT INTO messages(id, session_id, role, seq, created_seq, data)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET seq=excluded.seq, data=excluded.data",
        (data["id"], data["session_id"], data["role"], seq, seq, text),
    )


def _upsert_part(execute: Execute, seq: int, data: dict[str, Any], text: str) -> None:
    state = data.get("state")
    status = state.get("status") if isinstance(state, dict) else None
    execute(
        "INSERT INTO parts(id, session_id, message_id, type, status, seq, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET status=excluded.status, seq=excluded.seq,"
        " data=excluded.data",
        (data["id"], data["session_id"], data["message_id"], data["type"], status, seq, text),
    )


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

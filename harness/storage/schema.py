"""The ledger's schema, versioned with ``PRAGMA user_version``.

Each migration is a list of statements, run in order inside one transaction; the
version after migration ``i`` is ``i + 1``. Statements are issued one per ``execute``:
apsw runs a multi-statement string lazily, so a second statement could be skipped.
"""

from __future__ import annotations

from typing import Final

# The log's MCP process events, as the partial index ``events_mcp`` says it: a query
# must say it in these words for SQLite to use the index.
MCP_EVENTS: Final = "type = 'mcp.process' OR type = 'mcp.exited' OR type = 'mcp.failed'"

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            session_id TEXT NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX events_session ON events(session_id, seq)",
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            parent_id TEXT,
            status TEXT NOT NULL,
            updated REAL NOT NULL,
            seq INTEGER NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX sessions_status ON sessions(status)",
        "CREATE INDEX sessions_parent ON sessions(parent_id)",
        # created_seq orders a session's messages: ids are made when input arrives, and a
        # prompt queued during a turn is taken (and belongs in the history) after it.
        """CREATE TABLE messages (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            role TEXT NOT NULL,
            seq INTEGER NOT NULL,
            created_seq INTEGER NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX messages_session ON messages(session_id, seq)",
        "CREATE INDEX messages_order ON messages(session_id, created_seq)",
        """CREATE TABLE parts (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            message_id TEXT NOT NULL,
            type TEXT NOT NULL,
            status TEXT,
            seq INTEGER NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX parts_session ON parts(session_id, seq)",
        "CREATE INDEX parts_message ON parts(message_id)",
        """CREATE TABLE inbox (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            delivery TEXT NOT NULL,
            seq INTEGER NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX inbox_session ON inbox(session_id, seq)",
        # File snapshots (harness/snapshots.py): contents by sha256, zlib-compressed...
        """CREATE TABLE blobs (
            hash TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            data BLOB NOT NULL
        )""",
        # ...and each path a tool call (kind 'tool') or a revert (kind 'revert') changed:
        # before/after are blob hashes (NULL: no file); done = 0 while the call runs.
        """CREATE TABLE file_changes (
            seq INTEGER NOT NULL,
            session_id TEXT NOT NULL,
            message_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            path TEXT NOT NULL,
            before TEXT,
            after TEXT,
            done INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (call_id, path)
        )""",
        "CREATE INDEX file_changes_session ON file_changes(session_id, seq)",
        """CREATE TABLE approvals (
            project TEXT NOT NULL,
            permission TEXT NOT NULL,
            pattern TEXT NOT NULL,
            created REAL NOT NULL,
            PRIMARY KEY (project, permission, pattern)
        )""",
        # A claim per turn in flight: written with turn.started, removed with
        # turn.finished. What is left after a crash is what must be resumed.
        """CREATE TABLE turns (
            message_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            started REAL NOT NULL,
            resumes INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX turns_session ON turns(session_id)",
        # Each session's task list (todowrite), replaced whole by todo.updated.
        """CREATE TABLE todos (
            session_id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            data TEXT NOT NULL
        )""",
    ),
    (
        # The MCP servers' process groups and their ends, found at every start without a
        # scan of the whole log (recovery.reap_mcp_servers); only these rows are indexed.
        """CREATE INDEX events_mcp ON events(seq)
            WHERE type IN ('mcp.process', 'mcp.exited', 'mcp.failed')""",
    ),
    (
        # The same index, its condition said without an IN list of three: SQLite checks
        # it on every insert of an event, and for such a list it builds (and drops) a
        # temporary b-tree each time, ~10 an insert's cost (issue 14). The rows it
        # indexes are the same; ``MCP_EVENTS`` is the condition its reader says.
        "DROP INDEX events_mcp",
        f"CREATE INDEX events_mcp ON events(seq) WHERE {MCP_EVENTS}",
    ),
)

SCHEMA_VERSION: Final = len(MIGRATIONS)

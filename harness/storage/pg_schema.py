"""The PostgreSQL ledger's schema (DESIGN §14), versioned in ``harness_schema``.

The same tables as the SQLite schema (harness/storage/schema.py), in PostgreSQL's types,
plus ``leases``: which daemon runs which session. Each migration is a list of
statements run in one transaction, under an advisory lock, so daemons starting together
migrate once. Text keys use the "C" collation: ids are ordered byte by byte, as SQLite
orders them, whatever the database's locale.

``events.seq`` is not a sequence: every append takes one advisory lock and numbers its
events after ``max(seq)``, so seqs are global, gapless and committed in order. A reader
that has seen seq N has seen every event before it.
"""

from __future__ import annotations

from typing import Final

_KEY = 'TEXT COLLATE "C"'

PG_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        f"""CREATE TABLE events (
            seq BIGINT PRIMARY KEY,
            ts DOUBLE PRECISION NOT NULL,
            session_id {_KEY} NOT NULL,
            type {_KEY} NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX events_session ON events(session_id, seq)",
        # MCP servers' process groups and their ends, read at every start (as SQLite's).
        """CREATE INDEX events_mcp ON events(seq)
            WHERE type IN ('mcp.process', 'mcp.exited', 'mcp.failed')""",
        f"""CREATE TABLE sessions (
            id {_KEY} PRIMARY KEY,
            parent_id {_KEY},
            status {_KEY} NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            seq BIGINT NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX sessions_status ON sessions(status)",
        "CREATE INDEX sessions_parent ON sessions(parent_id)",
        f"""CREATE TABLE messages (
            id {_KEY} PRIMARY KEY,
            session_id {_KEY} NOT NULL,
            role {_KEY} NOT NULL,
            seq BIGINT NOT NULL,
            created_seq BIGINT NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX messages_session ON messages(session_id, seq)",
        "CREATE INDEX messages_order ON messages(session_id, created_seq)",
        f"""CREATE TABLE parts (
            id {_KEY} PRIMARY KEY,
            session_id {_KEY} NOT NULL,
            message_id {_KEY} NOT NULL,
            type {_KEY} NOT NULL,
            status {_KEY},
            seq BIGINT NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX parts_session ON parts(session_id, seq)",
        "CREATE INDEX parts_message ON parts(message_id)",
        f"""CREATE TABLE inbox (
            id {_KEY} PRIMARY KEY,
            session_id {_KEY} NOT NULL,
            delivery {_KEY} NOT NULL,
            seq BIGINT NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX inbox_session ON inbox(session_id, seq)",
        f"""CREATE TABLE blobs (
            hash {_KEY} PRIMARY KEY,
            size BIGINT NOT NULL,
            data BYTEA NOT NULL
        )""",
        f"""CREATE TABLE file_changes (
            seq BIGINT NOT NULL,
            session_id {_KEY} NOT NULL,
            message_id {_KEY} NOT NULL,
            call_id {_KEY} NOT NULL,
            kind {_KEY} NOT NULL,
            path {_KEY} NOT NULL,
            before {_KEY},
            after {_KEY},
            done INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (call_id, path)
        )""",
        "CREATE INDEX file_changes_session ON file_changes(session_id, seq)",
        f"""CREATE TABLE approvals (
            project {_KEY} NOT NULL,
            permission {_KEY} NOT NULL,
            pattern {_KEY} NOT NULL,
            created DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (project, permission, pattern)
        )""",
        f"""CREATE TABLE turns (
            message_id {_KEY} PRIMARY KEY,
            session_id {_KEY} NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            resumes INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX turns_session ON turns(session_id)",
        f"""CREATE TABLE todos (
            session_id {_KEY} PRIMARY KEY,
            seq BIGINT NOT NULL,
            data TEXT NOT NULL
        )""",
        # Who runs a session: its owner (a daemon's id), the epoch every write of that
        # owner carries, and when the lease lapses (the database's clock, seconds).
        # expires = 0: given back (the turn ended); the row stays, so epochs only grow.
        f"""CREATE TABLE leases (
            session_id {_KEY} PRIMARY KEY,
            owner {_KEY} NOT NULL,
            epoch BIGINT NOT NULL,
            expires DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX leases_expires ON leases(expires)",
    ),
    (
        # Which daemon has a live subscriber for which session ('*': every session), and
        # the channel it hears live events (streaming deltas) on: the daemon that runs
        # a session sends them only there (harness/storage/pg_live.py). Soft state,
        # renewed like a lease, so UNLOGGED: a crash of the server loses nothing durable.
        f"""CREATE UNLOGGED TABLE watchers (
            channel {_KEY} NOT NULL,
            session_id {_KEY} NOT NULL,
            expires DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (channel, session_id)
        )""",
    ),
    (
        # A commit is one round trip (harness/storage/postgres.py, ``_append_in_one``):
        # sent before anything is read, it assumes its fences hold, its sessions exist
        # and its prompts' claims take no lease from another daemon. A statement that
        # finds one untrue raises with the SQLSTATE that says which (``_REFUSALS``): the
        # transaction aborts, nothing is written, and the writer makes the commit again
        # in two round trips, deciding each request.
        """CREATE FUNCTION harness_refuse(code TEXT, message TEXT) RETURNS BIGINT
            LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
                RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
            END $$""",
        # The commit's head: the append lock; the fenced sessions' leases share-locked
        # until the commit (a claim cannot slip in between) and each checked against
        # the epoch it was written with; the sessions it needs; then max(seq), kept for
        # the transaction in ``harness.base``, from which its seqs are numbered. In a
        # function, its statements are planned once per connection, not at each commit.
        """CREATE FUNCTION harness_append_begin(
                lock_key BIGINT, fenced TEXT[], epochs BIGINT[], writer TEXT, needed TEXT[]
            ) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
            DECLARE
                base BIGINT;
            BEGIN
                PERFORM pg_advisory_xact_lock(lock_key);
                IF cardinality(fenced) > 0 THEN
                    PERFORM 1 FROM leases WHERE session_id = ANY(fenced) FOR SHARE;
                    IF EXISTS (SELECT 1 FROM leases l
                               JOIN unnest(fenced, epochs) AS f(session_id, epoch)
                               ON f.session_id = l.session_id
                               WHERE l.owner <> writer OR l.epoch <> f.epoch) THEN
                        RAISE EXCEPTION USING ERRCODE = 'HX001', MESSAGE = 'fenced';
                    END IF;
                END IF;
                IF cardinality(needed) > 0 AND EXISTS (
                        SELECT 1 FROM unnest(needed) AS r(id)
                        WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = r.id)) THEN
                    RAISE EXCEPTION USING ERRCODE = 'HX002', MESSAGE = 'missing';
                END IF;
                SELECT coalesce(max(seq), 0) INTO base FROM events;
                PERFORM set_config('harness.base', CAST(base AS TEXT), true);
                RETURN base;
            END $$""",
    ),
)

PG_SCHEMA_VERSION: Final = len(PG_MIGRATIONS)

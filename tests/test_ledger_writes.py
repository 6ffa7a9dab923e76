"""What a step's commit costs the SQLite ledger (issue 14): statements and WAL pages.

A `read` step commits ~10 events in one transaction. Its assistant message is created
then updated, its tool part written pending, running and completed: each row is now
written once a commit, as of its last event (every event is still appended). The
session's row, rewritten every step with the same status and parent, leaves their
index entries alone. Counted, not timed: the statements a commit runs (apsw's
``exec_trace``) and the pages it appends to the WAL (``setwalhook``).
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from harness.messages.events import NewEvent
from harness.messages.model import (
    AssistantMessage,
    Session,
    StepStartPart,
    ToolCompleted,
    ToolPart,
    ToolPending,
    ToolRunning,
)
from harness.storage.ledger import Ledger, stored_text
from harness.storage.schema import MCP_EVENTS, MIGRATIONS, SCHEMA_VERSION


@asynccontextmanager
async def _running(ledger: Ledger) -> AsyncIterator[Ledger]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        try:
            yield ledger
        finally:
            ledger.close_writer()
    ledger.close()


def _session(session_id: str = "ses_a", **update: Any) -> Session:
    now = time.time()
    session = Session(id=session_id, directory="/tmp", model="scripted:x", created=now, updated=now)
    return session.model_copy(update=update)


def _step(session: Session, index: int) -> list[NewEvent]:
    """The events of one `read` step, as the runner and the tool executor make them."""
    message = AssistantMessage(
        id=f"msg_{index:04d}", session_id=session.id, parent_id="msg_user", agent="build",
        model="scripted:x", step=index, created=1.0,
    )  # fmt: skip
    start = StepStartPart(
        id=f"prt_{index:04d}a", session_id=session.id, message_id=message.id, step=index
    )
    tool = ToolPart(
        id=f"prt_{index:04d}b", session_id=session.id, message_id=message.id,
        call_id=f"call_{index}", tool="read", state=ToolPending(),
    )  # fmt: skip
    running = tool.model_copy(update={"state": ToolRunning(input={"path": "f"}, start=1.0)})
    done = ToolCompleted(input={"path": "f"}, output="line 1\n" * 40, start=1.0, end=2.0)
    finished = message.model_copy(update={"finish": "tool_calls"})
    return [
        NewEvent.of("message.created", session.id, message),
        NewEvent.of("part.created", session.id, start),
        NewEvent.of("part.created", session.id, tool),
        NewEvent.of("message.updated", session.id, finished),
        NewEvent.of("session.updated", session.id, session),
        NewEvent("permission.decided", session.id, {"call_id": f"call_{index}"}),
        NewEvent.of("part.updated", session.id, running),
        NewEvent.of("part.updated", session.id, tool.model_copy(update={"state": done})),
    ]


def _statements(ledger: Ledger) -> list[str]:
    seen: list[str] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        seen.append(sql.split("(")[0].strip())
        return True

    ledger._write.exec_trace = trace
    return seen


async def test_a_step_writes_each_message_and_part_row_once(tmp_path: Path) -> None:
    session = _session(status="busy")
    async with _running(Ledger(tmp_path / "ledger.db")) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        seen = _statements(ledger)
        committed = await ledger.write(_step(session, 1))
        ledger._write.exec_trace = None
        # Every event is appended...
        assert seen.count("INSERT INTO events") == 8
        assert [e.seq for e in ledger.events_after(1)] == [e.seq for e in committed]
        # ...but the message's row and each part's are written once: 3 upserts, not 6.
        assert seen.count("INSERT INTO messages") == 1
        assert seen.count("INSERT INTO parts") == 2
        # The rows are those of their last events; a message keeps its first seq.
        first, last = committed[0].seq, committed[3].seq
        rows = ledger._rows("SELECT seq, created_seq, data FROM messages WHERE id = 'msg_0001'")
        assert rows[0][:2] == (last, first)
        assert json.loads(rows[0][2])["finish"] == "tool_calls"
        parts = ledger._rows("SELECT id, status, seq FROM parts ORDER BY id")
        assert parts == [
            ("prt_0001a", None, committed[1].seq),
            ("prt_0001b", "completed", committed[7].seq),
        ]
        assert ledger.changes(session.id, 0)[0][0].finish == "tool_calls"
        transcript = ledger.messages(session.id)
        assert [p.id for p in transcript[0].parts] == ["prt_0001a", "prt_0001b"]
        tool = transcript[0].parts[1]
        assert isinstance(tool, ToolPart) and isinstance(tool.state, ToolCompleted)
        assert ledger.open_tool_parts(session.id) == []


async def test_rows_held_back_are_written_before_a_deletion_of_their_session(
    tmp_path: Path,
) -> None:
    session = _session()
    async with _running(Ledger(tmp_path / "ledger.db")) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        again = _session(status="busy")
        await ledger.write(
            [
                *_step(session, 1),
                NewEvent("session.deleted", session.id, {"id": session.id}),
                NewEvent.of("session.created", session.id, again),
                *_step(again, 2)[:3],
            ]
        )
        # The first step's rows went with the deletion; the second step's are there.
        assert ledger._rows("SELECT id FROM messages") == [("msg_0002",)]
        assert [row[0] for row in ledger._rows("SELECT id FROM parts ORDER BY id")] == [
            "prt_0002a",
            "prt_0002b",
        ]
        status = ledger._rows("SELECT status FROM parts WHERE id = 'prt_0002b'")
        assert status == [("pending",)]


def _frames(ledger: Ledger) -> list[int]:
    """The WAL's pages after each commit (no checkpoint between them)."""
    pages_after: list[int] = []

    def hook(conn: apsw.Connection, name: str, pages: int) -> int:
        pages_after.append(pages)
        return apsw.SQLITE_OK

    ledger._write.wal_autocheckpoint(0)
    ledger._write.setwalhook(hook)
    return pages_after


async def test_a_session_row_rewritten_as_it_was_leaves_its_index_entries(
    tmp_path: Path,
) -> None:
    session = _session(status="busy")
    async with _running(Ledger(tmp_path / "ledger.db")) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        pages = _frames(ledger)
        await ledger.write([NewEvent("permission.decided", session.id, {})])  # the start
        kept = session.model_copy(update={"title": "a title", "updated": 2.0})
        await ledger.write([NewEvent.of("session.updated", session.id, kept)])
        idle = kept.model_copy(update={"status": "idle", "updated": 3.0})
        await ledger.write([NewEvent.of("session.updated", session.id, idle)])
        busy = idle.model_copy(update={"status": "busy", "updated": 4.0})
        await ledger.write([NewEvent.of("session.updated", session.id, busy)])
        frames = [after - before for before, after in itertools.pairwise(pages)]
        # Its status and parent as they were: the row's page, not their index pages too.
        assert frames[0] == frames[2] - 2, frames
        assert frames[1] == frames[2], frames
        assert ledger.session(session.id) == busy
        assert [s.id for s in ledger.sessions("busy")] == [session.id]
        assert ledger.sessions("idle") == []
        # A parent set later is taken too, and found by its index.
        child = busy.model_copy(update={"parent_id": "ses_p", "updated": 5.0})
        await ledger.write([NewEvent.of("session.updated", session.id, child)])
        assert [s.id for s in ledger.children("ses_p")] == [session.id]
        assert ledger._rows("SELECT updated FROM sessions") == [(5.0,)]


@pytest.mark.parametrize(
    "data",
    [
        {"text": "é \u2028 \x1f \"q\" \\ 😀", "n": 10**30, "f": 1e-05, "g": -0.0},
        {"inf": float("inf"), "ninf": float("-inf"), "list": [1, 2.5, None, True]},
        {"nested": {"a": [{"b": "c"}], "t": (1, 2)}, "big": 2**63},
    ],
)
def test_an_event_is_stored_as_the_json_of_its_data(data: dict[str, Any]) -> None:
    stored, text = stored_text(data)
    assert stored is data
    assert json.loads(text) == json.loads(json.dumps(data))


def test_a_lone_surrogate_is_stored_as_shown() -> None:
    stored, text = stored_text({"path": "bad\udcffname", "n": 1})
    assert stored == {"path": "bad\\xffname", "n": 1}
    assert json.loads(text) == stored
    text.encode("utf-8")  # SQLite stores text: UTF-8


async def test_a_steps_commit_makes_no_worker_thread_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's batch commits on the event loop's thread (a thread's round trip cost
    about what the commit itself does); one with file contents to compress, one of
    many sessions' steps, and every one that syncs to disk still on a worker thread."""
    threads: list[str] = []
    commit = Ledger._commit
    loop_thread = threading.get_ident()

    def where(self: Ledger, batch: Any) -> Any:
        threads.append("loop" if threading.get_ident() == loop_thread else "worker")
        return commit(self, batch)

    monkeypatch.setattr(Ledger, "_commit", where)
    session = _session(status="busy")
    async with _running(Ledger(tmp_path / "ledger.db")) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        await ledger.write(_step(session, 1))
        await ledger.write([], blobs=[("ab" * 32, b"contents")])
        many = [event for index in range(2, 12) for event in _step(session, index)]
        await ledger.write(many)
        assert threads == ["loop", "loop", "worker", "worker"]
        assert len(ledger.messages(session.id)) == 11
    threads.clear()
    async with _running(Ledger(tmp_path / "full.db", durability="full")) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        await ledger.write(_step(session, 1))
    assert threads == ["worker", "worker"]


async def test_the_wal_is_checkpointed_off_the_event_loop_and_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints: list[bool] = []
    checkpoint = Ledger._checkpoint
    loop_thread = threading.get_ident()

    def where(self: Ledger) -> None:
        checkpoints.append(threading.get_ident() == loop_thread)
        checkpoint(self)

    monkeypatch.setattr(Ledger, "_checkpoint", where)
    path = tmp_path / "ledger.db"
    session = _session(status="busy")
    async with _running(Ledger(path)) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        sizes: list[int] = []
        for index in range(600):  # ~10 pages a commit: ~6,000 pages in all
            done = {"id": session.id, "output": f"{index}: " + "x" * 30_000}
            await ledger.write([NewEvent("permission.decided", session.id, done)])
            sizes.append(ledger._wal_pages)
            while ledger._checkpointing.locked():  # a model's wait, longer than it
                await trio.sleep(0.001)
        assert len(checkpoints) >= 5 and not any(checkpoints)
        # Each time the WAL started again, at the commit after a checkpoint.
        starts = [index for index in range(1, 600) if sizes[index] < sizes[index - 1]]
        assert len(starts) >= 5 and max(sizes) < 1000 + 20, (starts, max(sizes))
        assert ledger.last_seq() == 601
    reopened = Ledger(path)
    assert len(reopened.events_after(0, limit=1000)) == 601
    reopened.close()
    assert not path.with_name("ledger.db-wal").exists()


async def test_a_checkpoint_that_could_not_copy_the_whole_wal_is_caught_up_by_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint beside the commits may not copy the whole WAL: commits came while it
    ran (a loop that never waits), or, as here, a reader still reads an older state.
    Then the commit after it checkpoints the rest itself, on a worker thread, as
    SQLite's own auto-checkpoint did, and the WAL starts again; not 1,000 pages later."""
    catch_ups: list[bool] = []
    commit_and_checkpoint = Ledger._commit_and_checkpoint
    loop_thread = threading.get_ident()

    def counted(self: Ledger, batch: Any) -> Any:
        catch_ups.append(threading.get_ident() == loop_thread)
        return commit_and_checkpoint(self, batch)

    monkeypatch.setattr(Ledger, "_commit_and_checkpoint", counted)
    path = tmp_path / "ledger.db"
    session = _session(status="busy")
    async with _running(Ledger(path)) as ledger:
        await ledger.write([NewEvent.of("session.created", session.id, session)])
        index = 0

        async def commit() -> int:
            nonlocal index
            index += 1
            done = {"id": session.id, "output": f"{index}: " + "x" * 30_000}
            await ledger.write([NewEvent("permission.decided", session.id, done)])
            return ledger._wal_pages

        reader = apsw.Connection(str(path))
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchall()  # holds what it read
        while ledger._checkpoint_mark == 0:  # until the first checkpoint started
            await commit()
            assert index < 500
        while ledger._checkpointing.locked():
            await trio.sleep(0.001)
        held = [await commit() for _ in range(3)]
        assert catch_ups and not any(catch_ups)  # on a worker thread, and none could
        assert held == sorted(held)  # copy what the reader may still read
        reader.execute("COMMIT")
        reader.close()
        after = [await commit() for _ in range(3)]
        assert min(after) < 100 < held[-1], (held, after)  # the WAL started again
        assert ledger.last_seq() == 1 + index


def test_a_ctrl_c_during_a_commit_on_the_loop_lets_it_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a worker thread nothing could cut a commit short; on the loop's thread a
    Ctrl-C waits for its end, then stops the run as any Ctrl-C does."""
    commit = Ledger._commit

    def interrupted(self: Ledger, batch: Any) -> Any:
        signal.raise_signal(signal.SIGINT)  # as a user's Ctrl-C, in the middle
        return commit(self, batch)

    path = tmp_path / "ledger.db"
    session = _session(status="busy")

    async def main() -> None:
        async with _running(Ledger(path)) as ledger:
            await ledger.write([NewEvent.of("session.created", session.id, session)])
            monkeypatch.setattr(Ledger, "_commit", interrupted)
            await ledger.write(_step(session, 1))
            await trio.sleep(1)

    with pytest.raises(BaseException) as caught:  # a KeyboardInterrupt, in a group or not
        trio.run(main)
    error = caught.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, KeyboardInterrupt)
    assert "sleep" in "".join(traceback.format_tb(error.__traceback__))  # not in _commit
    monkeypatch.undo()
    reopened = Ledger(path, read_only=True)
    assert [m.info.id for m in reopened.messages(session.id)] == ["msg_0001"]
    reopened.close()


def test_an_event_insert_builds_no_temporary_table_and_mcp_records_keep_their_index(
    tmp_path: Path,
) -> None:
    """The partial index on MCP process events is checked at every insert of an event:
    said with an IN list of three, SQLite built a temporary b-tree for it each time
    (migration 3 says it without one). A ledger of version 2 is migrated; its MCP
    records are still found, through the index."""
    path = tmp_path / "ledger.db"
    conn = apsw.Connection(str(path))
    with conn:
        for statement in itertools.chain(*MIGRATIONS[:2]):
            conn.execute(statement)
        conn.execute("PRAGMA user_version=2")
    insert = "INSERT INTO events(ts, session_id, type, data) VALUES (?, ?, ?, ?)"
    process = {"server": "s", "process": {"pgid": 7}}
    for kind, data in [
        ("mcp.process", process),
        ("part.updated", {"id": "prt_1"}),
        ("mcp.process", {"server": "t", "process": {"pgid": 8}}),
        ("mcp.exited", {"server": "t", "process": {"pgid": 8}}),
    ]:
        conn.execute(insert, (1.0, "ses_a", kind, json.dumps(data)))
    conn.close()
    ledger = Ledger(path)
    try:
        assert ledger._rows("PRAGMA user_version") == [(SCHEMA_VERSION,)]
        assert ledger.mcp_processes() == [("ses_a", "s", process)]
        plan = ledger._rows(
            f"EXPLAIN QUERY PLAN SELECT session_id, type, data FROM events WHERE {MCP_EVENTS}"
            " ORDER BY seq"
        )
        assert any("events_mcp" in row[-1] for row in plan), plan
        program = ledger._write.execute("EXPLAIN " + insert, (1.0, "s", "t", "{}")).fetchall()
        assert "OpenEphemeral" not in [row[1] for row in program]
    finally:
        ledger.close()


def test_an_event_of_a_model_holds_its_json_dump() -> None:
    """``NewEvent.of`` serializes without ``model_dump``'s frame: the same data."""
    session = _session(status="busy", title="é \udcff")
    message = AssistantMessage(
        id="msg_1", session_id=session.id, parent_id="msg_user", agent="build",
        model="scripted:x", step=1, created=1.0, cost=float("inf"),
    )  # fmt: skip
    tool = ToolPart(
        id="prt_1", session_id=session.id, message_id=message.id, call_id="c", tool="read",
        state=ToolCompleted(input={"path": "f"}, output="x\n", start=1.0, end=2.0),
    )  # fmt: skip
    for model in (session, message, tool):
        assert NewEvent.of("part.updated", session.id, model).data == model.model_dump(mode="json")

"""A prompt's, a remote wake's and the tail's fixed cost (issue 18): a prompt checks its
session in its own commit instead of reading it first; a daemon that hears of input
another daemon took neither reads nor claims the session in vain, and its orphan scan
leaves fresh input to the daemon it was sent to; a tail with no subscriber reads no
commit it would leave out. What must hold meanwhile: an unknown or deleted session is
refused and nothing is written, no prompt is lost. Skipped (saying why) without a test
database; run under CI. The ledger's own check is in tests/test_ledger.py."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import trio
from test_ledger_postgres import _created, _titled, daemon

from harness.config import Config
from harness.messages.events import NewEvent
from harness.storage import port


def _inbox_added(session_id: str, message_id: str = "msg_1") -> NewEvent:
    item = {"id": message_id, "session_id": session_id, "text": "go", "delivery": "queue",
            "created": time.time()}  # fmt: skip
    return NewEvent("inbox.added", session_id, item)


def _config(tmp_path: Path, schema: str, name: str, **extra: Any) -> Config:
    return Config(
        home=tmp_path / f"home-{name}",
        model=f"scripted:{tmp_path / 'model.json'}",
        ledger=schema,
        interactive=False,
        sandbox="off",
        **extra,
    )


async def test_a_prompt_reads_nothing_before_its_commit(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain prompt on a shared ledger makes no read of its own (its session is
    checked by its commit); a prompt to an unknown session is still refused as such,
    writing nothing."""
    from harness.runtime import UnknownSession, open_harness
    from harness.storage import postgres

    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)
    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}]))
    async with open_harness(_config(tmp_path, postgres_schema, "a")) as h:
        ledger = h.ledger
        session = await h.create_session(tmp_path)
        reads: list[str] = []
        rows = ledger._rows

        def recorded(sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
            if any(f.filename.endswith("runtime.py") for f in traceback.extract_stack()):
                reads.append(sql)
            return rows(sql, args)

        monkeypatch.setattr(ledger, "_rows", recorded)
        monkeypatch.setattr(ledger, "driven_reads", False)  # every read through ``_rows``
        result = await h.run(session.id, "go")
        assert result.answer == "one"
        assert port._SESSION not in reads
        last = ledger.last_seq()
        with pytest.raises(UnknownSession):
            await h.prompt("ses_nope", "go")
        assert ledger.last_seq() == last and ledger.inbox("ses_nope") == []


async def test_input_another_daemon_took_makes_no_claim_here(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemon A takes a prompt for its session: daemon B hears of it (its tail) and
    neither reads the session nor claims it (it used to, at every prompt A took, in
    vain). A prompt sent through B while A runs the session still reaches A's turn."""
    from harness.runtime import open_harness
    from harness.storage import postgres

    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)  # only the actors' claims
    script = [{"text": "one", "delay": 1.0}, {"text": "two"}]
    (tmp_path / "model.json").write_text(json.dumps(script))
    async with (
        open_harness(_config(tmp_path, postgres_schema, "a", lease_seconds=60.0)) as a,
        open_harness(_config(tmp_path, postgres_schema, "b", lease_seconds=60.0)) as b,
    ):
        claims: list[str] = []
        claim_sync = b.ledger._claim_sync  # type: ignore[attr-defined]

        def counted(session_id: str, reads: bool = False) -> Any:
            claims.append(session_id)
            return claim_sync(session_id, reads)

        monkeypatch.setattr(b.ledger, "_claim_sync", counted)
        session = await a.create_session(tmp_path)
        async with a.subscribe(session.id) as events:
            await a.prompt(session.id, "first")
            with trio.fail_after(10):
                while b.ledger.inbox_mark(session.id) == 0:  # B's tail has read it
                    await trio.sleep(0.02)
            # Then B's supervisor had the wake: let it act on it, if it would.
            await trio.sleep(0.3)
            assert claims == []
            assert session.id not in b._supervisor._actors
            # Through B, while A's turn runs: queued after it, and run by A.
            await b.prompt(session.id, "second")
            finished: list[str] = []
            with trio.fail_after(20):
                async for event in events:
                    if event.type == "turn.finished":
                        finished.append(event.data["answer"])
                        if len(finished) == 2:
                            break
        assert finished == ["one", "two"]


async def test_input_no_daemon_woke_is_run_by_the_orphan_scan(
    postgres_schema: str, tmp_path: Path
) -> None:
    """Input committed by a daemon that died before waking its session (here: a bare
    ledger, which wakes nothing) is run by another daemon, found by its orphan scan."""
    from harness.runtime import open_harness

    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}]))
    async with open_harness(_config(tmp_path, postgres_schema, "b")) as b:
        session = await b.create_session(tmp_path)
        async with b.subscribe(session.id) as events, daemon(postgres_schema) as gone:
            await gone.write([_inbox_added(session.id)], exists=session.id)
            with trio.fail_after(10):
                async for event in events:
                    if event.type == "turn.finished":
                        assert event.data["answer"] == "one"
                        break


async def test_input_on_a_free_lease_is_taken_by_the_second_scan_that_sees_it(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orphan scan takes a claimed turn, or input whose holder stopped renewing, at
    once; input on a free lease (never taken, or given back) only once the scan before
    saw the same input waiting: fresh input is being claimed by the daemon it was sent
    to. A burst of prompts used to go to whichever daemon scanned first (issue 18)."""
    from harness.storage import postgres

    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)  # only this test's scans
    async with daemon(postgres_schema, lease_seconds=600.0) as b:
        # Rows: (session, has a claimed turn, first input seq, lease expiry or 0).
        scan = b._orphans_now
        assert scan([("ses_a", False, 7, 0.0), ("ses_b", True, None, 0.0),
                     ("ses_c", False, 3, 5.0)]) == [("ses_b", True), ("ses_c", False)]  # fmt: skip
        # Still waiting: taken; new input of another session: not yet.
        assert scan([("ses_a", False, 7, 0.0), ("ses_d", False, 2, 0.0)]) == [("ses_a", False)]
        # The same session, other input (ses_d's was claimed and run meanwhile): waits.
        assert scan([("ses_d", False, 9, 0.0)]) == []
        assert scan([("ses_d", False, 9, 0.0)]) == [("ses_d", False)]
        # The scan's own query: input written where no daemon claims it, on a free lease.
        await b.write([_inbox_added("ses_e")])
        first = b._renew_sync([])[1]
        assert ("ses_e", False) not in first
        assert ("ses_e", False) in b._renew_sync([])[1]


async def test_with_no_subscriber_the_tail_reads_no_commit_it_would_leave_out(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit's NOTIFY says its seqs and whether it holds anything a daemon acts
    on. With no subscriber, another daemon's tail moves over the rest without reading
    them (it read each, to find nothing, once a commit of any other daemon); it still
    reads, and acts on, input, in one read (a second one used to find nothing more);
    and reads everything once a subscriber comes."""
    from harness.messages.mailbox import FeedMessage, Publish
    from harness.storage import postgres
    from harness.storage.port import ClusterHooks

    monkeypatch.setattr(postgres, "_POLL_SECONDS", 60.0)  # only the wake-ups read
    send, receive = trio.open_memory_channel[FeedMessage](1000)
    woken: list[str] = []
    subscribers = [0]
    reads: list[tuple[int, bool]] = []
    async with daemon(postgres_schema, send) as b, daemon(postgres_schema) as a:
        real_read = b._read_log

        def counted(after: int, filtered: bool = False) -> Any:
            reads.append((after, filtered))
            return real_read(after, filtered)

        monkeypatch.setattr(b, "_read_log", counted)
        b.hooks = ClusterHooks(
            wake=woken.append, lost=lambda _: None, subscribers=lambda: subscribers[0]
        )

        async def published(until_seq: int) -> list[int]:
            seqs: list[int] = []
            with trio.fail_after(10):
                while not seqs or seqs[-1] < until_seq:
                    message = await receive.receive()
                    if isinstance(message, Publish):
                        seqs.extend(e.seq for e in message.events if e.seq is not None)
            return seqs

        await a.write([_created("ses_a")])  # a child's parent may be here: read
        assert await published(1) == [1]
        before = len(reads)
        for index in range(5):
            await a.write([_titled("ses_a", f"t{index}")])
        with trio.fail_after(10):
            while b._heard < 6:
                await trio.sleep(0.01)
        # b's own commit, right after a's: published as it is, with no read between.
        own = await b.write([_titled("ses_b", "own")])
        assert own[0].seq == 7 and await published(7) == [7]
        assert reads[before:] == []
        await a.write([_inbox_added("ses_a")])
        with trio.fail_after(10):
            while not woken:
                await trio.sleep(0.01)
        assert woken == ["ses_a"] and await published(8) == [8]
        assert len(reads) == before + 1
        subscribers[0] = 1
        await a.write([_titled("ses_a", "followed")])
        assert await published(9) == [9]


async def test_a_prompt_takes_the_lease_in_its_own_commit(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt to a session no actor runs here: its commit also takes the lease, if
    free, and reads what the woken actor reads first, so the turn makes no claim of its
    own (a transaction fewer a turn). A lease another daemon let lapse is taken with
    the next epoch and ``session.leased`` in the same commit; one that daemon still
    holds is not taken. (An actor still here, between turns, claims as before.)"""
    import psycopg

    from harness.runtime import open_harness
    from harness.storage import postgres

    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)  # only the prompts' claims
    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    config = _config(
        tmp_path, postgres_schema, "a", lease_seconds=60.0, session_idle_seconds=0.2
    )
    async with open_harness(config) as h:
        ledger = h.ledger

        async def idle() -> None:  # its actor let go: the next prompt finds none here
            with trio.fail_after(5):
                while h._supervisor.runs(session.id):
                    await trio.sleep(0.05)

        claims: list[str] = []
        claim_sync = ledger._claim_sync  # type: ignore[attr-defined]

        def counted(session_id: str, reads: bool = False) -> Any:
            claims.append(session_id)
            return claim_sync(session_id, reads)

        monkeypatch.setattr(ledger, "_claim_sync", counted)
        reads: list[str] = []
        rows = ledger._rows

        def recorded(sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
            stack = traceback.extract_stack()
            if any(f.filename.endswith(("session.py", "supervisor.py")) for f in stack):
                reads.append(sql)
            return rows(sql, args)

        monkeypatch.setattr(ledger, "_rows", recorded)
        monkeypatch.setattr(ledger, "driven_reads", False)  # every read through ``_rows``
        session = await h.create_session(tmp_path)
        assert (await h.run(session.id, "go")).answer == "one"
        assert claims == [] and reads == []
        assert not ledger.holds(session.id)  # given back with the turn's end, as before
        # Another daemon held it and stopped renewing: taken, with the change of hands.
        await idle()
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute(
                "UPDATE leases SET owner = 'elsewhere', epoch = 7, expires = 1"
                " WHERE session_id = %s",
                (session.id,),
            )
        assert (await h.run(session.id, "again")).answer == "two"
        assert claims == []
        leased = [e.data for e in ledger.events_after(0) if e.type == "session.leased"]
        assert leased == [{"session_id": session.id, "owner": ledger.owner, "epoch": 8,
                           "from": "elsewhere"}]  # fmt: skip
        # Held by another daemon, not lapsed: the prompt's commit leaves it alone.
        await idle()
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute(
                "UPDATE leases SET owner = 'elsewhere', epoch = 9,"
                " expires = extract(epoch FROM clock_timestamp()) + 60 WHERE session_id = %s",
                (session.id,),
            )
        await h.prompt(session.id, "held")
        with trio.fail_after(10):
            while not claims:  # the actor's own claim, refused: held elsewhere
                await trio.sleep(0.02)
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            row = conn.execute(
                "SELECT owner, epoch FROM leases WHERE session_id = %s", (session.id,)
            ).fetchone()
        assert row == ("elsewhere", 9) and not ledger.holds(session.id)

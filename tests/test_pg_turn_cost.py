"""A turn's fixed cost on the PostgreSQL ledger (issue 18): what a turn's claim, start
and end write and read, counted, and what must hold while they are cut. Skipped (saying
why) without a test database; run under CI."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import trio
from test_ledger_postgres import _created, _titled, daemon

from harness.config import Config
from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import WriteEvents
from harness.storage.port import LedgerFenced
from harness.storage.postgres import _CHANGES, PostgresLedger


def _scripted_config(tmp_path: Path, schema: str, **extra: Any) -> Config:
    """A harness on the test's schema whose model is tmp_path/model.json's script, or
    whatever ``provider_factory`` in ``extra`` makes."""
    script = f"scripted:{tmp_path / 'model.json'}"
    model = "scripted:unused" if "provider_factory" in extra else script
    return Config(
        home=tmp_path / "home",
        model=model,
        ledger=schema,
        interactive=False,
        sandbox="off",
        **extra,
    )


async def test_a_lease_given_back_with_the_last_writes_rides_their_transaction(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's lease goes back in the same transaction as its last events (issue 18),
    not in one of its own on the control connection that every claim waits for. Another
    daemon may claim it at once; a stale release (another daemon took the lease since)
    changes nothing."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a")])
        epoch = await a.claim("ses_a")
        assert epoch is not None

        def no_release_transaction(held: object) -> None:
            raise AssertionError("a release made a transaction of its own")

        monkeypatch.setattr(a, "_release_sync", no_release_transaction)
        batches: list[list[WriteEvents]] = []
        commit = a._commit

        def counting(batch: list[WriteEvents]) -> list[list[Event] | LedgerFenced]:
            batches.append(batch)
            return commit(batch)

        monkeypatch.setattr(a, "_commit", counting)
        a.post([_titled("ses_a", "last")], fence=("ses_a", epoch))
        a.post_release("ses_a")
        assert not a.holds("ses_a")  # not renewed from now on
        await a.settle("ses_a")
        assert a.session("ses_a").title == "last"  # type: ignore[union-attr]
        released = [b for b in batches if any(request.release for request in b)]
        assert len(released) == 1 and any(r.events for r in released[0])  # one transaction
        assert await b.claim("ses_a") == epoch + 1
        # a's stale lease, given back late: b's lease is untouched.
        a._held["ses_a"] = epoch
        a.post_release("ses_a")
        await a.settle("ses_a")
        assert await a.claim("ses_a") is None


async def test_a_turn_gives_its_lease_back_with_its_last_events(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-turn prompt on a shared ledger: the lease is free once the turn has ended,
    with no release transaction of its own; a second prompt claims it again and runs."""
    import json

    from harness.runtime import open_harness

    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    config = _scripted_config(tmp_path, postgres_schema)
    async with open_harness(config) as h:
        ledger = h.ledger
        assert isinstance(ledger, PostgresLedger)
        releases: list[object] = []
        release_sync = ledger._release_sync

        def recorded(held: object) -> None:
            releases.append(held)
            release_sync(held)  # type: ignore[arg-type]

        monkeypatch.setattr(ledger, "_release_sync", recorded)
        session = await h.create_session(tmp_path)
        first = await h.run(session.id, "first")
        assert first.answer == "one"
        await ledger.settle(session.id)
        assert not ledger.holds(session.id)
        row = ledger._rows("SELECT owner, expires FROM leases WHERE session_id = ?", (session.id,))
        assert row == [(ledger.owner, 0.0)]
        second = await h.run(session.id, "second")
        assert second.answer == "two"
        assert releases == []


async def test_a_claim_reads_the_sessions_turns_inbox_and_row_in_its_round_trip(
    postgres_schema: str,
) -> None:
    """What a session actor reads once it holds the lease comes with the claim (issue
    18), read after the lease was taken; a claim that does not get the lease reads
    nothing."""
    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        item = {"id": "msg_1", "session_id": "ses_a", "text": "go", "delivery": "queue",
                "created": time.time()}  # fmt: skip
        await a.write([_created("ses_a"), NewEvent("inbox.added", "ses_a", item)])
        mark = a.inbox_mark("ses_a")
        assert mark != 0
        epoch, reads = await a.claim_with_reads("ses_a")
        assert epoch == 1 and reads is not None
        assert reads.mark == mark
        assert [i.id for i in reads.inbox] == ["msg_1"]
        assert reads.session is not None and reads.session.id == "ses_a"
        assert reads.turns == []
        assert await b.claim_with_reads("ses_a") == (None, None)  # held by a
        epoch, reads = await a.claim_with_reads("ses_gone")
        assert epoch == 1 and reads is not None
        assert (reads.inbox, reads.session, reads.turns) == ([], None, [])


async def test_a_turn_on_a_fresh_actor_reads_no_turns_inbox_or_row_of_its_own(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt to an idle session: the actor's claim brings the claimed turns, the
    inbox and the session row, so the only read of the row is the prompt's own."""
    import json

    from harness.runtime import open_harness
    from harness.storage import port, postgres

    # The orphan scan may take the prompted session for this daemon before its actor
    # claims it (then the actor reads as before): not during this count.
    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)

    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}]))
    config = _scripted_config(tmp_path, postgres_schema, lease_seconds=180.0)
    async with open_harness(config) as h:
        ledger = h.ledger
        session = await h.create_session(tmp_path)
        reads: list[str] = []  # the session actor's own (its turn's runner included)
        rows = ledger._rows

        def recorded(sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
            # Not the supervisor's look at a session its tail heard of (a commit of this
            # daemon's read back from the log counts as heard, under load).
            if any(f.filename.endswith("session.py") for f in traceback.extract_stack()):
                reads.append(sql)
            return rows(sql, args)

        monkeypatch.setattr(ledger, "_rows", recorded)
        monkeypatch.setattr(ledger, "driven_reads", False)  # every read through ``_rows``
        result = await h.run(session.id, "go")
        assert result.answer == "one"
        assert port._SESSION not in reads  # the prompt's (runtime.py) is the only one
        assert port._INBOX not in reads
        assert port._SESSION_TURNS not in reads
        # The turn's history came with the claim too, and its step's own commits are
        # kept for it as committed: no read of its changes at all.
        assert reads.count(_CHANGES) == 0


async def test_a_fresh_actor_sends_the_history_its_claim_read_as_a_read_would(
    postgres_schema: str, tmp_path: Path
) -> None:
    """A later turn through a fresh actor (the first one let go when idle) starts from
    the history its claim read, plus the turn's own first events: the model sees the
    whole conversation, steps and tool results included, as a fresh read shows it."""
    import json

    from harness.providers.scripted import ScriptedProvider
    from harness.runtime import open_harness

    (tmp_path / "notes.txt").write_text("alpha\n")
    made: list[ScriptedProvider] = []
    turns = [
        {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
        {"text": "first"},
        {"text": "second"},
    ]

    def factory(model: str) -> ScriptedProvider:
        made.append(ScriptedProvider.from_turns(turns, record=True))
        return made[-1]

    config = _scripted_config(
        tmp_path, postgres_schema, provider_factory=factory, session_idle_seconds=0.2
    )
    async with open_harness(config) as h:
        session = await h.create_session(tmp_path)
        assert (await h.run(session.id, "one")).answer == "first"
        with trio.fail_after(5):
            while session.id in h._supervisor._actors:  # let go when idle: the next is fresh
                await trio.sleep(0.05)
        second = await h.run(session.id, "two")
        assert second.answer == "second", second
    assert len(made) == 2
    seen = made[1].requests[0].messages
    expected = made[0].requests[-1].messages
    assert len(seen) == len(expected) + 2  # the first answer, then the second prompt
    assert seen[: len(expected)] == expected
    assert json.dumps([str(m) for m in seen]).count("alpha") == 1  # the read's output


KEY = "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"  # found only as a value (tests/test_secrets.py)


async def test_a_multi_step_turn_sends_what_a_read_gives_and_reads_no_changes(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn of several steps on a shared ledger (issue 18): each step's catch-up
    applies the writer's own commits, kept for it as committed, instead of reading its
    changes back. At every catch-up its history gives the model what a fresh read gives
    (a large tool output saved aside, a file written with its snapshots, a redacted
    key), and the turn makes no read of its changes at all."""
    import json

    from harness import secrets
    from harness.history import History
    from harness.providers.scripted import ScriptedProvider
    from harness.runtime import open_harness
    from harness.storage import postgres

    monkeypatch.setattr(postgres, "ORPHAN_SCAN_SECONDS", 60.0)  # the actor's own claim
    monkeypatch.setenv("MISTRAL_API_KEY", KEY)
    (tmp_path / "big.txt").write_text("".join(f"line {i} of a long file\n" for i in range(6000)))
    (tmp_path / ".env").write_text(f"MISTRAL_API_KEY={KEY}\n")
    turns = [
        {"tool_calls": [{"name": "read", "arguments": {"path": "big.txt"}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "seq 1 40000; cat .env"}}]},
        {"tool_calls": [{"name": "write", "arguments": {"path": "out.txt", "content": "x\n"}}]},
        {"text": "done"},
    ]
    made: list[ScriptedProvider] = []

    def factory(model: str) -> ScriptedProvider:
        made.append(ScriptedProvider.from_turns(turns, record=True))
        return made[-1]

    compared: list[int] = []
    catch_up = History.catch_up
    checking = False

    async def checked(self: History) -> None:
        nonlocal checking
        await catch_up(self)
        fresh = History(self._ledger, self.session_id)
        checking = True  # the test's own read, not counted
        fresh._apply(*self._ledger.changes(self.session_id, 0))  # a read, not followed
        checking = False
        assert self.chat() == fresh.chat()
        assert self.chat(prune_protect=100) == fresh.chat(prune_protect=100)
        assert self.mark == fresh.mark
        compared.append(len(fresh.chat()))

    monkeypatch.setattr(History, "catch_up", checked)
    config = _scripted_config(
        tmp_path, postgres_schema, provider_factory=factory, yes=True, lease_seconds=180.0
    )
    try:
        async with open_harness(config) as h:
            ledger = h.ledger
            session = await h.create_session(tmp_path)
            reads: list[str] = []
            rows = ledger._rows

            def recorded(sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
                stack = traceback.extract_stack()
                if not checking and any(f.filename.endswith("runner.py") for f in stack):
                    reads.append(sql)
                return rows(sql, args)

            monkeypatch.setattr(ledger, "_rows", recorded)
            monkeypatch.setattr(ledger, "driven_reads", False)  # every read through ``_rows``
            result = await h.run(session.id, "go")
            assert result.answer == "done", result
            assert reads.count(_CHANGES) == 0
            assert ledger._written == {}  # nothing kept once the turn is over
    finally:
        monkeypatch.delenv("MISTRAL_API_KEY")
        secrets.refresh_secrets()
    assert len(compared) >= 4 and compared == sorted(compared)  # each step, growing
    requests = made[0].requests
    assert len(requests) == 4
    shown = json.dumps([str(m) for m in requests[-1].messages])
    assert KEY not in shown and "[REDACTED:MISTRAL_API_KEY]" in shown
    assert "line 5 of a long file" in shown and "39999" in shown


async def test_a_foreign_commit_of_the_sessions_messages_makes_the_next_catch_up_read(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ledger keeps for a history is every commit since its last catch-up only
    while nothing else changed the session's messages: a commit of another daemon's,
    heard by the tail, and the next catch-up reads (and sees it); a fenced write too, and
    more kept than the bound. A commit made during a read comes again, harmlessly."""
    from harness.history import History
    from harness.messages.model import TextPart, UserMessage
    from harness.storage import port

    def user(message_id: str, text: str) -> list[NewEvent]:
        message = UserMessage(id=message_id, session_id="ses_a", agent="build", model="m",
                              created=time.time())  # fmt: skip
        part = TextPart(id=f"prt_{message_id}", session_id="ses_a", message_id=message_id,
                        text=text)  # fmt: skip
        return [NewEvent.of("message.created", "ses_a", message),
                NewEvent.of("part.created", "ses_a", part)]  # fmt: skip

    async with daemon(postgres_schema) as a, daemon(postgres_schema) as b:
        await a.write([_created("ses_a")])
        epoch = await a.claim("ses_a")
        assert epoch is not None
        history = History(a, "ses_a")
        await history.catch_up()  # a read: from here it follows
        reads = 0
        changes = a.changes_async
        during: list[NewEvent] = []  # committed while the read is under way

        async def counted(session_id: str, after: int) -> tuple[list, list, int]:  # type: ignore[type-arg]
            nonlocal reads
            reads += 1
            if during:
                await a.write(during, fence=("ses_a", epoch))
            return await changes(session_id, after)

        a.changes_async = counted  # type: ignore[method-assign]
        await a.write(user("msg_1", "one"), fence=("ses_a", epoch))
        await history.catch_up()
        assert reads == 0 and [m.text for m in history.chat()]  # type: ignore[union-attr] == ["one"]
        # Another daemon's commit to the session's messages, as the tail hands it over.
        foreign = await b.write(user("msg_2", "two"))
        # Heard by a's own tail (its NOTIFY wakes it), at a time of its choosing: waited
        # for, so that the hand-over cannot land after the next catch-up.
        with trio.fail_after(10):
            while a.message_mark("ses_a") < (foreign[-1].seq or 0):
                await trio.sleep(0.01)
        await a.write(user("msg_3", "three"), fence=("ses_a", epoch))
        await history.catch_up()
        assert reads == 1
        assert [m.text for m in history.chat()]  # type: ignore[union-attr] == ["one", "two", "three"]
        await a.write(user("msg_4", "four"), fence=("ses_a", epoch))
        await history.catch_up()
        assert reads == 1 and len(history.chat()) == 4  # following again
        # A write refused by the fence: the lease is another daemon's, so read.
        assert await b.claim("ses_a") is None  # held by a until it lapses or is taken
        a.post(user("msg_5", "five"), fence=("ses_a", epoch + 7))
        await a.flush()
        await history.catch_up()
        assert reads == 2 and len(history.chat()) == 4
        # A commit made while a read is under way: seen by the read and kept for the
        # next catch-up, applied again there, and still one message.
        history._complete_at = None  # as after a read that did not follow
        during.extend(user("msg_6", "six"))
        await history.catch_up()
        during.clear()
        assert reads == 3 and len(history.chat()) == 5
        await history.catch_up()
        assert reads == 3
        assert [m.text for m in history.chat()] == ["one", "two", "three", "four", "six"]  # type: ignore[union-attr]
        # More kept than the bound: the next catch-up reads instead.
        monkeypatch.setattr(port, "_MAX_WRITTEN", 1)
        await a.write(user("msg_7", "seven"), fence=("ses_a", epoch))
        await history.catch_up()
        assert reads == 4 and len(history.chat()) == 6

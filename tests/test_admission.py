"""Admission of new turns (harness/actors/admission.py): a busy daemon finishes the steps
of its running turns before it starts new ones, within a bound, and a prompt is durable
and answered at once whatever the load.

The load is real: a task that holds the Trio loop 20 ms at a time between checkpoints
(sleeping, so it burns no CPU on the shared machine), which is what a loop running many
steps looks like to everything else on it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from harness.actors.admission import TurnGate
from harness.actors.collector import FULL_THRESHOLD, collect_when_idle
from harness.config import Config
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness

DEADLINE = 20.0  # a guard against a hung test; each finishes far sooner


def _hold_loop(seconds: float) -> None:
    time.sleep(seconds)  # blocks the loop, as a long batch of task steps does


@asynccontextmanager
async def busy_loop(settle: float = 0.3) -> AsyncIterator[None]:
    """This Trio loop kept busy (~100 % of its time running a task) while inside."""

    async def spin() -> None:
        while True:
            _hold_loop(0.02)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spin)
        await trio.sleep(settle)  # the load's average catches up
        yield
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def running(gate: TurnGate) -> AsyncIterator[TurnGate]:
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.run)
        yield gate
        nursery.cancel_scope.cancel()


# --- the gate alone ----------------------------------------------------------------------


async def test_with_no_load_a_turn_is_admitted_at_once() -> None:
    async with running(TurnGate(bound=30)) as gate:
        await trio.sleep(0.3)
        assert gate.load() < 0.2
        assert gate.accepting() and gate.room() == 8
        with trio.fail_after(0.05):
            admission = await gate.admit()
        assert gate.waited == 0 and gate.starting == 1
        admission.release()
        admission.release()  # once only
        assert gate.starting == 0


async def test_under_constant_load_a_waiting_turn_starts_within_its_bound() -> None:
    async with running(TurnGate(bound=0.5)) as gate, busy_loop():
        assert gate.load() > 0.9
        assert not gate.accepting() and gate.room() == 0
        start = trio.current_time()
        with trio.fail_after(DEADLINE):
            admission = await gate.admit()
        waited = trio.current_time() - start
        assert 0.5 <= waited < 2.0
        assert gate.waited == 1 and gate.overdue == 1
        admission.release()


async def test_waiting_turns_start_in_order_once_the_load_falls() -> None:
    order: list[int] = []
    # One start at a time, so the order they start in is the order they were admitted.
    async with running(TurnGate(bound=30, starting=1)) as gate:

        async def turn(index: int) -> None:
            admission = await gate.admit()
            order.append(index)
            await trio.sleep(0.01)
            admission.release()

        async with trio.open_nursery() as nursery:
            async with busy_loop():
                for index in range(5):
                    nursery.start_soon(turn, index)
                    await trio.sleep(0.01)
                await trio.sleep(0.3)
                assert order == [] and gate.waiting == 5
            with trio.fail_after(DEADLINE):
                while len(order) < 5:
                    await trio.sleep(0.01)
        assert order == [0, 1, 2, 3, 4]
        assert gate.overdue == 0


async def test_turns_starting_at_once_are_capped_even_with_no_load() -> None:
    async with running(TurnGate(bound=30, starting=2)) as gate:
        await trio.sleep(0.2)
        first, second = await gate.admit(), await gate.admit()
        admitted = trio.Event()

        async def third() -> None:
            (await gate.admit()).release()
            admitted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.sleep(0.2)
            assert not admitted.is_set() and gate.waiting == 1
            first.release()  # the first turn reached its first step
            with trio.fail_after(DEADLINE):
                await admitted.wait()
        second.release()
        assert gate.starting == 0


async def test_a_turn_cancelled_while_it_waits_leaves_the_queue() -> None:
    async with running(TurnGate(bound=30)) as gate, busy_loop():
        with trio.move_on_after(0.2):
            await gate.admit()
        assert gate.waiting == 0 and gate.starting == 0


async def test_a_gate_of_zero_seconds_never_holds_a_turn() -> None:
    async with running(TurnGate(bound=0)) as gate, busy_loop():
        with trio.fail_after(0.05):
            admission = await gate.admit()
        assert gate.waited == 0
        admission.release()


# --- a daemon's full GC passes, out of its busy moments -----------------------------------


async def test_a_due_full_collection_waits_for_an_idle_loop() -> None:
    full: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    default = gc.get_threshold()[2]
    gc.callbacks.append(count)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(collect_when_idle)
            assert gc.get_threshold()[2] == FULL_THRESHOLD
            async with busy_loop():
                for _ in range(default):
                    gc.collect(1)  # each counts towards the next full pass
                full.clear()
                await trio.sleep(1.5)
                assert full == []  # due, but the loop is busy
            with trio.fail_after(DEADLINE):
                while not full:  # once the loop is idle (about 3 s of a 1 s average)
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    finally:
        gc.callbacks.remove(count)
    assert gc.get_threshold()[2] == default


# --- through the harness (SQLite) --------------------------------------------------------


def config(tmp_path: Path, provider: ScriptedProvider, **values: Any) -> Config:
    return Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        **values,
    )


def of_type(h: Harness, kind: str) -> list[Any]:
    return [e for e in h.ledger.events_after(0, limit=100_000) if e.type == kind]


async def finished(h: Harness, count: int) -> list[Any]:
    with trio.fail_after(DEADLINE):
        while len(done := of_type(h, "turn.finished")) < count:
            await trio.sleep(0.05)
    return done


async def test_a_burst_of_prompts_on_a_busy_daemon_is_durable_at_once_and_all_run(
    tmp_path: Path, project: Path
) -> None:
    count = 12
    provider = ScriptedProvider.from_turns([{"text": "ok"}] * count, record=True)
    async with open_harness(config(tmp_path, provider, admission_seconds=1.0)) as h:
        gate = h._supervisor._services.admission
        sessions = [(await h.create_session(project)).id for _ in range(count)]
        async with busy_loop():
            for session_id in sessions:
                await h.prompt(session_id, "go")
            # Every prompt is in the ledger as it is answered; the turns wait.
            assert len(of_type(h, "inbox.added")) == count
            assert len(of_type(h, "turn.started")) < count
            assert gate.waited >= 1
            done = await finished(h, count)
        assert sorted(e.session_id for e in done) == sorted(sessions)
        assert {e.data["reason"] for e in done} == {"answered"}
        assert {e.data["answer"] for e in done} == {"ok"}
        assert gate.starting == 0 and gate.waiting == 0


async def _prompt_held_at_the_gate(h: Harness, session_id: str) -> None:
    """Prompt the session, and return once its turn waits to be admitted."""
    gate = h._supervisor._services.admission
    await h.prompt(session_id, "go")
    with trio.fail_after(DEADLINE):
        while gate.waiting == 0:
            await trio.sleep(0.01)


async def test_cancel_of_a_turn_waiting_to_be_admitted_ends_it_as_cancelled(
    tmp_path: Path, project: Path
) -> None:
    provider = ScriptedProvider.from_turns([{"text": "never"}], record=True)
    async with open_harness(config(tmp_path, provider, admission_seconds=60)) as h:
        gate = h._supervisor._services.admission
        session_id = (await h.create_session(project)).id
        async with busy_loop():
            await _prompt_held_at_the_gate(h, session_id)
            assert await h.cancel(session_id)
            done = await finished(h, 1)
        assert done[0].data["reason"] == "cancelled"
        assert provider.requests == []  # the model was never asked
        assert h.ledger.inbox(session_id) == []
        assert h.session(session_id).status == "idle"
        assert gate.waiting == 0 and gate.starting == 0


async def test_delete_of_a_session_whose_turn_waits_to_be_admitted(
    tmp_path: Path, project: Path
) -> None:
    provider = ScriptedProvider.from_turns([{"text": "never"}], record=True)
    async with open_harness(config(tmp_path, provider, admission_seconds=60)) as h:
        gate = h._supervisor._services.admission
        session_id = (await h.create_session(project)).id
        async with busy_loop():
            await _prompt_held_at_the_gate(h, session_id)
            with trio.fail_after(5):  # not the 10 s a delete waits for a turn's end
                await h.delete_session(session_id)
            with trio.fail_after(DEADLINE):
                while gate.waiting or gate.starting:
                    await trio.sleep(0.01)
        assert provider.requests == []
        assert of_type(h, "turn.started") == []
        assert h.ledger.session(session_id) is None


# --- on a shared ledger: a less busy daemon claims what a busy one leaves waiting ---------


def test_input_left_waiting_by_a_busy_daemon_is_run_by_an_idle_one(
    postgres_schema: str, tmp_path: Path, project: Path, socket_dir: Path
) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    import psycopg
    from daemons import wait_for_daemon

    from harness.client import Client

    model = tmp_path / "model.json"
    model.write_text(json.dumps([{"text": "from the idle daemon"}]))
    env = dict(os.environ, HARNESS_HOME=str(tmp_path / "home-b"), HARNESS_SANDBOX="off")
    env["HARNESS_SOCKET"] = str(socket_dir / "b.sock")
    env["HARNESS_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("lease_seconds = 2\n")
    log = tmp_path / "daemon-b.log"
    with log.open("ab") as out:
        idle = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve", "--ledger", postgres_schema],
            stderr=out,
            env=env,
        )
    try:
        wait_for_daemon(idle, socket_dir / "b.sock", log, DEADLINE)
        assert Client(socket_dir / "b.sock").alive()

        async def main() -> str:
            busy = Config(
                home=tmp_path / "home-a",
                model=f"scripted:{model}",
                ledger=postgres_schema,
                lease_seconds=2,
                admission_seconds=60,  # this daemon would hold the turn a minute
                interactive=False,
            )
            async with open_harness(busy) as h:
                session_id = (await h.create_session(project)).id
                async with busy_loop():
                    await h.prompt(session_id, "go")
                    with trio.fail_after(DEADLINE):
                        while not of_type(h, "turn.finished"):
                            await trio.sleep(0.05)
                return session_id

        session_id = trio.run(main)
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            owner = conn.execute(
                "SELECT owner FROM leases WHERE session_id = %s", (session_id,)
            ).fetchone()
            done = conn.execute(
                "SELECT data FROM events WHERE session_id = %s AND type = 'turn.finished'",
                (session_id,),
            ).fetchall()
        assert owner is not None and int(owner[0].split(":")[1]) == idle.pid
        assert [json.loads(row[0])["answer"] for row in done] == ["from the idle daemon"]
    finally:
        idle.send_signal(signal.SIGTERM)
        try:
            idle.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            idle.kill()



async def test_input_nobody_claimed_is_taken_by_a_busy_daemon_after_a_lease(
    postgres_schema: str, tmp_path: Path, project: Path
) -> None:
    """Input whose daemon died before claiming it: a busy daemon's scan leaves such input
    to daemons with room, but not for good: after a lease's time it takes it anyway."""
    import json

    from harness.messages.events import NewEvent
    from harness.messages.model import InboxItem

    model = tmp_path / "model.json"
    model.write_text(json.dumps([{"text": "taken over"}]))
    busy = Config(
        home=tmp_path / "home",
        model=f"scripted:{model}",
        ledger=postgres_schema,
        lease_seconds=1,
        admission_seconds=60,
        interactive=False,
    )
    async with open_harness(busy) as h:
        session_id = (await h.create_session(project)).id
        async with busy_loop():
            # Written as a daemon that then died would have: durable, and nobody woken.
            item = InboxItem(id="msg_orphan", session_id=session_id, text="go", created=time.time())
            await h.ledger.write([NewEvent.of("inbox.added", session_id, item)])
            start = trio.current_time()
            with trio.fail_after(DEADLINE):
                while not of_type(h, "turn.finished"):
                    await trio.sleep(0.05)
            assert trio.current_time() - start >= 0.9  # not taken while within a lease
        assert of_type(h, "turn.finished")[0].data["answer"] == "taken over"

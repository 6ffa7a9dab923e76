"""Supervisor: starts one SessionActor per active session and routes messages to it.

Session actors start on demand (the first prompt or cancel that names them) and live in
the supervisor's nursery until they have been idle for ``session_idle_seconds``: a
daemon then holds only the sessions in use, not every session it ever ran. A crash inside
a turn is handled one level down, by the session actor's own restart policy, so one
session's failure never disturbs another; the supervisor only sees a session actor die if
something is deeply wrong, and then it logs the error and lets the next message start a
fresh actor from the ledger.
"""

from __future__ import annotations

import math

import structlog
import trio

from harness.actors.recovery import abandon_turn
from harness.actors.services import SessionServices
from harness.actors.session import SessionActor
from harness.messages.mailbox import (
    CancelSession,
    CancelTurn,
    LeaseLost,
    SupervisorMessage,
    Wake,
    WakeSession,
)

log = structlog.get_logger("harness.supervisor")


class Supervisor:
    def __init__(self, services: SessionServices) -> None:
        self._services = services
        self.mailbox, self._receive = trio.open_memory_channel[SupervisorMessage](math.inf)
        self._actors: dict[str, SessionActor] = {}
        # Sessions the shared ledger claimed for this daemon because their holder lapsed.
        self._orphans: set[str] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._services.admission.run)
            # What a previous process left: turns it claimed and never finished, and
            # input that was durable but never taken. Both carry on now.
            ledger = self._services.ledger
            pending = ledger.sessions_with_inbox()
            for session_id, message_id, _ in ledger.claimed_turns():
                session = ledger.session(session_id)
                if session is not None and session.parent_id is None:
                    pending.append(session_id)
                else:
                    await self._abandon_child_turn(session_id, message_id)
            for session_id in dict.fromkeys(pending):
                self._actor(nursery, session_id).mailbox.send_nowait(Wake())
            if pending:
                log.info("resuming sessions", count=len(set(pending)))
            task_status.started()
            async with self._receive:
                async for message in self._receive:
                    if isinstance(message, WakeSession):
                        if message.orphan:
                            self._orphans.add(message.session_id)
                        if message.remote and not await self._remote_wake(
                            message.session_id, orphan=message.orphan
                        ):
                            continue
                        self._actor(nursery, message.session_id).mailbox.send_nowait(Wake())
                    elif isinstance(message, LeaseLost):
                        lost = self._actors.get(message.session_id)
                        if lost is not None:
                            lost.lose()
                    elif isinstance(message, CancelSession):
                        actor = self._actors.get(message.session_id)
                        if actor is None or actor.closing:
                            message.reply.send_nowait(False)  # no turn is running
                        else:
                            actor.mailbox.send_nowait(CancelTurn(message.reply))
            nursery.cancel_scope.cancel()

    def accepting(self) -> bool:
        """Whether this daemon would start a new turn now, without waiting for its
        admission (actors/admission.py)."""
        return self._services.admission.accepting()

    async def _abandon_child_turn(self, session_id: str, message_id: str) -> None:
        """End a child's turn that no process runs any more.

        A child runs only inside its parent's task call; the resumed parent sees that call
        as interrupted and decides what to redo. On a shared ledger the child's turn may
        be running on another daemon: it is ended only under the child's own lease.
        """
        ledger = self._services.ledger
        if ledger.cluster and ledger.holds(session_id) and session_id not in self._orphans:
            return  # this daemon runs the child, inside its parent's call
        self._orphans.discard(session_id)
        epoch = await ledger.claim(session_id)
        if epoch is None:
            return
        try:
            events = abandon_turn(ledger, session_id, message_id)
            await ledger.write(events, fence=(session_id, epoch) if ledger.cluster else None)
        finally:
            await ledger.release(session_id)

    async def _remote_wake(self, session_id: str, *, orphan: bool = False) -> bool:
        """Whether work heard of through a shared ledger should start an actor here.

        Input another daemon committed, for a session neither held nor run here: no
        (nothing read). That daemon woke its own actor with it, a holder elsewhere hears
        it through its own tail, and what neither runs is taken by an orphan scan within
        half a second. Every daemon used to read the session and claim it, in vain, at
        every prompt that another daemon took (issue 18). Otherwise, a root session: yes
        (its actor claims the lease, or ends if another daemon holds it). A child:
        never; only its turns left behind by a dead daemon are ended.
        """
        ledger = self._services.ledger
        if not orphan and not ledger.holds(session_id) and not self.runs(session_id):
            return False
        session = await ledger.session_async(session_id)
        if session is None:
            await ledger.release(session_id)  # claimed as an orphan: nothing to run
            return False
        if session.parent_id is None:
            self._orphans.discard(session_id)
            return True
        if session_id not in self._actors:
            for _, message_id, _ in ledger.claimed_turns(session_id):
                await self._abandon_child_turn(session_id, message_id)
        return False

    def runs(self, session_id: str) -> bool:
        """Whether the session has an actor here that is not ending."""
        actor = self._actors.get(session_id)
        return actor is not None and not actor.closing

    def _actor(self, nursery: trio.Nursery, session_id: str) -> SessionActor:
        actor = self._actors.get(session_id)
        if actor is None or actor.closing:
            # An actor that let itself go when idle is not woken again: a new one starts
            # from the ledger, while the old one finishes ending.
            actor = SessionActor(
                self._services,
                session_id,
                idle_release=self._services.config.session_idle_seconds,
            )
            self._actors[session_id] = actor
            nursery.start_soon(self._guard, actor)
        return actor

    async def _guard(self, actor: SessionActor) -> None:
        try:
            await actor.run()
        except Exception as error:
            if actor.lost:
                # What the cancelled turn still tried to write was refused by the fence.
                log.info("session actor stopped: lease lost", session_id=actor.session_id)
                return
            log.exception("session actor died", session_id=actor.session_id)
            # Whoever waits on the turn must hear that it ended: record it as failed.
            ledger = self._services.ledger
            reason = f"internal error: {type(error).__name__}: {error}"
            with trio.CancelScope(shield=True):
                for session_id, message_id, _ in ledger.claimed_turns(actor.session_id):
                    try:
                        await ledger.write(
                            abandon_turn(ledger, session_id, message_id, reason, status="error"),
                            fence=actor.lease,
                        )
                    except Exception:
                        log.exception("could not record the failed turn", turn=message_id)
        finally:
            if self._actors.get(actor.session_id) is actor:
                del self._actors[actor.session_id]

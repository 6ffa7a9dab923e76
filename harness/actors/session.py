"""SessionActor: one per active session. Owns its inbox, its status and its turns.

It takes input from the ledger's inbox one turn at a time (steered input joins the
running turn at the runner's next step boundary), runs each turn's Runner and
ToolExecutor inside a cancel scope of its own, and records how the turn ended.
Cancelling the session cancels that scope: the provider stream, the running tools and
their process groups all stop, and the ledger closes what was open as cancelled.

A runner that raises is supervised one-for-one: its open tool parts are closed as
interrupted and the turn is restarted from the ledger, at most ``restart_limit`` times
within ``restart_window`` seconds; past that the session is marked ``error``.

What a turn runs with is wired by ``turn_builder``; what is done about a turn cut short
lives in ``recovery``; titles in ``titles``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any

import structlog
import trio

from harness.actors.admission import Admission
from harness.actors.recovery import (
    MAX_RESUMES,
    RestartPolicy,
    close_open_work,
    end_turn,
    kill_orphaned_processes,
    ledger_failure,
    resume_events,
    root_cause,
)
from harness.actors.services import Lineage, SessionServices
from harness.actors.titles import derive_title, model_title
from harness.actors.turn_builder import SessionHooks, Turn, TurnBuilder
from harness.history import RESTARTED, History
from harness.messages import ids
from harness.messages.events import Event, NewEvent, StopReason, TurnResult
from harness.messages.mailbox import CancelTurn, ClearSession, Publish, SessionMessage
from harness.messages.model import (
    InboxItem,
    Session,
    SessionStatus,
    TextPart,
    Tokens,
    UserMessage,
)
from harness.providers import create_provider
from harness.providers.base import Provider
from harness.providers.errors import ProviderError
from harness.providers.limiter import LimitedProvider
from harness.providers.retry import RetryNotice
from harness.storage.port import ClaimReads, LedgerError, LedgerFenced, current_lease

log = structlog.get_logger("harness.session")


class SessionActor:
    def __init__(
        self,
        services: SessionServices,
        session_id: str,
        *,
        lineage: Lineage | None = None,
        parent_span: str | None = None,
        idle_release: float | None = None,
    ) -> None:
        config = services.config
        self._services = services
        # Seconds idle (no input, no turn) after which the actor ends; None: never.
        self._idle_release = idle_release
        # Set, synchronously with the last look at the inbox, once the actor has chosen to
        # end: from then on the supervisor starts a new actor for the session instead.
        self.closing = False
        self._lineage = lineage or Lineage(trace_id=session_id)
        self._parent_span = parent_span
        self._ledger = services.ledger
        self.session_id = session_id
        self.mailbox, self._receive = trio.open_memory_channel[SessionMessage](math.inf)
        self._wake = trio.Event()
        self._turn_scope: trio.CancelScope | None = None  # what CancelTurn cancels
        # A turn claimed whose scope is not made yet (its builder runs), and a cancel that
        # came meanwhile: it cancels the scope as soon as there is one. Dropped, it was
        # lost, though the turn was durable (a cancel through another daemon, issue 18).
        self._starting = False
        self._cancel_early = False
        self._provider: Provider | None = None  # kept between turns, one per model and server
        self._provider_for: tuple[str, str | None] = ("", None)  # (model, base_url)
        self._restarts = RestartPolicy(config.restart_limit, config.restart_window)
        self._state: Session | None = None
        # The ledger's inbox mark (``LedgerPort.inbox_mark``) when this actor last saw
        # the inbox empty, and when it last saw no steered input in it: while the mark
        # has not moved, neither has changed, so the read is skipped (one a step).
        self._empty_at: int | None = None
        self._unsteered_at: int | None = None
        # A shared ledger's lease on this session (DESIGN §14), held while a turn runs:
        # (session_id, epoch), carried by every write of this actor's tasks.
        self.lease: tuple[str, int] | None = None
        self.lost = False  # another daemon took the session: stop, write nothing more
        # What the claim of the lease read in its own round trip: the claimed turns, the
        # inbox, the row and the history, used once each by the reads that follow it.
        self._claim_reads: ClaimReads | None = None
        self._saves = 0  # writes of the session row by this actor (``_save``), counted
        # The daemon's admission of this actor's next turn (actors/admission.py): held from
        # when the turn may start to its first step. ``_gate_scope``: the wait for it, which
        # a cancel ends; ``_cancel_next``: the turn that waited is then run as cancelled.
        self._admission: Admission | None = None
        self._gate_scope: trio.CancelScope | None = None
        self._cancel_next = False
        self._run_scope: trio.CancelScope | None = None
        self._builder = TurnBuilder(
            services=services,
            lineage=self._lineage,
            is_child=parent_span is not None,
            child_slots=trio.Semaphore(config.max_children),
            child_actor=self._child_actor,
            hooks=SessionHooks(
                take_steered=self._take_steered, on_usage=self._add_usage, on_retry=self._on_retry
            ),
        )

    def _child_actor(self, child_id: str, lineage: Lineage, call_id: str) -> SessionActor:
        """The actor of a child session this session's ``task`` call runs."""
        return SessionActor(self._services, child_id, lineage=lineage, parent_span=call_id)

    # --- mailbox ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A child starts in its parent's call task: drop the parent's step and call.
        structlog.contextvars.clear_contextvars()
        # Spans for the log: a root session's trace is its id; a child's span hangs
        # under the tool call that started it.
        with structlog.contextvars.bound_contextvars(
            session_id=self.session_id,
            trace_id=self._lineage.trace_id or self.session_id,
            span_id=self.session_id,
            parent_span_id=self._parent_span,
        ):
            try:
                async with trio.open_nursery() as nursery:
                    self._run_scope = nursery.cancel_scope
                    nursery.start_soon(self._serve_inbox, nursery)
                    task_status.started()
                    async with self._receive:
                        async for message in self._receive:
                            if isinstance(message, CancelTurn):
                                message.reply.send_nowait(self._cancel_turn())
                            else:
                                self._wake.set()
                    nursery.cancel_scope.cancel()
            finally:
                self.closing = True
                self._started()
                self._answer_leftovers()
                if self._provider is not None:
                    with trio.CancelScope(shield=True):
                        await self._provider.aclose()

    def _answer_leftovers(self) -> None:
        """A cancel that reached an actor as it ended is answered: there is no turn."""
        while True:
            try:
                message = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                return
            if isinstance(message, CancelTurn):
                message.reply.send_nowait(False)

    def lose(self) -> None:
        """The lease was taken by another daemon: stop everything, at once. Whatever the
        cancelled work still tries to write is refused by the fence."""
        self.lost = True
        self.closing = True
        log.warning("session lost to another daemon: stopping it here")
        if self._run_scope is not None:
            self._run_scope.cancel()

    async def _hold(self) -> bool:
        """Hold the session's lease before running it; False when another daemon does.

        A ledger of one process grants it at once. A shared one may not: the daemon that
        runs the session has the input too, and runs it.
        """
        if not self._ledger.cluster:
            return True
        if self.lease is not None and self._ledger.holds(self.session_id):
            return True
        # Claimed for this daemon already (an orphan taken over in a batch, or a prompt's
        # commit, which read what a claim reads), or claim now.
        epoch = self._ledger.held_epoch(self.session_id)
        if epoch is not None:
            self._claim_reads = self._ledger.take_claim_reads(self.session_id)
        else:
            # This actor's last writes first (a lease given back with them, a late
            # title): a claim skips a lease row that an append still has locked, and
            # would take this daemon's own append for another daemon's claim.
            saves = self._saves
            await self._ledger.settle(self.session_id)
            epoch, reads = await self._ledger.claim_with_reads(self.session_id)
            if reads is not None and self._saves != saves:
                # This actor wrote its row meanwhile (a late title), perhaps after the
                # claim read it: the row is read again, once that write has landed.
                reads = dataclasses.replace(reads, session=None)
            self._claim_reads = reads
        if epoch is None:
            log.debug("session held by another daemon")
            return False
        self.lease = (self.session_id, epoch)
        current_lease.set(self.lease)  # inherited by the tasks this one starts from now on
        self._state = None  # another daemon may have changed the row since this actor read it
        return True

    async def _let_go(self) -> None:
        """Give the lease back once this actor's writes have landed (a turn ended).

        The task keeps its fence: a late write (a title) still lands unless another daemon
        has claimed the session since, and is refused if it has."""
        if self._ledger.cluster and self.lease is not None:
            await self._ledger.settle(self.session_id)
            await self._ledger.release(self.session_id)
            self.lease = None

    def _held_elsewhere(self) -> None:
        """Another daemon holds the session: it runs the input. A cancel this actor took
        for a turn still waiting here goes to that daemon, as a cancel through the API
        would."""
        if self._cancel_next:
            self._cancel_next = False
            self._ledger.post(
                [NewEvent("cancel.requested", self.session_id, {"by": self._ledger.location})]
            )
        self._give_up()

    def _give_up(self) -> None:
        self.closing = True
        self.mailbox.close()

    def _cancel_turn(self) -> bool:
        if self._gate_scope is not None:
            # A turn waiting for the daemon to admit it starts now, as cancelled; if its
            # input is gone (a delete took it first), the wait just ends.
            self._gate_scope.cancel()
            self._cancel_next = bool(self._ledger.inbox(self.session_id))
            return self._cancel_next
        if self._turn_scope is None:
            if self._starting:
                self._cancel_early = True
                return True
            return False
        self._turn_scope.cancel()
        return True

    async def _admitted(self) -> None:
        """Wait until the daemon admits a new turn of this session (actors/admission.py):
        it finishes the steps of the turns it runs first. A child's turn is part of its
        parent's, already running; a session the daemon's scan claimed before this actor
        did (a lapsed holder's turn, or input the scan took as there was room) was
        admitted by that scan: neither waits."""
        if self._admission is not None or self._cancel_next or self._parent_span is not None:
            return
        ledger = self._ledger
        if ledger.cluster and self.lease is None and ledger.held_epoch(self.session_id) is not None:
            self._admission = self._services.admission.enter()
            return
        with trio.CancelScope() as scope:
            self._gate_scope = scope
            try:
                self._admission = await self._services.admission.admit()
            finally:
                self._gate_scope = None

    def _started(self) -> None:
        """The admitted turn is at its first step (or will not start): its place among
        the turns starting goes back to the daemon."""
        if self._admission is not None:
            self._admission.release()
            self._admission = None

    # --- intake: the inbox, one turn at a time ----------------------------------------------

    async def _serve_inbox(self, nursery: trio.Nursery) -> None:
        """Run the inbox's items as turns, in order, until idle for ``idle_release``."""
        await self._admitted()
        if not await self._hold():
            self._held_elsewhere()
            return
        # A turn claimed and never finished was cut short by a crash: it goes first.
        await self._resume_claimed()
        while not self.lost:
            mark = self._ledger.inbox_mark(self.session_id)
            inbox = await self._read_inbox(mark)
            if not inbox:
                self._claim_reads = None
                self._started()  # nothing to start after all
                self._cancel_next = False
                await self._let_go()
                with trio.move_on_after(self._idle_release or math.inf):
                    await self._wake.wait()
                if not self._wake.is_set() and not self._inbox_now():
                    # Idle: let the actor, its provider and its caches go. The inbox was
                    # seen after the last wake was sent (input is committed before its
                    # wake), and ``closing`` is set before anything else can run.
                    self.closing = True
                    log.debug("idle session actor released")
                    self.mailbox.close()
                    return
                self._wake = trio.Event()
                continue
            await self._admitted()
            if not await self._hold():
                self._held_elsewhere()
                return
            # Once the item is taken, an inbox that held only it is empty as of ``mark``.
            await self._claim(inbox[0], nursery, empty_at=mark if len(inbox) == 1 else None)

    def _inbox_now(self) -> bool:
        """Whether input waits, without an await: no read while the inbox mark is still
        the one at which the inbox was seen empty (nothing was added since, here or
        through the tail; input the tail has not read yet wakes a new actor)."""
        if self._ledger.inbox_mark(self.session_id) == self._empty_at:
            return False
        return bool(self._ledger.inbox(self.session_id))

    async def _read_inbox(self, mark: int) -> list[InboxItem]:
        """The inbox, read unless it was seen empty at this very mark (``mark``: the
        ledger's inbox mark, taken before the read, so input added meanwhile moves it)."""
        if mark == self._empty_at:
            return []
        first = self._claim_reads
        if first is not None and first.mark == mark:
            inbox = first.inbox  # read with the claim, and no input seen since
        else:
            inbox = await self._ledger.inbox_async(self.session_id)
        self._empty_at = None if inbox else mark
        return inbox

    def _take(self, item: InboxItem, session: Session) -> tuple[list[NewEvent], UserMessage]:
        """The events that turn an inbox item into a user message, in one transaction,
        and that message."""
        message = UserMessage(
            id=item.id,
            session_id=self.session_id,
            agent=item.agent or session.agent,
            model=item.model or session.model,
            delivery=item.delivery,
            max_steps=item.max_steps,
            compact=item.compact,
            created=time.time(),
        )
        part = TextPart(
            id=ids.part_id(), session_id=self.session_id, message_id=item.id, text=item.text
        )
        return [
            NewEvent("inbox.taken", self.session_id, {"id": item.id}),
            NewEvent.of("message.created", self.session_id, message),
            NewEvent.of("part.created", self.session_id, part),
        ], message

    async def _take_steered(self) -> None:
        self._started()  # called at each step boundary: the turn's first step is here
        mark = self._ledger.inbox_mark(self.session_id)
        if mark == self._unsteered_at:
            return  # nothing added since the inbox last held no steered input
        items = [i for i in await self._read_inbox(mark) if i.delivery == "steer"]
        if not items:
            self._unsteered_at = mark
        else:
            session = self._session()
            events: list[NewEvent] = []
            for item in items:
                events.extend(self._take(item, session)[0])
            await self._ledger.write(events)

    async def _claim(self, item: InboxItem, nursery: trio.Nursery, *, empty_at: int | None) -> None:
        """Take ``item`` as a new turn, claimed durably with its user message, and run it.

        ``empty_at``: the inbox mark at which the inbox held this item alone."""
        # Between turns the row may have been changed through the API (PATCH, refused
        # while a turn runs or input waits): start each turn from the ledger's copy, once
        # this actor's own last posts (a late title) have landed in it. The claim read it
        # after those had (``_hold`` settles first); unless this actor wrote it since.
        first, self._claim_reads = self._claim_reads, None
        session = first.session if first is not None and self._state is None else None
        if session is None:
            await self._ledger.settle(self.session_id)
            session = await self._ledger.session_async(self.session_id)
        self._state = session
        if session is None:
            raise LookupError(f"session {self.session_id} does not exist")
        events, message = self._take(item, session)
        claim = {"message_id": item.id, "session_id": self.session_id, "started": time.time()}
        # The claim is committed with the user message: from here a crash resumes the turn.
        events.append(NewEvent("turn.started", self.session_id, claim))
        sandbox = self._services.sandbox
        if sandbox.unavailable is not None:
            # In each turn's record: its commands ran without the sandbox asked for.
            notice = {
                "requested": sandbox.requested,
                "reason": sandbox.unavailable,
                "notice": sandbox.notice,
            }
            events.append(NewEvent("sandbox.unavailable", self.session_id, notice))
        # The session busy, in the claim's own commit: posted after it, it was a commit
        # of its own, which the runner's flush before its first step waited for (a
        # worker-thread round trip a turn). The title is derived, not asked of the
        # model: a run sends no side requests by default.
        title = session.title or derive_title(item.text)
        busy = self._changed(status="busy", error=None, title=title)
        events.append(NewEvent.of("session.updated", self.session_id, busy))
        written = await self._ledger.write(events)
        self._saves += 1
        self._state = busy
        seeded = None
        if first is not None and first.history is not None:
            # The history the claim read, and this turn's first events: no read of it.
            seeded = History(self._ledger, self.session_id)
            seeded.seed(first.history, written)
        self._empty_at = self._unsteered_at = empty_at
        if not session.title and self._services.config.title_model:
            # Off the critical path: the turn never waits for the title, nor fails with it.
            nursery.start_soon(self._write_title, item.text)
        await self._run_turn(item.id, message, may_release=True, history=seeded)

    async def _write_title(self, prompt: str) -> None:
        config = self._services.config
        try:
            title = await model_title(config, self.session_id, prompt, lambda: self._provider)
        except (ProviderError, trio.TooSlowError) as error:
            log.warning("title not written", error=str(error))
            return
        if title:
            self._save(title=title)
            log.info("title written", title=title)

    # --- recovery: turns a crash or a full disk cut short -----------------------------------

    async def _resume_claimed(self) -> None:
        first = self._claim_reads
        if first is not None:
            claimed = first.turns
            if claimed:
                self._claim_reads = None  # resuming writes: what else it read may change
        else:
            claimed = await self._ledger.claimed_turns_async(self.session_id)
        for _, message_id, resumes in claimed:
            if self.lost:
                return
            await self._resume(message_id, resumes)

    async def _resume(self, message_id: str, resumes: int) -> None:
        """Carry on a turn that a crash interrupted, from what the ledger shows."""
        with structlog.contextvars.bound_contextvars(turn=message_id):
            kill_orphaned_processes(self._ledger, self.session_id)
            if self._ledger.cancel_pending(self.session_id):
                # Cancelled through another daemon while no daemon could act on it (its
                # holder had died): the cancel holds, the turn does not carry on.
                stopped = await self._stopped(message_id, "cancelled", "cancelled")
                # The turn's end and the session's status in one commit, as at any turn's
                # end: whoever sees the turn finished reads the session as it ended.
                self._ledger.post([NewEvent("turn.finished", self.session_id, stopped.to_dict())])
                self._set_status("idle")
                await self._ledger.flush()
                log.info("turn cancelled before it could resume")
                return
            if resumes >= MAX_RESUMES:
                reason = f"the turn was resumed {resumes} times after restarts and kept failing"
                log.error("turn abandoned", resumes=resumes)
                self._ledger.post(
                    end_turn(
                        self._ledger, self.session_id, message_id, closed_as=RESTARTED, error=reason
                    )
                )
                self._set_status("error", reason)  # in the same commit as turn.finished
                await self._ledger.flush()
                return
            read_only = frozenset(n for n, t in self._services.tools.items() if t.read_only)
            await self._ledger.write(
                resume_events(self._ledger, self.session_id, message_id, resumes, read_only)
            )
            log.info("turn resumed after restart", resumes=resumes + 1)
            self._save(status="busy", error=None)
            await self._run_turn(message_id)

    async def _ledger_failed(self, message_id: str, error: LedgerError) -> None:
        """The ledger cannot be written (a full disk): stop the turn, writing nothing.

        The turn's claim stays in the ledger, so the turn is resumed, from what was
        committed, when the session is woken again (a prompt, once there is space) or the
        harness restarts. Whoever follows the turn hears that it ended from a live-only
        ``turn.finished`` event, which needs no disk.
        """
        if isinstance(error, LedgerFenced):
            # Another daemon runs the session now: it carries the turn on from the ledger.
            log.warning("turn stopped: the session was taken by another daemon")
            self.lost = True
            self._give_up()
            return
        log.error("turn stopped: the ledger cannot be written", error=str(error))
        self._state = None  # what this actor posted may not have landed
        result = TurnResult(message_id, "error", "", str(error))
        event = Event(None, time.time(), "turn.finished", self.session_id, result.to_dict())
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._services.feed.send(Publish((event,)))
        if self._parent_span is not None:
            raise error  # a child's failure is its parent's call's failure
        await self._wake.wait()
        self._wake = trio.Event()
        await self._resume_claimed()

    # --- a turn: prepared, supervised, recorded ---------------------------------------------

    async def _run_turn(
        self,
        message_id: str,
        message: UserMessage | None = None,
        *,
        may_release: bool = False,
        history: History | None = None,
    ) -> None:
        """Run a claimed turn to its end and record how it ended (``message``: its user
        message as just written, which then need not be read back; ``may_release``: the
        lease may go back with the turn's last events, if nothing is queued; ``history``:
        the session's, already read, for the turn's first attempt)."""
        with structlog.contextvars.bound_contextvars(turn=message_id):
            self._starting, self._cancel_early = True, False
            try:
                turn = await self._builder.turn(message_id, self._session(), message)
            except BaseException:
                self._starting = False
                raise
            log.info("turn started")
            result: TurnResult | None = None
            try:
                result = await self._supervise(turn, history)
            except LedgerError as error:
                await self._ledger_failed(message_id, error)
                return
            finally:
                self._started()
                self._starting = False
                if result is None and self._parent_span is not None:
                    # A child dies with its parent's call: it is cancelled, not to be
                    # resumed. (The cancel may arrive wrapped in an exception group,
                    # hence finally.)
                    with trio.CancelScope(shield=True):
                        stopped = await self._stopped(message_id, "cancelled", "cancelled")
                        await self._ledger.write(
                            [NewEvent("turn.finished", self.session_id, stopped.to_dict())]
                        )
                        self._set_status("idle")
            failed = result.reason == "error" and self._session().status == "error"
            self._ledger.post([NewEvent("turn.finished", self.session_id, result.to_dict())])
            if not failed:
                self._set_status("idle")
            if may_release and self._idle_after_turn():
                self._ledger.post_release(self.session_id)
                self.lease = None
            await self._ledger.flush()
            log.info("turn finished", reason=result.reason)

    def _idle_after_turn(self) -> bool:
        """Whether this turn leaves the session with nothing to run: its inbox seen empty
        at the current mark, on a shared ledger. Then the lease goes back in the same
        transaction as the turn's end (``post_release``), not in one of its own once the
        actor finds the inbox empty (``_let_go``); input added meanwhile claims it again."""
        return (
            self._ledger.cluster
            and self.lease is not None
            and not self.lost
            and self._ledger.inbox_mark(self.session_id) == self._empty_at
        )

    async def _supervise(self, turn: Turn, history: History | None = None) -> TurnResult:
        """Attempts at ``turn`` until one ends it, restarting a crashed runner by policy
        (``history``: for the first attempt; a restarted one reads it afresh)."""
        while True:
            seeded, history = history, None
            try:
                with trio.CancelScope() as scope:
                    self._turn_scope = scope
                    self._starting = False
                    if self._cancel_early or self._cancel_next:
                        # Cancelled while it waited to be admitted, or was being built.
                        self._cancel_early = self._cancel_next = False
                        scope.cancel()
                    return await self._attempt(turn, seeded)
                # Only a cancel of this scope lands here (CancelTurn).
                return await self._stopped(turn.message_id, "cancelled", "cancelled")
            except ProviderError as error:
                # Building the provider failed (no key, unknown model): nothing to restart.
                return await self._stopped(turn.message_id, "error", str(error))
            except Exception as error:
                failure = ledger_failure(error)
                if failure is not None:
                    raise failure from None  # a rerun would fail the same way, tools and all
                log.exception("runner crashed")
                cause = root_cause(error)
                with trio.CancelScope(shield=True):
                    # Let the runner's posted writes land first: close_open_work reads
                    # the ledger, and a step it cannot see yet would stay open.
                    await self._ledger.flush()
                    await self._ledger.write(
                        close_open_work(self._ledger, self.session_id, "interrupted")
                    )
                if not self._restarts.may_restart():
                    reason = (
                        f"the runner crashed {self._restarts.recent_crashes} times within "
                        f"{self._services.config.restart_window:.0f} s: "
                        f"{type(cause).__name__}: {cause}"
                    )
                    self._set_status("error", reason)
                    return TurnResult(turn.message_id, "error", "", reason)
            finally:
                self._turn_scope = None

    async def _attempt(self, turn: Turn, history: History | None = None) -> TurnResult:
        """One run of the turn's runner, with a tool executor of its own beside it."""
        session = self._session()
        provider = await self._provider_of(session)
        runner, executor = self._builder.build(turn, session, provider, history)
        result: list[TurnResult] = []

        async def run_runner() -> None:
            # A task of its own: the step spans the runner binds in the log end with it.
            try:
                result.append(await runner.run_turn(turn.message_id))
            finally:
                nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(executor.run)
                nursery.start_soon(run_runner)
        finally:
            # A provider's wire cache serves the steps of one turn: an idle session
            # should not hold a second copy of its history until the next prompt.
            forget = getattr(provider, "forget_requests", None)
            if forget is not None:
                forget()
        return result[0]

    async def _provider_of(self, session: Session) -> Provider:
        """The provider client for the session's model and server, kept between turns."""
        config = self._services.config
        base_url = session.base_url or config.base_url
        if self._provider is not None and self._provider_for != (session.model, base_url):
            # The session's model or server changed since the last turn: a new client.
            with trio.CancelScope(shield=True):
                await self._provider.aclose()
            self._provider = None
        if self._provider is None:
            factory = config.provider_factory
            provider = (
                factory(session.model)
                if factory is not None
                else create_provider(session.model, base_url=base_url, record=config.record)
            )
            # Every request of a server's sessions goes through one shared limiter.
            limiter = self._services.limiter_for(session.model, base_url)
            if limiter is not None:
                provider = LimitedProvider(provider, limiter, self._on_retry)
            self._provider = provider
            self._provider_for = (session.model, base_url)
        return self._provider

    async def _stopped(self, user_message_id: str, reason: StopReason, error: str) -> TurnResult:
        with trio.CancelScope(shield=True):
            self._services.permission.send_nowait(ClearSession(self.session_id))
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                self._services.questions.send_nowait(ClearSession(self.session_id))
            await self._ledger.flush()  # the stopped runner's posts, before reading
            await self._ledger.write(close_open_work(self._ledger, self.session_id, error))
        return TurnResult(user_message_id, reason, "", error)

    # --- the session row, which this actor alone writes -------------------------------------

    def _session(self) -> Session:
        """The session as this actor last wrote it; read from the ledger once.

        This actor is the only writer of its session row, so its copy is the truth even
        while its last writes are still on their way to the ledger.
        """
        if self._state is None:
            session = self._ledger.session(self.session_id)
            if session is None:
                raise LookupError(f"session {self.session_id} does not exist")
            self._state = session
        return self._state

    def _changed(self, **changes: Any) -> Session:
        """The session row with ``changes``, as this actor is about to write it."""
        return self._session().model_copy(update={**changes, "updated": time.time()})

    def _save(self, **changes: Any) -> None:
        self._saves += 1
        self._state = self._changed(**changes)
        self._ledger.post([NewEvent.of("session.updated", self.session_id, self._state)])

    def _set_status(self, status: SessionStatus, error: str | None = None) -> None:
        self._save(status=status, error=error)

    def _add_usage(self, tokens: Tokens, cost: float) -> None:
        session = self._session()
        self._save(
            tokens=session.tokens.plus(tokens),
            cost=session.cost + cost,
            # A step that finished means the provider answered: any retry is over.
            status="busy" if session.status == "retry" else session.status,
        )

    async def _on_retry(self, notice: RetryNotice) -> None:
        self._set_status("retry")
        event = Event(
            None,
            time.time(),
            "session.retry",
            self.session_id,
            {
                "attempt": notice.attempt,
                "next": notice.at,
                "error": notice.error,
                **({"shared": True} if notice.shared else {}),
            },
        )
        await self._services.feed.send(Publish((event,)))
        log.warning("provider retry scheduled", attempt=notice.attempt, delay=notice.delay)

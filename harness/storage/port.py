"""The ledger port (DESIGN §4, §14): what the rest of harness asks of a ledger.

Two backends stand behind it: ``harness.storage.ledger.Ledger`` (apsw, SQLite: the
embedded default, one process per file) and ``harness.storage.postgres.PostgresLedger``
(one database that every daemon shares). What they share lives here: the writer actor
(one queue, batches committed in one transaction, callers answered after commit; a
small batch the backend commits on the event loop's thread is committed by the caller
that waits for it, while the writer has none in hand), and every read, written once in
SQL both engines speak, with ``?`` placeholders (the PostgreSQL backend turns them into
``%s``).

A backend supplies the connection work: ``_commit`` (append a batch and apply the
projections, in one transaction; ``_commits_on_loop`` and ``_commit_on_loop`` when it
may run on the event loop's thread), ``_rows`` (one read), ``close``, and for a shared
ledger the leases: ``claim``/``release`` of a session, and the fence that every write
carries (``WriteEvents.fence``), so that a daemon that lost a session can never write
to it again.
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import outcome
import structlog
import trio
from pydantic import ConfigDict, TypeAdapter

from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, Publish, WriteEvents
from harness.messages.model import (
    AssistantMessage,
    InboxItem,
    Message,
    MessageWithParts,
    Part,
    Rule,
    Session,
    TextPart,
    ToolPart,
    UserMessage,
)
from harness.messages.todo import Todo
from harness.storage.schema import MCP_EVENTS

if TYPE_CHECKING:
    from harness.storage.pg_live import LiveRelay

log = structlog.get_logger("harness.ledger")

# Built when a row is first read back, not at import (before a run's first request).
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message, config=ConfigDict(defer_build=True))
_PART: TypeAdapter[Part] = TypeAdapter(Part, config=ConfigDict(defer_build=True))
_MAX_BATCH = 1024
# Events kept for one followed session between two catch-ups (``LedgerPort.follow``);
# past it the history reads instead, so a session nobody catches up on costs little.
_MAX_WRITTEN = 4096
# The events whose projections write a session's messages and parts.
_MESSAGE_EVENTS = frozenset(("message.created", "message.updated", "part.created", "part.updated"))
# The reads that a turn or a step makes, each with a synchronous and an async caller.
_SESSION = "SELECT data FROM sessions WHERE id = ?"
_INBOX = "SELECT data FROM inbox WHERE session_id = ? ORDER BY seq"
_SESSION_TURNS = (
    "SELECT session_id, message_id, resumes FROM turns WHERE session_id = ? ORDER BY started"
)
_USER_MESSAGE = "SELECT data FROM messages WHERE id = ? AND role = 'user'"
_T = TypeVar("_T")

# The lease (session_id, epoch) of the session actor whose task writes: set by the actor
# when it claims its session, inherited by the tasks it starts (runner, tools, title), and
# attached to each write it makes. None: a write of the API (a prompt, a new session),
# which any daemon may make.
current_lease: ContextVar[tuple[str, int] | None] = ContextVar("current_lease", default=None)


async def on_worker_thread(work: Callable[[], _T]) -> _T:
    """``work()`` on one of Trio's cached worker threads; its result or its exception.

    The writer's commits, one a step, with less around them than ``trio.to_thread``
    (capacity limiter, context copy, cancellation bookkeeping): 76-104 us of CPU a round
    trip instead of 105-152 us (a no-op, best and median of 10 x 300). The writer has
    one commit in flight, always shielded, so none of that is needed: the wait cannot be
    cancelled, and the commit always runs to its end, as with a shielded ``to_thread``.
    """
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def deliver(result: outcome.Outcome[_T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(work, deliver)
    answer: _T = await trio.lowlevel.wait_task_rescheduled(
        lambda _: trio.lowlevel.Abort.FAILED
    )
    return answer


@dataclass(slots=True, frozen=True)
class ClaimReads:
    """What a session actor reads once it holds its lease, read in the claim's own round
    trip (``claim_with_reads``): three reads fewer on the event loop a turn (issue 18).

    Read after the lease was taken, so nothing another daemon commits later can change
    them under the lease, except input: ``inbox`` holds as long as ``inbox_mark`` is
    still ``mark`` (taken before the claim was sent).
    """

    mark: int
    turns: list[tuple[str, str, int]]  # the session's claimed turns, as ``claimed_turns``
    inbox: list[InboxItem]
    session: Session | None
    # Its messages and parts, as ``changes(session_id, 0)``: under the lease, only the
    # claimant writes more of them, so a turn's history starts from these.
    history: tuple[list[Message], list[Part], int] | None = None


class LedgerError(Exception):
    """The ledger cannot be opened or written; the message says where and why."""


class LedgerRefused(LedgerError):
    """A write refused as a whole, in its transaction: nothing of it was written."""


class LedgerFenced(LedgerRefused):
    """A write refused: another daemon holds the session's lease now (DESIGN §14)."""


class LedgerMissing(LedgerRefused):
    """A write refused: the session it requires (``WriteEvents.exists``) does not exist."""


@dataclass(frozen=True, slots=True)
class ClusterHooks:
    """What a shared ledger tells the harness about other daemons' work.

    ``wake``: a session has work this daemon may take (input added through another
    daemon, a session whose holder stopped renewing). ``lost``: this daemon's lease on a
    session was taken: its actor must stop, it can no longer write.
    """

    wake: Callable[[str], None]
    lost: Callable[[str], None]
    # A session claimed for this daemon because its holder stopped renewing: run it.
    orphan: Callable[[str], None] = lambda session_id: None
    # A permission.replied event written through another daemon: its data.
    replied: Callable[[dict[str, Any]], None] = lambda data: None
    # A question.replied or question.rejected written through another daemon: its type
    # and data.
    answered: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    # A session this daemon runs was cancelled or deleted through another daemon.
    cancel: Callable[[str], None] = lambda session_id: None
    # How many subscribers this daemon's feed has (each counted from its registration,
    # before the subscriber replays or writes anything, to its end): while none, the
    # tail may leave out what only a subscriber would hear (issue 18). Without it, the
    # feed carries every event.
    subscribers: Callable[[], int] | None = None
    # How many new turns this daemon would start now (0 while busy: actors/admission.py):
    # its scan takes at most that many sessions whose input no daemon has claimed yet.
    room: Callable[[], int] = lambda: 1 << 30


class LedgerPort(ABC):
    """A ledger: the writer actor and the reads, over a backend's connections."""

    # Whether other daemons share this ledger (leases, fences and the feed matter).
    cluster: bool = False
    location = ""  # where it is, for messages: a file, or a database without its password
    # A shared ledger's relay of live events (deltas) between daemons (pg_live.py).
    live: LiveRelay | None = None
    # SQL that is true when an assistant message's JSON ``data`` has no ``completed``.
    _COMPLETED_IS_NULL = "json_extract(data, '$.completed') IS NULL"

    def __init__(self, *, post_delay: float, read_only: bool) -> None:
        self.post_delay = post_delay  # how long a fire-and-forget write may wait for company
        self.read_only = read_only
        # Set by a commit that failed for good (a full disk): every later write fails with
        # it until ``recover``, so nothing lands after a lost post and the ledger stays as
        # of its last good commit.
        self.failure: LedgerError | None = None
        self.hooks: ClusterHooks | None = None
        # The writes not yet taken by a commit, in order, and how many events and
        # whether file contents they hold (what decides where they may commit).
        self._queue: list[WriteEvents] = []
        self._queued_events = 0
        self._queued_blobs = False
        self._closed = False  # ``close_writer`` was called, or the writer ended
        # The writer's wait for company while it has no batch in hand: its deadline is
        # ``_due``, the earliest bound of the posts queued (``_enqueue``); a write
        # someone awaits, or the close, cancels it (``_wake``). None while it works.
        self._wait: trio.CancelScope | None = None
        self._due = math.inf
        # A post bound by ``post_delay`` itself is queued: no later post's bound is
        # sooner, so later posts need not even read the clock.
        self._due_soonest = False
        self._urgent = False  # someone waits on what is queued: the writer waits no more
        self._busy = False  # the writer has a batch in hand (committing or publishing it)
        self._feed: trio.MemorySendChannel[FeedMessage] | None = None
        # Commits made by their callers (``_commit_here``) whose events the feed had no
        # room for: the writer publishes them, in order, before anything else.
        self._unpublished: list[list[Event]] = []
        # Per session, a mark that changes whenever this process sees input added to
        # its inbox: committed by its own writer, or read from the log as another
        # daemon's. A session actor that read an empty inbox at mark M need not read it
        # again while the mark is still M (``inbox_mark``).
        self._inbox_marks: dict[str, int] = {}
        self._inbox_additions = 0
        # Per session, the seq of the last event this process has seen commit that
        # changed its messages or parts (``message_mark``).
        self._message_marks: dict[str, int] = {}
        # Per session whose history follows it (``follow``): the follower, and the
        # message and part events this process's writer committed since its last
        # ``take_written``, in seq order; None once anything else may have changed them
        # (a foreign commit heard, a commit refused or failed, too many kept).
        self._written: dict[str, tuple[object, list[Event] | None]] = {}
        # Per session, the writes made under its lease (``fence``) not yet answered by
        # the writer: while there are none, ``settle`` has nothing to wait for. Kept by
        # a shared ledger only: one process's ``settle`` is a flush.
        self._unsettled: dict[str, int] = {}

    # --- what a backend provides -----------------------------------------------------------

    @abstractmethod
    def _commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """Append and project a batch in one transaction (on a worker thread); per request
        its committed events, or why it was refused (its fence no longer holds)."""

    @abstractmethod
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One read, in ``?`` placeholders."""

    @abstractmethod
    def close(self) -> None: ...

    async def _rows_async(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One read for a hot caller on the event loop (a step's, a turn's). SQLite's is
        ``_rows`` itself, on the loop: its small indexed reads take microseconds. A
        backend whose reads wait on a server overrides it, so the loop does not wait."""
        return self._rows(sql, args)

    async def _run_commit(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        return await on_worker_thread(lambda: self._commit(batch))

    def _commits_on_loop(self, events: int, blobs: bool) -> bool:
        """Whether a batch of ``events`` events (with file contents, if ``blobs``) would
        be committed on the event loop's thread, so that its caller may commit it
        (``_commit_here``). Never, here: a commit that waits for a server or a disk
        goes to a worker thread, from the writer."""
        return False

    def _commit_on_loop(self, batch: list[WriteEvents]) -> list[list[Event] | LedgerRefused]:
        """``_commit`` on the event loop's thread (when ``_commits_on_loop`` said so)."""
        raise NotImplementedError

    def _failure(self, error: Exception) -> tuple[LedgerError, bool]:
        """What a failed commit tells its callers, and whether it sticks (``failure``)."""
        return LedgerError(f"ledger write failed: {error}"), False

    async def _published(
        self, events: list[Event], feed: trio.MemorySendChannel[FeedMessage] | None
    ) -> None:
        """Committed events go to the feed (a shared ledger orders them with others')."""
        if feed is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                message = Publish(events)
                try:
                    feed.send_nowait(message)  # no scheduler trip while the feed has room
                except trio.WouldBlock:
                    await feed.send(message)

    # --- leases: no-ops for a ledger of one process ------------------------------------------

    async def claim(self, session_id: str) -> int | None:
        """Lease ``session_id`` to this process: its epoch, or None if another daemon holds
        it. A ledger of one process (SQLite, under its lock file) always grants epoch 0."""
        return 0

    async def claim_with_reads(self, session_id: str) -> tuple[int | None, ClaimReads | None]:
        """``claim``, and what the claimant reads next if the backend can read it in the
        same round trip (None: read it as usual)."""
        return await self.claim(session_id), None

    async def release(self, session_id: str) -> None:
        """Give the lease back (a turn ended, nothing queued): any daemon may claim it."""
        return None

    def post_release(self, session_id: str) -> None:
        """Give the lease back with the writes posted before this call, in their
        transaction: ``release`` without a transaction of its own (a no-op for one
        process). Before claiming the session again, ``settle`` it."""
        return None

    def take_claim_reads(self, session_id: str) -> ClaimReads | None:
        """What a prompt's commit read when it took the session's lease for this
        process (``WriteEvents.claim``), once, if it still holds: the claim's reads of a
        session actor whose lease that commit took. None: read as usual."""
        return None

    def holds(self, session_id: str) -> bool:
        """Whether this process holds the session's lease (always, for one process)."""
        return True

    def held_epoch(self, session_id: str) -> int | None:
        """The epoch of this process's lease on the session, if it holds one."""
        return 0

    def open_asks(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Permission asks pending on any daemon of a shared ledger (none for one process,
        whose asks its Permission actor lists): ``permission.asked`` data."""
        return []

    def cancel_pending(self, session_id: str) -> bool:
        """Whether a cancel sent through another daemon of a shared ledger awaits the
        session's claimed turn (its holder died before acting on it). Never, for one
        process, whose cancels act at once."""
        return False

    def open_questions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Questions pending on any daemon of a shared ledger (none for one process):
        ``question.asked`` data."""
        return []

    # --- writing ---------------------------------------------------------------------------

    async def run_writer(
        self,
        feed: trio.MemorySendChannel[FeedMessage] | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The writer actor: commit batches in order, then answer and publish.

        Ends when ``close_writer`` is called and the queue is drained, so shielded
        cleanup writes made while the rest of the harness is cancelled still land.

        Group commit: nobody waits on a post, so the posts that follow it (a step
        makes several) may share its transaction. The writer waits for them in one
        cancel scope, whose deadline each post brings to its own bound (``_enqueue``):
        a post queues without waking it (a scheduler round each). A write someone
        awaits, or the close, ends the wait at once (``_wake``), unless its caller
        commits the queue itself, which a step's flush does (``_commit_here``): then
        the writer sleeps on, through step after step.
        """
        self._feed = feed
        task_status.started()
        try:
            while True:
                if not self._urgent and not self._closed:
                    with trio.CancelScope(deadline=self._due) as wait:
                        self._wait = wait
                        await trio.sleep_forever()
                    self._wait = None
                if self._unpublished:
                    with trio.CancelScope(shield=True):
                        await self._publish_unpublished(feed)
                if not self._queue:  # its caller committed it, or nothing came
                    self._urgent = False
                    if self._closed:
                        return
                    continue
                batch = self._take()
                self._busy = True
                try:
                    with trio.CancelScope(shield=True):
                        await self._commit_and_answer(batch, feed)
                finally:
                    self._busy = False
        finally:
            self._closed = True
            self._wait = None
            for request in self._queue:  # left by a writer that failed: no one commits them
                if request.reply is not None:
                    request.reply.send_nowait(trio.BrokenResourceError("the ledger's writer ended"))
            self._queue = []

    def _take(self) -> list[WriteEvents]:
        """The writer's next batch: everything queued, unless that is more than a batch."""
        batch = self._queue
        if len(batch) <= _MAX_BATCH:
            self._queue = []
            self._queued_events, self._queued_blobs = 0, False
            self._urgent = False
        else:
            batch, self._queue = batch[:_MAX_BATCH], batch[_MAX_BATCH:]
            self._queued_events = sum(len(request.events) for request in self._queue)
            self._queued_blobs = any(request.blobs for request in self._queue)
            self._urgent = True  # more queued: no waiting for company
        self._due, self._due_soonest = math.inf, False
        return batch

    async def _publish_unpublished(self, feed: trio.MemorySendChannel[FeedMessage] | None) -> None:
        """Publish, in order, what commits made by their callers could not (a full feed).
        Each stays listed until sent, so that later ones queue behind it."""
        while self._unpublished:
            await self._published(self._unpublished[0], feed)
            del self._unpublished[0]

    def inbox_mark(self, session_id: str) -> int:
        """What this process has seen of input added to the session's inbox.

        It changes, before the input's writer is answered and before any session is
        woken for it, each time an ``inbox.added`` of the session is committed here or
        read from another daemon's commits. Nothing else adds to an inbox, so an inbox
        read empty at mark M is still empty while the mark is M: a session actor reads
        it once per change, not once per step (issue 18).
        """
        return self._inbox_marks.get(session_id, 0)

    def message_mark(self, session_id: str) -> int:
        """The seq of the last commit of the session's messages or parts seen here: by
        this process's writer (before it answers) or read from another daemon's by the
        tail. While it has not moved, this process has written none of them."""
        return self._message_marks.get(session_id, 0)

    def follow(self, session_id: str, follower: object) -> None:
        """Keep, for ``follower`` (a history), the session's message and part events this
        process's writer commits from now on, until ``take_written`` hands them over.

        Under a session's lease its holder is the only writer of its messages and parts
        on a shared ledger (the fence), and the tail tells of any other commit it hears;
        a SQLite file has one running harness, the holder of its lock
        (harness/storage/lock.py), whose readers write nothing. A failed or refused
        commit, or a foreign one heard, makes the follower read again (``_written``)."""
        self._written[session_id] = (follower, [])

    def unfollow(self, session_id: str, follower: object) -> None:
        """Keep nothing more for ``follower``: its turn is over."""
        kept = self._written.get(session_id)
        if kept is not None and kept[0] is follower:
            del self._written[session_id]

    def take_written(self, session_id: str, follower: object) -> list[Event] | None:
        """The session's message and part events this writer committed since ``follow``
        or the last call, as committed, in seq order, and keep following; None unless
        those are every such commit since (see ``_written``), or ``follower`` is not
        the one followed. The next such events are kept for the next call."""
        kept = self._written.get(session_id)
        if kept is None or kept[0] is not follower:
            return None
        self._written[session_id] = (follower, [])
        return kept[1]

    def _lost_written(self, session_id: str) -> None:
        """Something other than this writer's commit may have changed the session's
        messages or parts: its follower reads at its next catch-up."""
        kept = self._written.get(session_id)
        if kept is not None:
            self._written[session_id] = (kept[0], None)

    def _saw_inbox(self, events: Sequence[Event], *, own: bool = False) -> None:
        """What a commit changed that the marks follow: ``own``, this writer's commit
        (else another daemon's, read by the tail)."""
        marks, written = self._message_marks, self._written
        for event in events:
            kind = event.type
            if kind in _MESSAGE_EVENTS:
                seq = event.seq
                if seq is None:
                    continue
                session_id = event.session_id
                marks[session_id] = seq
                kept = written.get(session_id)
                if kept is None:
                    continue
                if not own or kept[1] is None or len(kept[1]) >= _MAX_WRITTEN:
                    written[session_id] = (kept[0], None)
                else:
                    kept[1].append(event)
            elif kind == "inbox.added":
                self._inbox_additions += 1  # a counter, never reused: marks never repeat
                self._inbox_marks[event.session_id] = self._inbox_additions

    def recover(self) -> None:
        """Accept writes again after a failure (new input: there may be space now)."""
        self.failure = None

    def _settled(self, batch: list[WriteEvents]) -> None:
        """The batch is committed or refused: before its writers hear so (``settle``)."""
        if not self.cluster:
            return
        for request in batch:
            if request.fence is not None:
                session_id = request.fence[0]
                left = self._unsettled.get(session_id, 0) - 1
                if left > 0:
                    self._unsettled[session_id] = left
                else:
                    self._unsettled.pop(session_id, None)

    async def _commit_and_answer(
        self, batch: list[WriteEvents], feed: trio.MemorySendChannel[FeedMessage] | None
    ) -> None:
        if self.failure is not None:
            self._settled(batch)
            for request in batch:
                if request.reply is not None:
                    request.reply.send_nowait(self.failure)
            return
        if not self.cluster and not any(request.events or request.blobs for request in batch):
            # Only flushes: everything posted before them is committed already (batches go
            # in order), so there is nothing to wait for. A shared ledger still commits
            # it: the write's fence is checked there.
            self._settled(batch)
            for request in batch:
                if request.reply is not None:
                    request.reply.send_nowait([])
            return
        try:
            committed = await self._run_commit(batch)
        except Exception as error:
            failure, sticky = self._failed(batch, error)
            if not sticky and not any(request.reply is not None for request in batch):
                raise failure from error
            return
        published = self._answer(batch, committed)
        if published:
            await self._published(published, feed)

    def _failed(self, batch: list[WriteEvents], error: Exception) -> tuple[LedgerError, bool]:
        """A batch's commit failed: its writers hear why; whether that sticks
        (``failure``: every later write fails with it)."""
        self._settled(batch)
        for request in batch:  # committed or not, unknown: read them back
            for new in request.events:
                self._lost_written(new.session_id)
        failure, sticky = self._failure(error)
        for request in batch:
            if request.reply is not None:
                request.reply.send_nowait(failure)
        if sticky:
            # The writer lives on (a dead one would leave shielded waiters waiting for
            # good): the failure goes to every later write, posts dropped.
            self.failure = failure
            log.error("ledger write failed for good", error=str(error))
        return failure, sticky

    def _answer(
        self,
        batch: list[WriteEvents],
        committed: list[list[Event] | LedgerRefused],
        mine: WriteEvents | None = None,
    ) -> list[Event]:
        """A batch was committed: its writers hear so (``mine``, the caller's own write
        when it committed the batch, excepted); the events to publish."""
        self._settled(batch)
        published: list[Event] = []
        for request, events in zip(batch, committed, strict=True):
            if isinstance(events, LedgerRefused):
                fenced = isinstance(events, LedgerFenced)
                if fenced and request.fence is not None:
                    # Another daemon holds the lease now: it may write the session's messages.
                    self._lost_written(request.fence[0])
                if request.reply is not None:
                    request.reply.send_nowait(events)
                elif request is not mine:
                    why = "the lease is lost" if fenced else "its session does not exist"
                    log.warning(f"write refused: {why}", error=str(events))
                continue
            if request.reply is not None:
                request.reply.send_nowait(events)
            published += events
        # Before anyone answered runs, or anyone is woken (no checkpoint until then).
        self._saw_inbox(published, own=True)
        self._after_commit()
        return published

    def _after_commit(self) -> None:
        """A batch was committed and its writers answered (they have not run yet)."""
        return None

    def post(
        self,
        events: Sequence[NewEvent],
        *,
        blobs: Sequence[tuple[str, bytes]] = (),
        fence: tuple[str, int] | None = None,
        within: float | None = None,
    ) -> None:
        """Fire-and-forget write, ordered with every other write.

        It waits up to the writer's ``post_delay`` for other writes to share its
        transaction; ``within`` (seconds) lets a post nobody needs soon wait longer, so
        that what follows it joins it instead of making a transaction of its own (the
        assistant message a step opens as it asks the model: ``Recorder.open``). Any
        other post that joins the wait is still committed within its own bound, and a
        write someone awaits ends the wait at once. Without group commit
        (``post_delay`` 0) nothing waits.
        """
        lease = fence or current_lease.get()
        self._enqueue(WriteEvents(events, blobs=blobs, fence=lease, within=within))

    def _enqueue(self, request: WriteEvents) -> None:
        """Queue a write; one nobody awaits brings the writer's deadline to its bound:
        its ``within``, if longer than ``post_delay``, else ``post_delay``."""
        if self._closed:
            raise trio.ClosedResourceError("the ledger's writer is closed")
        self._queue.append(request)
        self._queued_events += len(request.events)
        if request.blobs:
            self._queued_blobs = True
        if request.fence is not None and self.cluster:
            session_id = request.fence[0]
            self._unsettled[session_id] = self._unsettled.get(session_id, 0) + 1
        if request.reply is not None or self._due_soonest:
            return
        delay = self.post_delay
        if delay <= 0:
            self._wake()
            return
        within = request.within
        bound = within if within is not None and within > delay else delay
        due = trio.current_time() + bound
        if due < self._due:
            self._due = due
            if self._wait is not None:
                self._wait.deadline = due
        self._due_soonest = bound == delay

    async def write(
        self,
        events: Sequence[NewEvent],
        *,
        blobs: Sequence[tuple[str, bytes]] = (),
        fence: tuple[str, int] | None = None,
        exists: str | None = None,
        claim: bool = False,
    ) -> list[Event]:
        """Write and wait until the events (and the file contents they name) are committed.

        Raises ``LedgerFenced`` when the writer's lease (``fence``, else the task's
        ``current_lease``) was taken by another daemon, and ``LedgerMissing`` when
        session ``exists`` does not exist at the commit: nothing was written. With
        ``claim``, a shared ledger also takes that session's lease in the transaction,
        if free (``WriteEvents.claim``).
        """
        lease = fence or current_lease.get()
        if self._may_commit_here(len(events), bool(blobs)):
            mine = WriteEvents(events, None, blobs, lease, exists=exists, claim=claim)
            return self._commit_here(mine)
        # Not ``mailbox.ask``: its ``await send`` is a checkpoint, so a caller already
        # cancelled would never post the write. Queued at once, the events reach the
        # writer whatever happens to the caller next.
        reply_send, reply_receive = trio.open_memory_channel(1)
        self._enqueue(WriteEvents(events, reply_send, blobs, lease, exists=exists, claim=claim))
        self._wake()
        answer: list[Event] | Exception = await reply_receive.receive()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def flush(self) -> None:
        """Wait until every write posted before this call is committed."""
        if not self.cluster and not self._closed:
            if not self._queue and not self._busy:
                # Batches go in order: everything posted before is committed already. A
                # shared ledger's flush still commits: its fence is checked there.
                if self.failure is not None:
                    raise self.failure
                return
            if self._may_commit_here(0, False):
                self._commit_here(None)
                return
        await self.write(())

    async def settle(self, session_id: str) -> None:
        """Wait until the writes made under the session's lease are committed.

        As ``flush`` for a ledger of one process. A shared ledger's flush is a
        transaction (its fence is checked there); when every write made under this
        session's lease has been answered already, there is nothing to wait for, and
        none is made: a turn's start and its release used to make one each (issue 18).
        """
        if not self.cluster or self._unsettled.get(session_id):
            await self.flush()

    def close_writer(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        """Someone waits on the writer: what it has queued is committed now."""
        self._urgent = True
        if self._wait is not None:
            self._wait.cancel()

    def _may_commit_here(self, events: int, blobs: bool) -> bool:
        """Whether a write of ``events`` events (``blobs``: with file contents) may be
        committed by its caller, with everything queued before it: the writer waits
        with no batch in hand, and the backend would commit the batch on the event
        loop's thread anyway (``_commits_on_loop``)."""
        return (
            self._wait is not None
            and not self._busy
            and not self._closed
            and self.failure is None
            and len(self._queue) < _MAX_BATCH
            and self._commits_on_loop(self._queued_events + events, self._queued_blobs or blobs)
        )

    @trio.lowlevel.enable_ki_protection
    def _commit_here(self, mine: WriteEvents | None) -> list[Event]:
        """Commit what is queued, then ``mine``, in the caller's task, as the writer would:
        its writers answered, its events published. What ``mine`` committed, or why not.

        A step's flush finds its posts queued and the writer waiting for company: handed
        to the writer, the batch cost a reply channel, two wake-ups of the writer and one
        of the caller (the scheduler's rounds), for a commit made on the event loop's
        thread all the same (issue 14). A Ctrl-C waits for its end, as for the writer's
        commit on the loop: never a batch committed and its writers left unanswered.
        """
        batch = self._queue
        if mine is not None:
            batch.append(mine)
            if mine.fence is not None and self.cluster:
                session_id = mine.fence[0]
                self._unsettled[session_id] = self._unsettled.get(session_id, 0) + 1
        self._queue = []
        self._queued_events, self._queued_blobs = 0, False
        self._urgent = False
        if self._due_soonest or self._due != math.inf:
            self._due, self._due_soonest = math.inf, False
            if self._wait is not None:
                self._wait.deadline = math.inf  # the writer sleeps on
        try:
            committed = self._commit_on_loop(batch)
        except Exception as error:
            failure, _ = self._failed(batch, error)
            raise failure from error
        published = self._answer(batch, committed, mine)
        if published:
            self._publish_here(published)
        if mine is None:
            return []
        result = committed[-1]
        if isinstance(result, LedgerRefused):
            raise result
        return result

    def _publish_here(self, events: list[Event]) -> None:
        """Publish a commit made by its caller: the feed takes it at once while it has
        room and nothing waits before it; else the writer publishes it, in order."""
        feed = self._feed
        if feed is None:
            return
        if not self._unpublished:
            try:
                feed.send_nowait(Publish(events))
                return
            except trio.WouldBlock:
                pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        self._unpublished.append(events)
        self._wake()

    # --- reading ---------------------------------------------------------------------------

    def session(self, session_id: str) -> Session | None:
        rows = self._rows(_SESSION, (session_id,))
        return Session.model_validate_json(rows[0][0]) if rows else None

    async def session_async(self, session_id: str) -> Session | None:
        """``session``, for the event loop's hot callers (``_rows_async``)."""
        rows = await self._rows_async(_SESSION, (session_id,))
        return Session.model_validate_json(rows[0][0]) if rows else None

    def sessions(self, status: str | None = None) -> list[Session]:
        if status is None:
            rows = self._rows("SELECT data FROM sessions ORDER BY updated DESC")
        else:
            rows = self._rows(
                "SELECT data FROM sessions WHERE status = ? ORDER BY updated DESC", (status,)
            )
        return [Session.model_validate_json(row[0]) for row in rows]

    def children(self, session_id: str) -> list[Session]:
        rows = self._rows(
            "SELECT data FROM sessions WHERE parent_id = ? ORDER BY id", (session_id,)
        )
        return [Session.model_validate_json(row[0]) for row in rows]

    def messages(self, session_id: str) -> list[MessageWithParts]:
        """A session's transcript: messages in order, each with its parts in order."""
        messages = [
            _MESSAGE.validate_json(row[0])
            for row in self._rows(
                "SELECT data FROM messages WHERE session_id = ? ORDER BY created_seq",
                (session_id,),
            )
        ]
        parts: dict[str, list[Part]] = {}
        for row in self._rows(
            "SELECT message_id, data FROM parts WHERE session_id = ? ORDER BY id", (session_id,)
        ):
            parts.setdefault(row[0], []).append(_PART.validate_json(row[1]))
        return [MessageWithParts(info=m, parts=parts.get(m.id, [])) for m in messages]

    async def changes_async(
        self, session_id: str, after_seq: int
    ) -> tuple[list[Message], list[Part], int]:
        """``changes``, for the event loop's hot callers (``_rows_async``)."""
        return self.changes(session_id, after_seq)

    def changes(self, session_id: str, after_seq: int) -> tuple[list[Message], list[Part], int]:
        """Messages and parts of a session written after ``after_seq``, and the new mark.

        Messages come in the order they were created, parts in the order they changed.

        The runner reads only what changed since its last step, so a step costs the same
        at step 200 as at step 2.
        """
        mark = after_seq
        messages: list[Message] = []
        for seq, data in self._rows(
            "SELECT seq, data FROM messages WHERE session_id = ? AND seq > ? ORDER BY created_seq",
            (session_id, after_seq),
        ):
            messages.append(_MESSAGE.validate_json(data))
            mark = max(mark, seq)
        parts: list[Part] = []
        for seq, data in self._rows(
            "SELECT seq, data FROM parts WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after_seq),
        ):
            parts.append(_PART.validate_json(data))
            mark = max(mark, seq)
        return messages, parts, mark

    def inbox(self, session_id: str) -> list[InboxItem]:
        return [InboxItem.model_validate_json(row[0]) for row in self._rows(_INBOX, (session_id,))]

    async def inbox_async(self, session_id: str) -> list[InboxItem]:
        """``inbox``, for the event loop's hot callers (``_rows_async``)."""
        rows = await self._rows_async(_INBOX, (session_id,))
        return [InboxItem.model_validate_json(row[0]) for row in rows]

    def claimed_turns(self, session_id: str | None = None) -> list[tuple[str, str, int]]:
        """Turns started and never finished: ``(session_id, message_id, resumes)``."""
        if session_id is None:
            rows = self._rows("SELECT session_id, message_id, resumes FROM turns ORDER BY started")
        else:
            rows = self._rows(_SESSION_TURNS, (session_id,))
        return [(row[0], row[1], int(row[2])) for row in rows]

    async def claimed_turns_async(self, session_id: str) -> list[tuple[str, str, int]]:
        """``claimed_turns`` of one session, for the event loop's hot callers."""
        rows = await self._rows_async(_SESSION_TURNS, (session_id,))
        return [(row[0], row[1], int(row[2])) for row in rows]

    def sessions_with_inbox(self) -> list[str]:
        return [row[0] for row in self._rows("SELECT DISTINCT session_id FROM inbox")]

    def known_message(self, message_id: str) -> bool:
        """Whether an id is already taken by a message or a queued input (idempotency)."""
        rows = self._rows(
            "SELECT 1 FROM messages WHERE id = ? UNION ALL SELECT 1 FROM inbox WHERE id = ?",
            (message_id, message_id),
        )
        return bool(rows)

    def prompt_origin(self, message_id: str) -> tuple[str, str] | None:
        """The session and text a message id was first prompted with, or None if unused.

        A queued input still holds its text; a taken one is the user message's first
        text part (the prompt, verbatim).
        """
        rows = self._rows("SELECT session_id, data FROM inbox WHERE id = ?", (message_id,))
        if rows:
            return rows[0][0], InboxItem.model_validate_json(rows[0][1]).text
        rows = self._rows(
            "SELECT m.session_id, p.data FROM messages m LEFT JOIN parts p"
            " ON p.message_id = m.id AND p.type = 'text' WHERE m.id = ? AND m.role = 'user'"
            " ORDER BY p.id LIMIT 1",
            (message_id,),
        )
        if not rows:
            return None
        part = _PART.validate_json(rows[0][1]) if rows[0][1] else None
        return rows[0][0], part.text if isinstance(part, TextPart) else ""

    def user_message(self, message_id: str) -> UserMessage | None:
        rows = self._rows(_USER_MESSAGE, (message_id,))
        message = _MESSAGE.validate_json(rows[0][0]) if rows else None
        return message if isinstance(message, UserMessage) else None

    async def user_message_async(self, message_id: str) -> UserMessage | None:
        """``user_message``, for the event loop's hot callers (``_rows_async``)."""
        rows = await self._rows_async(_USER_MESSAGE, (message_id,))
        message = _MESSAGE.validate_json(rows[0][0]) if rows else None
        return message if isinstance(message, UserMessage) else None

    def open_tool_parts(self, session_id: str) -> list[ToolPart]:
        rows = self._rows(
            "SELECT data FROM parts WHERE session_id = ? AND type = 'tool'"
            " AND status IN ('pending', 'running') ORDER BY id",
            (session_id,),
        )
        return [ToolPart.model_validate_json(row[0]) for row in rows]

    def assistant_messages(
        self, session_id: str, *, unfinished_or_in: set[str]
    ) -> list[AssistantMessage]:
        """Assistant messages never completed, plus those whose ids are given."""
        found: list[AssistantMessage] = []
        for (data,) in self._rows(
            "SELECT data FROM messages WHERE session_id = ? AND role = 'assistant'"
            f" AND ({self._COMPLETED_IS_NULL}"
            f" OR id IN ({','.join('?' for _ in unfinished_or_in) or 'NULL'}))"
            " ORDER BY created_seq",
            (session_id, *unfinished_or_in),
        ):
            found.append(AssistantMessage.model_validate_json(data))
        return found

    def todos(self, session_id: str) -> list[Todo]:
        """A session's task list as ``todowrite`` last stored it (empty if never)."""
        rows = self._rows("SELECT data FROM todos WHERE session_id = ?", (session_id,))
        if not rows:
            return []
        return [Todo.model_validate(item) for item in json.loads(rows[0][0])["todos"]]

    def approvals(self, project: str) -> list[Rule]:
        return [
            Rule(permission=row[0], pattern=row[1], action="allow")
            for row in self._rows(
                "SELECT permission, pattern FROM approvals WHERE project = ? ORDER BY created",
                (project,),
            )
        ]

    def events_after(
        self, after_seq: int, *, session_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> list[Event]:
        if session_ids is None:
            rows = self._rows(
                "SELECT seq, ts, type, session_id, data FROM events WHERE seq > ?"
                " ORDER BY seq LIMIT ?",
                (after_seq, limit),
            )
        else:
            marks = ",".join("?" for _ in session_ids)
            rows = self._rows(
                "SELECT seq, ts, type, session_id, data FROM events"
                f" WHERE seq > ? AND session_id IN ({marks}) ORDER BY seq LIMIT ?",
                (after_seq, *session_ids, limit),
            )
        return [Event(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def mcp_processes(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(session_id, server, data)`` of each MCP server process group recorded and not
        recorded as ended since: what a harness that died may have left running. ``data``
        is the ``mcp.process`` event's (its ``process`` identity, and its ``owner``)."""
        # In the words of the partial index on them (PostgreSQL's, said with IN, proves
        # it from these as well).
        rows = self._rows(
            f"SELECT session_id, type, data FROM events WHERE {MCP_EVENTS} ORDER BY seq"
        )
        open_groups: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for session_id, kind, data in rows:
            payload = json.loads(data)
            identity = payload.get("process")
            if not isinstance(identity, dict):
                continue
            key = json.dumps(identity, sort_keys=True)
            if kind == "mcp.process":
                open_groups[key] = (session_id, str(payload.get("server", "")), payload)
            else:
                open_groups.pop(key, None)
        return list(open_groups.values())

    def last_seq(self) -> int:
        rows = self._rows("SELECT max(seq) FROM events")
        value = rows[0][0]
        return int(value) if value is not None else 0

    # --- file snapshots (harness/snapshots.py) ---------------------------------------------

    def blob(self, digest: str) -> bytes | None:
        rows = self._rows("SELECT data FROM blobs WHERE hash = ?", (digest,))
        return zlib.decompress(bytes(rows[0][0])) if rows else None

    def file_changes(self, session_ids: Sequence[str]) -> list[FileChangeRow]:
        """Every recorded file change of these sessions, in the order they happened."""
        marks = ",".join("?" for _ in session_ids)
        rows = self._rows(
            "SELECT seq, session_id, message_id, call_id, kind, path, before, after, done"
            f" FROM file_changes WHERE session_id IN ({marks}) ORDER BY seq, path",
            tuple(session_ids),
        )
        return [
            FileChangeRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], done=bool(r[8]))
            for r in rows
        ]

    def message_seq(self, message_id: str) -> tuple[str, int] | None:
        """A message's session and the seq that orders it (``created_seq``)."""
        rows = self._rows(
            "SELECT session_id, created_seq FROM messages WHERE id = ?", (message_id,)
        )
        return (str(rows[0][0]), int(rows[0][1])) if rows else None


@dataclass(slots=True, frozen=True)
class FileChangeRow:
    seq: int
    session_id: str
    message_id: str
    call_id: str
    kind: str  # "tool" or "revert"
    path: str
    before: str | None
    after: str | None
    done: bool



"""The embedding API: ``async with open_harness(config) as h`` inside any Trio program.

It starts the same actor tree the daemon runs::

    open_harness
    ├── ledger writer     the only connection that writes
    ├── EventFeed         committed and live events to subscribers
    ├── Permission        rules, asks, replies, "always" approvals
    ├── Question          questions the model asks the user, until answered
    └── Supervisor        one SessionActor per active session
        └── SessionActor → Runner → ToolExecutor

and a ``Harness`` handle whose methods only send messages to those actors or read the
ledger. Leaving the block cancels every session (their cleanup still reaches the
ledger), then lets the writer drain before the ledger closes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog
import trio

from harness import frontmatter, snapshots
from harness.actors.admission import TurnGate
from harness.actors.event_feed import EventFeed, overflow_event, subscription
from harness.actors.new_session import new_session, record_session
from harness.actors.permission import Permission
from harness.actors.question import Question
from harness.actors.recovery import reap_mcp_servers
from harness.actors.services import SessionServices
from harness.actors.supervisor import Supervisor
from harness.agent_files import AgentBook
from harness.agents import primary_agent
from harness.config import Config, SocketPathError, default_home
from harness.logs import configure_logging
from harness.messages import ids
from harness.messages.events import Event, NewEvent, TurnResult, wait_turn_finished
from harness.messages.mailbox import (
    AnswerQuestion,
    CancelSession,
    FeedMessage,
    LeaseLost,
    ListPending,
    ListQuestions,
    RegisterChild,
    ReplyPermission,
    SupervisorMessage,
    WakeSession,
    ask,
)
from harness.messages.model import Delivery, InboxItem, MessageWithParts, Rule, Session
from harness.messages.permission import PermissionRequest, Reply
from harness.messages.question import Answers, QuestionRequest, check_answers
from harness.messages.todo import Todo
from harness.private import prepare_home
from harness.providers import resolve_model, split_model
from harness.providers.limiter import ProviderLimiters
from harness.providers.table import named_providers
from harness.secrets import refresh_secrets
from harness.storage.backend import open_ledger
from harness.storage.lock import LockHolder, hold_ledger
from harness.storage.port import ClusterHooks, LedgerMissing, LedgerPort
from harness.tools.registry import builtin_tools, tool_specs, tool_table
from harness.tools.sandbox import Sandbox

if TYPE_CHECKING:
    from harness.actors.mcp_hub import HubClient, McpHub
    from harness.mcp.spec import McpServerSpec

log = structlog.get_logger("harness")


COMPACT_REQUEST = "/compact"  # the text a compaction turn's user message holds
_DELETE_WAIT = 10.0  # seconds a deletion waits for a cancelled turn to write its last events


class HarnessError(ValueError):
    """A request the harness refuses (unknown session, bad directory); says why."""


class UnknownSession(HarnessError):
    """No session has this id (the API answers 404)."""


class PromptConflict(HarnessError):
    """A message id already used in another session, or with another text."""


class Harness:
    """A handle on a running actor tree. Create it with ``open_harness``.

    Which calls are coroutines follows one rule, by what the call does:

    - A plain method reads rows the ledger keeps ready (``session``, ``sessions``,
      ``todos``, ``session_tree``): indexed queries on the read connection, answered
      at once, so it never waits and may be called from synchronous code too.
    - A coroutine is everything else: a call that writes to the ledger (``prompt``,
      ``create_session``, ``revert``…), asks an actor and waits for its answer
      (``cancel``, ``pending_permissions``, ``reply_permission``…), waits for events
      (``run``, ``subscribe``, ``follow``), or reads an amount that grows with the work
      done: ``messages`` assembles the whole transcript and ``diff`` reads the
      workspace's files, so either may later move off the event loop without its
      callers changing.

    A new method picks its kind by the same rule.
    """

    def __init__(
        self,
        config: Config,
        ledger: LedgerPort,
        feed: trio.MemorySendChannel[FeedMessage],
        permission: Permission,
        supervisor: Supervisor,
        question: Question,
        sandbox: Sandbox | None = None,
        mcp: McpHub | None = None,
        *,
        agents: AgentBook | None = None,
    ) -> None:
        self.config = config
        self._mcp = mcp
        # The agents a session may use, read for its directory when it is created.
        self.agents = agents or AgentBook(config.agents, files=config.agent_files)
        self.sandbox = sandbox or Sandbox()  # what tools' subprocesses run under
        self.ledger = ledger
        self._feed = feed
        self._permission = permission
        self._question = question
        self._supervisor = supervisor
        self.closing = False  # set when the block ends: a closed feed is then no overflow

    # --- sessions ---------------------------------------------------------------------------

    async def create_session(
        self,
        directory: str | Path = ".",
        *,
        model: str | None = None,
        agent: str | None = None,
        title: str = "",
        permission: Sequence[Rule] = (),
        parent_id: str | None = None,
        base_url: str | None = None,
        default_model: str | None = None,
    ) -> Session:
        """A new session in ``directory``. Its model: ``model`` if given, else its agent's,
        else ``default_model`` (a project file's, through the daemon), else the config's.
        Raises ``UnknownAgentError`` for an agent that is unknown or only a subagent, and
        ``ConfigFileError`` for a project agent file that cannot be read."""
        path = Path(directory).expanduser()
        try:
            is_dir = path.is_dir()
        except (OSError, ValueError) as error:  # ENAMETOOLONG, a NUL byte, ELOOP...
            raise HarnessError(f"unusable directory {str(path)[:200]!r}: {error}") from None
        if not is_dir:
            raise HarnessError(f"directory does not exist: {path}")
        agent_name = agent or self.config.agent
        catalog = self.agents.load(path)  # the project's agent files, read now
        chosen = primary_agent(agent_name, catalog)  # UnknownAgentError lists the choices
        model_name = model or chosen.model or default_model or self.config.model
        split_model(model_name)  # raises on an unknown provider
        # A file argument is made absolute now: a daemon's working directory is not the
        # client's.
        model_name = resolve_model(model_name)
        session = new_session(
            parent_id=parent_id,
            title=title,
            directory=str(path.resolve()),
            agent=agent_name,
            model=model_name,
            base_url=base_url,
            permission=permission,
        )
        self.agents.bind(session.id, catalog)
        await record_session(self.ledger, self._feed, session)
        log.info("session created", session_id=session.id, model=model_name)
        return session

    async def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        add_rules: Sequence[Rule] = (),
        base_url: str | None = None,
        model: str | None = None,
        agent: str | None = None,
    ) -> Session:
        """Change settings a later turn uses: the title, more rules, the provider's server,
        the model or the agent (checked as ``create_session`` checks them).

        Added rules go after the session's own, so they win (the last matching rule
        does). Refused with ``snapshots.SessionBusy`` while a turn runs or input waits:
        the running turn's session actor owns the row until it is idle again.
        """
        session = self.session(session_id)
        # Bad values are refused first, busy or not: the request is wrong either way.
        if agent is not None:
            # The session's own catalog: UnknownAgentError lists the primary agents.
            primary_agent(agent, self.agents.of(session))
        if model is not None:
            split_model(model)  # raises on an unknown provider
        busy = session.status in ("busy", "retry")
        if busy or self.ledger.inbox(session_id) or self.ledger.claimed_turns(session_id):
            raise snapshots.SessionBusy(f"session {session_id} is busy: try again once idle")
        changes: dict[str, object] = {"updated": time.time()}
        if title is not None:
            changes["title"] = title
        if add_rules:
            changes["permission"] = [*session.permission, *add_rules]
        if base_url is not None:
            changes["base_url"] = base_url
        if agent is not None:
            changes["agent"] = agent
        if model is not None:
            changes["model"] = resolve_model(model)
        updated = session.model_copy(update=changes)
        await self.ledger.write([NewEvent.of("session.updated", session_id, updated)])
        log.info("session updated", session_id=session_id, fields=sorted(changes))
        return updated

    def session(self, session_id: str) -> Session:
        session = self.ledger.session(session_id)
        if session is None:
            raise UnknownSession(f"no session {session_id}")
        return session

    def sessions(self) -> list[Session]:
        return self.ledger.sessions()

    async def messages(self, session_id: str) -> list[MessageWithParts]:
        self.session(session_id)
        return self.ledger.messages(session_id)

    def todos(self, session_id: str) -> list[Todo]:
        """The session's task list, as its model last wrote it with ``todowrite``."""
        self.session(session_id)
        return self.ledger.todos(session_id)

    async def delete_session(self, session_id: str) -> None:
        """Drop queued input, cancel a running turn, then delete the session's rows.

        The deletion is written only after the cancelled turn has written its last
        events, so a late ``session.updated`` cannot bring the row back; queued input is
        taken first so the session actor finds nothing left to start.
        """
        self.session(session_id)
        queued = self.ledger.inbox(session_id)
        if queued:
            await self.ledger.write(
                [NewEvent("inbox.taken", session_id, {"id": item.id}) for item in queued]
            )
        async with self.subscribe(session_id) as events:
            if await self.cancel(session_id):
                with trio.move_on_after(_DELETE_WAIT):
                    await wait_turn_finished(events, session_id=session_id)
        await self.ledger.write([NewEvent("session.deleted", session_id, {"id": session_id})])
        log.info("session deleted", session_id=session_id, dropped_inputs=len(queued))

    # --- file snapshots ---------------------------------------------------------------------

    async def diff(
        self, session_id: str, *, since_message: str | None = None
    ) -> tuple[str, list[dict[str, object]]]:
        """A unified diff of every file the session (and its children) changed, from the
        content first snapshotted (or before ``since_message``) to what is on disk now; and
        the files with their added/removed line counts."""
        self.session(session_id)
        return snapshots.diff_session(self.ledger, session_id, since_message=since_message)

    async def revert(self, session_id: str, message_id: str) -> snapshots.RevertResult:
        """Put the workspace back as it was before ``message_id``; recorded in the ledger.

        Raises ``snapshots.SessionBusy`` while a turn runs or is queued, and
        ``snapshots.RevertConflict`` (naming the files, nothing written) when a file no
        longer holds what the session last wrote there.
        """
        self.session(session_id)
        result = await snapshots.revert_session(self.ledger, session_id, message_id)
        log.info("session reverted", session_id=session_id, to=message_id, files=len(result.files))
        return result

    # --- input ------------------------------------------------------------------------------

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        delivery: Delivery = "queue",
        message_id: str | None = None,
        max_steps: int | None = None,
        compact: bool = False,
    ) -> str:
        """Make the input durable and wake the session; returns the message id.

        Answers once the input is committed, before any model call. A ``message_id``
        already prompted in this session with this text is not added again (the call is
        idempotent); the same id in another session or with another text is a
        ``PromptConflict``, never a prompt silently dropped. ``max_steps`` limits this
        turn only.
        """
        # Looked up first, so an unknown session is told as such before anything else.
        # A plain prompt reads nothing: its commit checks the session exists (``exists``),
        # under the append lock, so no deletion slips in between (issue 18: a read a
        # prompt, blocking the event loop on a shared ledger).
        looked_up = not text.strip() or message_id is not None
        if looked_up and await self.ledger.session_async(session_id) is None:
            raise UnknownSession(f"no session {session_id}")
        if not text.strip():
            raise HarnessError("the prompt is empty")
        if message_id is not None:
            origin = self.ledger.prompt_origin(message_id)
            if origin is not None:
                used_in, used_text = origin
                if used_in != session_id:
                    raise PromptConflict(
                        f"message_id {message_id} is already used in session {used_in}"
                    )
                if used_text != text:
                    raise PromptConflict(
                        f"message_id {message_id} was already prompted with another text"
                    )
                return message_id
            if self.ledger.known_message(message_id):  # an assistant message's id
                raise PromptConflict(f"message_id {message_id} is already used")
        self.ledger.recover()  # new input after a failed write (a full disk): try again
        item = InboxItem(
            id=message_id or ids.message_id(),
            session_id=session_id,
            text=text,
            delivery=delivery,
            max_steps=max_steps,
            compact=compact,
            created=time.time(),
        )
        ledger = self.ledger
        # A session no actor runs here: its commit also takes the lease, if free, and
        # reads what the actor it wakes reads first (a claim's transaction fewer a turn);
        # unless this daemon is too busy to start the turn at once: the lease then stays
        # free while the turn waits to be admitted, for a less busy daemon to claim.
        claim = (
            ledger.cluster
            and not ledger.holds(session_id)
            and not self._supervisor.runs(session_id)
            and self._supervisor.accepting()
        )
        try:
            await ledger.write(
                [NewEvent.of("inbox.added", session_id, item)], exists=session_id, claim=claim
            )
        except LedgerMissing:
            raise UnknownSession(f"no session {session_id}") from None
        except trio.Cancelled:
            if claim:
                # The write lands all the same (posted before the wait), and a lease
                # its commit took must find its actor here (the mailbox is unbounded).
                self._supervisor.mailbox.send_nowait(WakeSession(session_id))
            raise
        await self._supervisor.mailbox.send(WakeSession(session_id))
        return item.id

    async def compact(self, session_id: str, *, message_id: str | None = None) -> str:
        """Queue a compaction turn (chat's ``/compact``): the model summarizes the whole
        history, which from then on stands in for it. Returns the turn's message id; its
        ``turn.finished`` answer says how far the estimate shrank. The request itself is
        never shown to the model."""
        return await self.prompt(session_id, COMPACT_REQUEST, message_id=message_id, compact=True)

    async def run(self, session_id: str, text: str, *, message_id: str | None = None) -> TurnResult:
        """Prompt, then wait for that turn to end: the answer and the stop reason."""
        async with self.subscribe(session_id) as events:
            sent = await self.prompt(session_id, text, message_id=message_id)
            result = await wait_turn_finished(events, message_id=sent)
            if result is not None:
                return result
        raise HarnessError("the harness closed before the turn finished")

    async def cancel(self, session_id: str) -> bool:
        """Cancel the running turn: its stream, tools and their process groups stop.

        On a shared ledger, a turn that another daemon runs is cancelled there: the
        request is written as ``cancel.requested``, which that daemon's feed hands to its
        supervisor (DESIGN §14).
        """
        self.session(session_id)
        cancelled: bool = await ask(
            self._supervisor.mailbox, lambda reply: CancelSession(session_id, reply)
        )
        ledger = self.ledger
        if cancelled or not ledger.cluster or ledger.holds(session_id):
            return cancelled
        if not ledger.claimed_turns(session_id):
            return False  # no daemon runs a turn of it
        await ledger.write([NewEvent("cancel.requested", session_id, {"by": ledger.location})])
        log.info("cancel sent to the session's daemon", session_id=session_id)
        return True

    # --- MCP servers ------------------------------------------------------------------------

    def mcp_status(self) -> dict[str, object]:
        """This harness's MCP servers as they are now (``harness mcp --json``'s shape):
        ``idle`` until a turn first starts them."""
        hub = self._mcp
        if hub is None:
            threshold = self.config.mcp_search_threshold
            return {
                "servers": [],
                "schema_tokens": 0,
                "search_threshold": threshold,
                "tool_search": False,
            }
        from harness.actors.mcp_client import summary

        return summary(hub)

    async def set_session_mcp_servers(
        self, session_id: str, servers: Mapping[str, McpServerSpec]
    ) -> None:
        """Give one session MCP servers of its own (an ACP client's), replacing those it
        had: only its turns see their tools; they start at its next turn and stop with the
        harness. Their names must not be those of configured servers."""
        hub = self._mcp
        if hub is None:
            raise HarnessError("this harness was opened without session MCP servers")
        self.session(session_id)  # an unknown session is the caller's error
        clash = sorted(set(servers) & set(hub.clients))
        if clash:
            raise HarnessError(
                f"MCP server name {clash[0]!r} is already a configured server's: choose another"
            )
        await hub.set_session_servers(session_id, servers)

    # --- events -----------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, session_id: str | None = None, *, buffer: int = 4096
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """Events from now on, of one session (and its children) or of all sessions."""
        live = self.ledger.live
        # On a shared ledger the daemon running the session sends its deltas here too:
        # subscribed first, so none is lost between the two.
        async with (
            subscription(self._feed, session_id, buffer) as events,
            live.watching(session_id) if live else contextlib.nullcontext(),
        ):
            yield events

    @asynccontextmanager
    async def follow(
        self, session_id: str | None = None, after_seq: int | None = None, *, buffer: int = 4096
    ) -> AsyncIterator[EventStream]:
        """Events after ``after_seq`` from the ledger, then live: no gap, no duplicate.

        Subscribes to the live feed first, then replays the ledger up to its last seq as
        of that moment, then passes live events on, skipping durable ones already
        replayed. Without ``after_seq`` it starts from now. A subscriber that falls behind
        gets a final ``feed.overflow`` event naming the seq to resume from.
        """
        family: list[str] | None = None
        if session_id is not None:
            edges = self.session_tree(session_id)
            family = [session_id, *(child for _, child in edges)]
            for parent, child in edges:  # the feed forgets the tree when the process restarts
                await self._feed.send(RegisterChild(parent, child))
        async with self.subscribe(session_id, buffer=buffer) as live:
            snapshot = self.ledger.last_seq()
            start = snapshot if after_seq is None else min(after_seq, snapshot)
            yield EventStream(self, live, session_id, family, start, snapshot)

    def session_tree(self, session_id: str) -> list[tuple[str, str]]:
        """The (parent, child) pairs below a session, parents before their children."""
        edges: list[tuple[str, str]] = []
        frontier = [session_id]
        while frontier:
            parent = frontier.pop(0)
            for child in self.ledger.children(parent):
                edges.append((parent, child.id))
                frontier.append(child.id)
        return edges

    # --- permissions ------------------------------------------------------------------------

    async def pending_permissions(self, session_id: str | None = None) -> list[PermissionRequest]:
        """Asks waiting for an answer: this process's, and on a shared ledger every
        daemon's (any of them may answer, DESIGN §14)."""
        local: list[PermissionRequest] = await ask(
            self._permission.mailbox, lambda reply: ListPending(session_id, reply)
        )
        if self.ledger.cluster:
            known = {request.id for request in local}
            for data in self.ledger.open_asks(session_id):
                if data.get("id") not in known:
                    local.append(PermissionRequest.model_validate(data))
        return local

    async def reply_permission(
        self,
        request_id: str,
        reply: Reply,
        message: str | None = None,
        *,
        no_terminal: bool = False,
    ) -> bool:
        """Answer a pending ask; False when no such ask is pending.

        ``no_terminal`` (with ``reject``) says nobody could be asked: the call fails with
        the same words, naming the flag that would allow it, as in a run with no terminal.
        """
        answered: bool = await ask(
            self._permission.mailbox,
            lambda done: ReplyPermission(request_id, reply, message, done, no_terminal),
        )
        if answered or not self.ledger.cluster:
            return answered
        # Asked by another daemon: the reply goes through the ledger, which that daemon
        # follows; it records the decision when the reply reaches its ask.
        asked = next((a for a in self.ledger.open_asks() if a.get("id") == request_id), None)
        if asked is None:
            return False
        data = {"id": request_id, "reply": reply, "message": message, "remote": True}
        session_id = str(asked["session_id"])
        await self.ledger.write([NewEvent("permission.replied", session_id, data)])
        return True

    # --- questions --------------------------------------------------------------------------

    async def pending_questions(self, session_id: str | None = None) -> list[QuestionRequest]:
        """Questions waiting for an answer: this process's, and on a shared ledger every
        daemon's (any of them may answer, DESIGN §14)."""
        local: list[QuestionRequest] = await ask(
            self._question.mailbox, lambda reply: ListQuestions(session_id, reply)
        )
        if self.ledger.cluster:
            known = {request.id for request in local}
            for data in self.ledger.open_questions(session_id):
                if data.get("id") not in known:
                    local.append(QuestionRequest.model_validate(data))
        return local

    async def answer_question(self, request_id: str, answers: Answers) -> bool:
        """Answer a pending question set: one list of labels (or free text) per question.

        False when no such question is pending; ``HarnessError`` when the answers do not
        fit the questions (the question stays pending).
        """
        return await self._settle_question(request_id, answers, None)

    async def reject_question(self, request_id: str, message: str | None = None) -> bool:
        """Dismiss a pending question set; False when none is pending.

        Without a ``message`` the turn stops, as after a rejected permission; with one the
        model reads it and carries on.
        """
        return await self._settle_question(request_id, None, message)

    async def _settle_question(
        self, request_id: str, answers: Answers | None, message: str | None
    ) -> bool:
        problem: str | None = await ask(
            self._question.mailbox,
            lambda done: AnswerQuestion(request_id, answers, message, done),
        )
        if problem == "not_found" and self.ledger.cluster:
            problem = await self._settle_remote_question(request_id, answers, message)
        if problem == "not_found":
            return False
        if problem is not None:
            raise HarnessError(f"answers for {request_id} do not fit: {problem}")
        return True

    async def _settle_remote_question(
        self, request_id: str, answers: Answers | None, message: str | None
    ) -> str | None:
        """Answer a question another daemon asked: checked here as the asker would check
        it, then written to the ledger, which that daemon follows (``remote``)."""
        asked = next((q for q in self.ledger.open_questions() if q.get("id") == request_id), None)
        if asked is None:
            return "not_found"
        request = QuestionRequest.model_validate(asked)
        data: dict[str, object] = {"id": request_id, "remote": True}
        if answers is None:
            kind: Literal["question.replied", "question.rejected"] = "question.rejected"
            data |= {"reason": "rejected", "message": message}
        else:
            cleaned = [[label.strip() for label in answer] for answer in answers]
            problem = check_answers(request.questions, cleaned)
            if problem is not None:
                return problem
            kind = "question.replied"
            data["answers"] = cleaned
        await self.ledger.write([NewEvent(kind, request.session_id, data)])
        return None


class EventStream:
    """What ``Harness.follow`` yields: ``await receive()`` or ``async for``.

    ``receive`` may be cancelled at any point (a heartbeat timeout) without losing an
    event, which an async generator could not offer. ``last_seq`` is the seq of the last
    durable event handed out: the point to resume from.
    """

    _PAGE = 500

    def __init__(
        self,
        harness: Harness,
        live: trio.MemoryReceiveChannel[Event],
        session_id: str | None,
        family: list[str] | None,
        after_seq: int,
        replay_until: int,
    ) -> None:
        self._harness = harness
        self._live = live
        self._session_id = session_id
        self._family = family
        self._cursor = after_seq
        self._until = replay_until
        self._replayed: deque[Event] = deque()
        self._replaying = after_seq < replay_until
        self._ended = False
        self.last_seq = after_seq

    def _next_page(self) -> None:
        page = self._harness.ledger.events_after(
            self._cursor, session_ids=self._family, limit=self._PAGE
        )
        page = [event for event in page if event.seq is not None and event.seq <= self._until]
        if not page:
            self._replaying = False
            return
        self._cursor = page[-1].seq or self._cursor
        self._replayed.extend(page)

    async def receive(self) -> Event:
        await trio.lowlevel.checkpoint()
        while True:
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                pass
            try:
                event = await self._live.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return self._live_ended()
            if self._fresh(event):
                return event

    def receive_nowait(self) -> Event:
        """The next event if one is ready; ``trio.WouldBlock`` if not (lets a writer batch)."""
        while True:
            if self._replayed:
                event = self._replayed.popleft()
                self.last_seq = event.seq or self.last_seq
                return event
            if self._replaying:
                self._next_page()
                continue
            if self._ended:
                raise trio.EndOfChannel
            try:
                event = self._live.receive_nowait()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return self._live_ended()
            if self._fresh(event):
                return event

    def _fresh(self, event: Event) -> bool:
        if event.seq is not None:
            if event.seq <= self.last_seq:
                return False  # already replayed
            self.last_seq = event.seq
        return True

    def _live_ended(self) -> Event:
        self._ended = True
        if self._harness.closing:
            raise trio.EndOfChannel from None
        return overflow_event(self._session_id or "", self.last_seq)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


@asynccontextmanager
async def open_harness(
    config: Config | None = None,
    *,
    holder: LockHolder | None = None,
    session_mcp: bool = False,
) -> AsyncIterator[Harness]:
    """Start the actor tree under the caller's task; stop it when the block ends.

    ``holder`` is what the ledger's lock file says about this process (the daemon
    passes its socket), for the message another process gets when it is refused.
    ``session_mcp``: sessions may be given MCP servers of their own
    (``Harness.set_session_mcp_servers``, for ``harness acp``), so an MCP hub runs even
    when no server is configured.
    """
    config = config or Config.from_env()
    # The keys this harness may meet are those of its environment now, and those its
    # named providers read from variables of any name.
    key_names = [kind.key_env for kind in config.providers.values() if kind.key_env]
    refresh_secrets([*config.secret_env, *key_names])
    prepare_home(config.home)
    if config.log_file is not None or not structlog.is_configured():
        configure_logging(
            level=config.log_level,
            format=config.log_format,
            file=config.log_file or config.home / "logs" / "harness.jsonl",
        )
    # A shared ledger has no lock file: its daemons share sessions through leases.
    lock = contextlib.nullcontext() if config.ledger else hold_ledger(config.ledger_path, holder)
    with lock, named_providers(config.providers):
        async with _open_harness(config, session_mcp=session_mcp) as harness:
            yield harness


def _mcp_client(
    hub: McpHub, name: str, spec: McpServerSpec, scope: str | None
) -> HubClient:
    from harness.actors.mcp_client import make_client  # the SDK, with the first server

    return make_client(hub, name, spec, scope)


def _own_paths(config: Config) -> list[Path]:
    """What a command must not reach: this harness's home and socket, and the default
    home's, where a daemon of the same user may listen (its socket approves asks)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    paths = [config.home, default_home(), Path(data) / "harness"]
    with contextlib.suppress(SocketPathError):
        paths.append(config.socket_path)
    return paths


def _forward_reply(permission: Permission, data: dict[str, object]) -> None:
    """A reply given through another daemon reaches the ask, if it is pending here."""
    done = trio.open_memory_channel[bool](1)[0]
    reply = str(data.get("reply"))
    if reply in ("once", "always", "reject"):
        message = data.get("message")
        permission.mailbox.send_nowait(
            ReplyPermission(
                str(data.get("id")),
                reply,  # type: ignore[arg-type]
                message if isinstance(message, str) else None,
                done,
                remote=True,
            )
        )


def _forward_answer(question: Question, kind: str, data: dict[str, object]) -> None:
    """An answer given through another daemon reaches the question, if it is pending here."""
    done = trio.open_memory_channel[str | None](1)[0]
    answers = data.get("answers") if kind == "question.replied" else None
    message = data.get("message")
    question.mailbox.send_nowait(
        AnswerQuestion(
            str(data.get("id")),
            answers if isinstance(answers, list) else None,
            message if isinstance(message, str) else None,
            done,
            remote=True,
        )
    )


@asynccontextmanager
async def _open_harness(config: Config, *, session_mcp: bool = False) -> AsyncIterator[Harness]:
    ledger = open_ledger(config)
    feed = EventFeed()
    permission = Permission(ledger, interactive=config.interactive, yes=config.yes)
    question = Question(ledger, interactive=config.interactive)
    # Config.tools: Python tools and "module:function" entries, checked before anything
    # starts (a bad one is a ConfigError naming it).
    tools, tool_rules = tool_table(config.tools, builtins=builtin_tools())
    sandbox = Sandbox.open(
        config.sandbox,
        bwrap=config.sandbox_bwrap,
        secret_env=config.secret_env,
        hidden=_own_paths(config),
    )
    if sandbox.notice is not None:
        log.warning(
            "sandbox unavailable",
            requested=sandbox.requested,
            reason=sandbox.unavailable,
            notice=sandbox.notice,
        )
    hub = None
    if config.mcp_servers or session_mcp:
        from harness.actors.mcp_hub import McpHub  # the SDK comes with its first server

        hub = McpHub(
            config.mcp_servers,
            ledger=ledger,
            home=config.home,
            search_threshold=config.mcp_search_threshold,
            client_factory=_mcp_client,
            reserved=frozenset(tools),
        )
    # Agent and skill front matter parsed once per file version, across processes too.
    frontmatter.use_store(config.home / "cache" / "front-matter.json")
    services = SessionServices(
        config=config,
        ledger=ledger,
        feed=feed.mailbox,
        permission=permission.mailbox,
        tools=tools,
        tool_specs=tool_specs(tools),
        questions=question.mailbox,
        sandbox=sandbox,
        tool_rules=tool_rules,
        limiters=ProviderLimiters(config.provider_limits),
        mcp=hub,
        agents=AgentBook(config.agents, files=config.agent_files),
        admission=TurnGate(config.admission_seconds),
    )
    supervisor = Supervisor(services)
    # Before any session runs: MCP servers a dead harness left behind (an indexed read of
    # a few rows; the SDK is not imported for it).
    reaped = reap_mcp_servers(ledger)
    if reaped:
        ledger.post(reaped)
    if ledger.cluster:

        def tell(message: SupervisorMessage) -> None:
            # The supervisor may have ended already (shutting down): the ledger's tasks
            # (the orphan scan, the tail) can still hear of work then, for no one.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                supervisor.mailbox.send_nowait(message)

        ledger.hooks = ClusterHooks(
            wake=lambda session_id: tell(WakeSession(session_id, remote=True)),
            lost=lambda session_id: tell(LeaseLost(session_id)),
            orphan=lambda session_id: tell(WakeSession(session_id, remote=True, orphan=True)),
            replied=lambda data: _forward_reply(permission, data),
            answered=lambda kind, data: _forward_answer(question, kind, data),
            cancel=lambda session_id: tell(
                CancelSession(session_id, trio.open_memory_channel[bool](1)[0])
            ),
            subscribers=lambda: feed.subscribers,
            room=services.admission.room,
        )
        feed.relay = ledger.live

    # The writer and the feed are shielded: when a caller's scope cancels the whole block
    # (a daemon's SIGTERM), the sessions' shielded cleanup writes must still find them.
    # Both end by themselves once ``close_writer`` has run, which the ``finally`` ensures.
    async def write_then_close_feed() -> None:
        try:
            with trio.CancelScope(shield=True):
                await ledger.run_writer(feed.mailbox)
        finally:
            feed.mailbox.close()

    async def run_feed(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope(shield=True):
            await feed.run(task_status=task_status)

    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(write_then_close_feed)
            await outer.start(run_feed)
            try:
                async with trio.open_nursery() as inner:
                    await inner.start(permission.run)
                    await inner.start(question.run)
                    if hub is not None:
                        await inner.start(hub.run)
                    await inner.start(supervisor.run)
                    harness = Harness(
                        config,
                        ledger,
                        feed.mailbox,
                        permission,
                        supervisor,
                        question,
                        sandbox,
                        hub,
                        agents=services.agents,
                    )
                    try:
                        yield harness
                    finally:
                        harness.closing = True
                        inner.cancel_scope.cancel()
            finally:
                ledger.close_writer()
    except BaseExceptionGroup as group:
        # Trio groups even a single error; an embedding caller wants the error it raised.
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise
    finally:
        ledger.close()

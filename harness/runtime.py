"""The embedding API: ``async with open_harness(config) as h`` inside any Trio program.

It starts the same actor tree the daemon runs::

    open_harness
    ├── ledger writer     the only connection that writes
    ├── EventFeed         committed and live events to subscribers
    ├── Permission        rules, asks, replies, "always" approvals
    └── Supervisor        one SessionActor per active session
        └── SessionActor → Runner → ToolExecutor

and a ``Harness`` handle whose methods only send messages to those actors or read the
ledger. Leaving the block cancels every session (their cleanup still reaches the
ledger), then lets the writer drain before the ledger closes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import structlog
import trio

from harness.actors.event_feed import EventFeed
from harness.actors.permission import Permission
from harness.actors.session import SessionServices
from harness.actors.supervisor import Supervisor
from harness.agents import get_agent
from harness.config import Config
from harness.logs import configure_logging
from harness.messages import ids
from harness.messages.events import Event, NewEvent, TurnResult
from harness.messages.mailbox import (
    CancelSession,
    FeedMessage,
    ListPending,
    ReplyPermission,
    Subscribe,
    Subscription,
    Unsubscribe,
    WakeSession,
)
from harness.messages.model import Delivery, InboxItem, MessageWithParts, Rule, Session
from harness.messages.permission import PermissionRequest, Reply
from harness.providers import split_model
from harness.storage.ledger import Ledger
from harness.tools.registry import builtin_tools, tool_specs

log = structlog.get_logger("harness")


class HarnessError(ValueError):
    """A request the harness refuses (unknown session, bad directory); says why."""


class Harness:
    """A handle on a running actor tree. Create it with ``open_harness``."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        feed: trio.MemorySendChannel[FeedMessage],
        permission: Permission,
        supervisor: Supervisor,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self._feed = feed
        self._permission = permission
        self._supervisor = supervisor

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
    ) -> Session:
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise HarnessError(f"directory does not exist: {path}")
        agent_name = agent or self.config.agent
        get_agent(agent_name)  # raises UnknownAgentError with the list of agents
        model_name = model or self.config.model
        kind, name = split_model(model_name)  # raises on an unknown provider
        if kind == "scripted":
            # Resolve now: a daemon's working directory is not the client's.
            model_name = f"scripted:{Path(name).expanduser().resolve()}"
        now = time.time()
        session = Session(
            id=ids.session_id(),
            parent_id=parent_id,
            title=title,
            directory=str(path.resolve()),
            agent=agent_name,
            model=model_name,
            permission=list(permission),
            created=now,
            updated=now,
        )
        await self.ledger.write(
            [NewEvent("session.created", session.id, session.model_dump(mode="json"))]
        )
        log.info("session created", session_id=session.id, model=model_name)
        return session

    def session(self, session_id: str) -> Session:
        session = self.ledger.session(session_id)
        if session is None:
            raise HarnessError(f"no session {session_id}")
        return session

    def sessions(self) -> list[Session]:
        return self.ledger.sessions()

    async def messages(self, session_id: str) -> list[MessageWithParts]:
        self.session(session_id)
        return self.ledger.messages(session_id)

    # --- input ------------------------------------------------------------------------------

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        delivery: Delivery = "queue",
        message_id: str | None = None,
    ) -> str:
        """Make the input durable and wake the session; returns the message id.

        Answers once the input is committed, before any model call. A ``message_id``
        that is already known is not added again (the call is idempotent).
        """
        self.session(session_id)
        if not text.strip():
            raise HarnessError("the prompt is empty")
        if message_id is not None and self.ledger.known_message(message_id):
            return message_id
        item = InboxItem(
            id=message_id or ids.message_id(),
            session_id=session_id,
            text=text,
            delivery=delivery,
            created=time.time(),
        )
        await self.ledger.write([NewEvent("inbox.added", session_id, item.model_dump(mode="json"))])
        await self._supervisor.mailbox.send(WakeSession(session_id))
        return item.id

    async def run(self, session_id: str, text: str, *, message_id: str | None = None) -> TurnResult:
        """Prompt, then wait for that turn to end: the answer and the stop reason."""
        async with self.subscribe(session_id) as events:
            sent = await self.prompt(session_id, text, message_id=message_id)
            async for event in events:
                if event.type == "turn.finished" and event.data.get("message_id") == sent:
                    return TurnResult(
                        sent,
                        event.data["reason"],
                        event.data.get("answer", ""),
                        event.data.get("error"),
                    )
        raise HarnessError("the harness closed before the turn finished")

    async def cancel(self, session_id: str) -> bool:
        """Cancel the running turn: its stream, tools and their process groups stop."""
        self.session(session_id)
        reply_send, reply_receive = trio.open_memory_channel[bool](1)
        await self._supervisor.mailbox.send(CancelSession(session_id, reply_send))
        return await reply_receive.receive()

    # --- events -----------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, session_id: str | None = None, *, buffer: int = 4096
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """Events from now on, of one session (and its children) or of all sessions."""
        reply_send, reply_receive = trio.open_memory_channel[Subscription](1)
        await self._feed.send(Subscribe(session_id, reply_send, buffer))
        subscription = await reply_receive.receive()
        try:
            yield subscription.events
        finally:
            with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._feed.send_nowait(Unsubscribe(subscription.id))

    # --- permissions ------------------------------------------------------------------------

    async def pending_permissions(self, session_id: str | None = None) -> list[PermissionRequest]:
        reply_send, reply_receive = trio.open_memory_channel[list[PermissionRequest]](1)
        await self._permission.mailbox.send(ListPending(session_id, reply_send))
        return await reply_receive.receive()

    async def reply_permission(
        self, request_id: str, reply: Reply, message: str | None = None
    ) -> bool:
        """Answer a pending ask; False when no such ask is pending."""
        done_send, done_receive = trio.open_memory_channel[bool](1)
        await self._permission.mailbox.send(ReplyPermission(request_id, reply, message, done_send))
        return await done_receive.receive()


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


@asynccontextmanager
async def open_harness(config: Config | None = None) -> AsyncIterator[Harness]:
    """Start the actor tree under the caller's task; stop it when the block ends."""
    config = config or Config.from_env()
    if config.log_file is not None or not structlog.is_configured():
        configure_logging(
            level=config.log_level,
            format=config.log_format,
            file=config.log_file or config.home / "logs" / "harness.jsonl",
        )
    ledger = Ledger(config.ledger_path, durability=config.durability)
    feed = EventFeed()
    permission = Permission(ledger, interactive=config.interactive)
    tools = builtin_tools()
    services = SessionServices(
        config=config,
        ledger=ledger,
        feed=feed.mailbox,
        permission=permission.mailbox,
        tools=tools,
        tool_specs=tool_specs(tools),
    )
    supervisor = Supervisor(services)

    async def write_then_close_feed() -> None:
        try:
            await ledger.run_writer(feed.mailbox)
        finally:
            feed.mailbox.close()

    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(write_then_close_feed)
            await outer.start(feed.run)
            try:
                async with trio.open_nursery() as inner:
                    await inner.start(permission.run)
                    await inner.start(supervisor.run)
                    try:
                        yield Harness(config, ledger, feed.mailbox, permission, supervisor)
                    finally:
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

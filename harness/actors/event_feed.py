"""EventFeed: fans committed (and ephemeral) events out to subscribers.

Each subscriber has a bounded buffer. Publishing never waits for a subscriber: one that
falls behind is cut off (its channel closed after a final ``feed.overflow`` event when
there is room for it, and ``Subscription`` readers see the end of the stream). A slow
reader can then resume from the ledger with the last ``seq`` it saw, while the sessions
producing events never slow down for it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Protocol

import structlog
import trio

from harness.messages.events import Event
from harness.messages.mailbox import (
    FeedMessage,
    Publish,
    Subscribe,
    Subscription,
    Unsubscribe,
    ask,
)
from harness.secrets import has_secrets, redact_data

log = structlog.get_logger("harness.feed")

_ENDED_PARTS = 4096  # parts whose relayed deltas are known to be over, remembered at most


class LiveRelay(Protocol):
    """Where a shared ledger sends the live events other daemons watch (pg_live.py)."""

    @property
    def others(self) -> Mapping[str, object]:
        """Session id (or "*") -> the other daemons watching it: empty, nothing goes."""

    def offer(self, event: Event, lineage: Iterable[str]) -> None: ...


class _Subscriber:
    __slots__ = ("id", "send", "session_id")

    def __init__(
        self, id: int, session_id: str | None, send: trio.MemorySendChannel[Event]
    ) -> None:
        self.id = id
        self.session_id = session_id
        self.send = send


class EventFeed:
    def __init__(self) -> None:
        self.mailbox, self._receive = trio.open_memory_channel[FeedMessage](1024)
        self._subscribers: dict[int, _Subscriber] = {}
        self._next_id = 0
        self._parent_of: dict[str, str] = {}
        # Set on a shared ledger: live events of this daemon's sessions that another
        # daemon's subscribers watch go there (DESIGN §14).
        self.relay: LiveRelay | None = None
        # Parts streamed here from another daemon, and those whose stored end was
        # published (every part's, on a shared ledger): a delta relayed late (after its
        # part ended) is dropped.
        self._relayed_parts: set[str] = set()
        self._ended_parts: dict[str, None] = {}  # in the order they ended

    @property
    def subscribers(self) -> int:
        """How many subscribers hear this feed now: each from when its ``Subscribe`` is
        handled (before ``subscription`` returns) until it unsubscribed or was cut off."""
        return len(self._subscribers)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with self._receive:
                async for message in self._receive:
                    self._handle(message)
        finally:
            for subscriber in self._subscribers.values():
                subscriber.send.close()
            self._subscribers.clear()

    def _handle(self, message: FeedMessage) -> None:
        if isinstance(message, Publish):
            if message.remote:
                self._relayed(message.events)
                return
            relay = self.relay
            for event in message.events:
                if not event.durable:
                    if has_secrets():
                        # Deltas and step.request skip the ledger, where the rest is
                        # redacted.
                        event = replace(event, data=redact_data(event.data))
                    if relay is not None and relay.others:
                        relay.offer(event, self._lineage(event.session_id))
                elif event.type == "part.updated" and (relay is not None or self._relayed_parts):
                    self._part_stored(event)
                self._fan_out(event)
        elif isinstance(message, Subscribe):
            self._next_id += 1
            send, receive = trio.open_memory_channel[Event](message.buffer)
            self._subscribers[self._next_id] = _Subscriber(self._next_id, message.session_id, send)
            message.reply.send_nowait(Subscription(self._next_id, receive))
        elif isinstance(message, Unsubscribe):
            subscriber = self._subscribers.pop(message.subscription_id, None)
            if subscriber is not None:
                subscriber.send.close()
        else:
            self._parent_of[message.child_id] = message.parent_id

    def _lineage(self, session_id: str) -> list[str]:
        """A session and its ancestors, as far as this feed knows them."""
        lineage = [session_id]
        while (parent := self._parent_of.get(lineage[-1])) is not None and len(lineage) < 64:
            lineage.append(parent)
        return lineage

    def _relayed(self, events: Iterable[Event]) -> None:
        """Live events another daemon relayed: fanned out, unless their part ended here."""
        for event in events:
            if has_secrets():  # this daemon's secrets, which the sender may not know
                event = replace(event, data=redact_data(event.data))
            part_id = event.data.get("part_id")
            if isinstance(part_id, str):
                if part_id in self._ended_parts:
                    continue
                if len(self._relayed_parts) >= _ENDED_PARTS:
                    self._relayed_parts.clear()  # parts that never ended (a cut stream)
                self._relayed_parts.add(part_id)
            self._fan_out(event)

    def _part_stored(self, event: Event) -> None:
        """Remember a part whose stored end was published. On a shared ledger, every
        part: a part streamed in one delta may be stored (and its end read by the tail)
        before the delta's relay arrives, and that delta must not follow its end."""
        part_id = event.data.get("id")
        if event.data.get("end") is not None and isinstance(part_id, str):
            self._relayed_parts.discard(part_id)
            self._ended_parts[part_id] = None
            if len(self._ended_parts) > _ENDED_PARTS:
                del self._ended_parts[next(iter(self._ended_parts))]

    def _belongs(self, event_session: str, wanted: str) -> bool:
        session: str | None = event_session
        while session is not None:
            if session == wanted:
                return True
            session = self._parent_of.get(session)
        return False

    def _fan_out(self, event: Event) -> None:
        dropped: list[int] = []
        for subscriber in self._subscribers.values():
            if subscriber.session_id is not None and not self._belongs(
                event.session_id, subscriber.session_id
            ):
                continue
            try:
                subscriber.send.send_nowait(event)
            except trio.WouldBlock:
                dropped.append(subscriber.id)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                dropped.append(subscriber.id)
        for subscriber_id in dropped:
            subscriber = self._subscribers.pop(subscriber_id)
            log.warning("subscriber cut off", subscription=subscriber_id)
            subscriber.send.close()


@asynccontextmanager
async def subscription(
    feed: trio.MemorySendChannel[FeedMessage], session_id: str | None, buffer: int = 4096
) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
    """Hear the events published from now on, of one session tree or of all sessions."""
    subscribed: Subscription = await ask(
        feed, lambda reply: Subscribe(session_id, reply, buffer)
    )
    try:
        yield subscribed.events
    finally:
        with contextlib.suppress(
            trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError
        ):
            feed.send_nowait(Unsubscribe(subscribed.id))


def overflow_event(session_id: str, last_seq: int | None) -> Event:
    """The event a reader shows when its subscription was cut off for falling behind."""
    return Event(
        None,
        time.time(),
        "feed.overflow",
        session_id,
        {"message": "subscriber fell behind; resume from the ledger", "last_seq": last_seq},
    )

"""The provider contract: a request in, an async stream of provider-neutral events out."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from harness.messages.provider import ProviderRequest, StreamEvent
from harness.providers.errors import RetryableError


class Provider(Protocol):
    """Turns a request into a stream of events.

    ``stream`` is an async context manager so that the HTTP response (or whatever the
    provider holds) is closed on every exit, a cancel included: a bare ``async for``
    over a response can leak the connection. Errors are raised as
    ``harness.providers.errors.ProviderError`` subclasses; a stream that ends without a
    ``Finish`` event raises ``TruncatedStreamError``.
    """

    name: str

    def stream(
        self, request: ProviderRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]: ...

    async def aclose(self) -> None: ...


class EventStream:
    """A provider's events as one object that the layers above it can use without a wrapper.

    The retries must read the first event before the caller does (a failure before it is
    retried), and the shared limiter must hear of every retryable failure; as async
    generators wrapped around the provider's own, each added a frame to every event and
    a generator (with Trio's hooks) to every request (issue 14). Given a stream of this
    class they ``unread`` the first event and ``watch`` for failures instead, and hand on
    the stream itself; any other async iterator of events is wrapped, as before.

    Subclasses fill ``_ready`` in ``_more``: at least one event, or ``StopAsyncIteration``
    when the reply is over (and again on every call after).
    """

    __slots__ = ("_ready", "_watchers")

    def __init__(self) -> None:
        self._ready: collections.deque[StreamEvent] = collections.deque()
        self._watchers: list[Callable[[RetryableError], None]] = []

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StreamEvent:
        ready = self._ready
        if not ready:
            try:
                await self._more()
            except RetryableError as error:
                for watcher in self._watchers:
                    watcher(error)
                raise
        return ready.popleft()

    async def _more(self) -> None:
        raise NotImplementedError

    def unread(self, event: StreamEvent) -> None:
        """Put ``event`` back: it is the next one handed out."""
        self._ready.appendleft(event)

    def watch(self, watcher: Callable[[RetryableError], None]) -> None:
        """Call ``watcher`` with each ``RetryableError`` the stream raises, before it does."""
        self._watchers.append(watcher)

    async def aclose(self) -> None:
        """Stop: nothing more is handed out (what the stream holds is closed by its owner)."""
        self._ready.clear()

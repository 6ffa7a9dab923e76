"""Retries of a provider stream, ours and in Trio (DESIGN §6).

Only a failure before the first event is retried: once output has reached the caller it
may already be in the ledger, and replaying the request would duplicate it, so a later
error is the caller's to handle. The wait is a bare ``trio.sleep``, so a cancel ends it
at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType

import trio

from harness.messages.provider import ProviderRequest, StreamEvent
from harness.providers.base import EventStream, Provider
from harness.providers.errors import RetryableError

# A server's Retry-After is honoured above our own cap, but not without bound.
MAX_RETRY_AFTER = 15 * 60.0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5  # attempts in all, the first included
    initial_delay: float = 2.0
    factor: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.2  # +/- this fraction of the backoff

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        *,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        backoff = min(self.initial_delay * self.factor ** (attempt - 1), self.max_delay)
        backoff *= 1.0 + self.jitter * (2.0 * rand() - 1.0)
        backoff = max(0.0, backoff)
        if retry_after is not None:
            return max(backoff, min(max(0.0, retry_after), MAX_RETRY_AFTER))
        return backoff


@dataclass(frozen=True)
class RetryNotice:
    attempt: int  # the attempt that failed (1-based)
    delay: float  # seconds until the next attempt
    at: float  # time.time() of the next attempt
    error: str
    # A wait shared by every session of the provider (harness/providers/limiter.py): a
    # hold after another session's 429, or the provider's pace, not this session's retry.
    shared: bool = False


OnRetry = Callable[[RetryNotice], Awaitable[None]]


def stream_with_retries(
    provider: Provider,
    request: ProviderRequest,
    *,
    policy: RetryPolicy,
    on_retry: OnRetry,
) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
    """``provider.stream(request)``, retrying a ``RetryableError`` raised before any event."""
    return _RetryingStream(provider, request, policy, on_retry)


class _Replay:
    """The first event, then the rest of ``events``: for a stream that cannot ``unread``."""

    __slots__ = ("_events", "_first")

    def __init__(self, first: StreamEvent, events: AsyncIterator[StreamEvent]) -> None:
        self._first: StreamEvent | None = first
        self._events = events

    def __aiter__(self) -> _Replay:
        return self

    async def __anext__(self) -> StreamEvent:
        first = self._first
        if first is not None:
            self._first = None
            return first
        return await self._events.__anext__()


class _RetryingStream:
    """The provider's stream, entered again after a failure before its first event.

    A class rather than an ``@asynccontextmanager`` over an ``AsyncExitStack``: those are
    two generators and a stack per request, and the replay of the first event a generator
    frame on every event (issue 14). The provider's stream is entered and left here as
    ``async with`` would: a failed attempt's stream is left before the wait (its
    connection closed), a retryable failure of its first event leaving it cleanly.
    """

    __slots__ = ("_on_retry", "_policy", "_provider", "_request", "_stream")

    def __init__(
        self, provider: Provider, request: ProviderRequest, policy: RetryPolicy, on_retry: OnRetry
    ) -> None:
        self._provider = provider
        self._request = request
        self._policy = policy
        self._on_retry = on_retry
        self._stream: AbstractAsyncContextManager[AsyncIterator[StreamEvent]] | None = None

    async def __aenter__(self) -> AsyncIterator[StreamEvent]:
        policy = self._policy
        attempt = 1
        while True:
            try:
                return await self._attempt()
            except RetryableError as failure:
                # The failed attempt's connection is closed by now: nothing is held while
                # waiting.
                if attempt >= max(1, policy.max_attempts):
                    raise
                delay = policy.delay(attempt, failure.retry_after)
                await self._on_retry(
                    RetryNotice(
                        attempt=attempt, delay=delay, at=time.time() + delay, error=str(failure)
                    )
                )
            await trio.sleep(delay)
            attempt += 1

    async def _attempt(self) -> AsyncIterator[StreamEvent]:
        """One attempt: the stream entered and its first event read (the stream counts as
        started only once one arrives, and errors before that are the retryable kind)."""
        stream = self._provider.stream(self._request)
        events = await stream.__aenter__()
        try:
            first = await anext(events, None)
        except RetryableError:
            await stream.__aexit__(None, None, None)
            raise
        except BaseException as error:
            await stream.__aexit__(type(error), error, error.__traceback__)
            raise
        self._stream = stream
        if first is None:
            return events  # over already: it says so again
        if isinstance(events, EventStream):
            events.unread(first)
            return events
        return _Replay(first, events)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        stream = self._stream
        if stream is None:
            return None
        self._stream = None
        return await stream.__aexit__(kind, error, traceback)

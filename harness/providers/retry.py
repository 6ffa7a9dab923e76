"""Retries of a provider stream, ours and in Trio (DESIGN §6).

Only a failure before the first event is retried: once output has reached the caller it
may already be in the ledger, and replaying the request would duplicate it, so a later
error is the caller's to handle. The wait is a bare ``trio.sleep``, so a cancel ends it
at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass

import trio

from harness.messages.provider import ProviderRequest, StreamEvent
from harness.providers.base import Provider
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
    return _stream_with_retries(provider, request, policy, on_retry)


async def _replay(
    first: StreamEvent | None, events: AsyncIterator[StreamEvent]
) -> AsyncGenerator[StreamEvent, None]:
    if first is None:
        return
    yield first
    async for event in events:
        yield event


@asynccontextmanager
async def _stream_with_retries(
    provider: Provider, request: ProviderRequest, policy: RetryPolicy, on_retry: OnRetry
) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    attempt = 1
    while True:
        failure: RetryableError | None = None
        async with AsyncExitStack() as stack:
            try:
                events = await stack.enter_async_context(provider.stream(request))
                # Pull the first event here: the stream counts as started only once one
                # arrives, and errors before that are the retryable kind.
                first = await anext(events, None)
            except RetryableError as exc:
                failure = exc
            if failure is None:
                replay = _replay(first, events)
                async with aclosing(replay):
                    yield replay
                return
        # The failed attempt's connection is closed by now: nothing is held while waiting.
        if attempt >= max(1, policy.max_attempts):
            raise failure
        delay = policy.delay(attempt, failure.retry_after)
        await on_retry(
            RetryNotice(attempt=attempt, delay=delay, at=time.time() + delay, error=str(failure))
        )
        await trio.sleep(delay)
        attempt += 1

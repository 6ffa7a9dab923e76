"""One limiter per provider, shared by every session of a harness (DESIGN §11).

Each session holds its own provider client, so without this each one would find a rate
limit on its own: twenty sessions, twenty 429s, twenty backoffs. A ``ProviderLimiter``
is shared by the clients of one provider (its name and server) in one harness:

- ``max_concurrent``: requests in flight at once; a request holds its slot from the
  moment it is sent until its stream is closed.
- ``requests_per_minute``: requests start at least ``60 / N`` seconds apart, so no
  minute ever holds more than N (a server counting a sliding or a fixed window alike).
- A failure carrying ``Retry-After`` (a 429, a 503) seen by one session holds back every
  session of the provider until then, instead of each one sending its request into it.

A session that waits for a hold (or more than a second for its turn) hears of it through
``on_wait``, and shows status ``retry`` with the shared reason. Every wait is a Trio
sleep: a cancel ends it at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import trio

from harness.messages.provider import ProviderRequest, StreamEvent
from harness.providers.base import EventStream, Provider
from harness.providers.errors import RetryableError
from harness.providers.retry import MAX_RETRY_AFTER, RetryNotice

# A wait for a free minute-slot shorter than this is not worth a status change.
NOTICE_SECONDS = 1.0

OnWait = Callable[[RetryNotice], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """``max_concurrent`` and ``requests_per_minute`` of one provider; None: no limit."""

    max_concurrent: int | None = None
    requests_per_minute: float | None = None

    def __post_init__(self) -> None:
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if self.requests_per_minute is not None and not self.requests_per_minute > 0:
            raise ValueError("requests_per_minute must be more than 0")


class ProviderLimiter:
    """The shared state of one provider: its slots, its pace and its hold."""

    def __init__(self, name: str, limits: ProviderLimits | None = None) -> None:
        self.name = name
        self.limits = limits or ProviderLimits()
        count = self.limits.max_concurrent
        self._slots = trio.CapacityLimiter(count) if count is not None else None
        rpm = self.limits.requests_per_minute
        self._interval = 60.0 / rpm if rpm else 0.0
        # Admission is one queue: waiters start in the order they came (trio.Lock is fair).
        self._admission = trio.Lock()
        self._next_start = 0.0  # trio clock: when the next request may start (the pace)
        self.hold_until = 0.0  # trio clock: no request before this (a server's Retry-After)
        self.hold_reason = ""
        self.in_flight = 0

    def hold(self, seconds: float, reason: str) -> None:
        """No request of this provider starts for ``seconds`` (a hold never shortens)."""
        until = trio.current_time() + min(max(0.0, seconds), MAX_RETRY_AFTER)
        if until > self.hold_until:
            self.hold_until = until
            self.hold_reason = reason

    @asynccontextmanager
    async def slot(self, on_wait: OnWait | None = None) -> AsyncIterator[None]:
        """Wait for a slot, the pace and any hold; the request is in flight inside."""
        token = await self.enter(on_wait)
        try:
            yield
        finally:
            self.leave(token)

    async def enter(self, on_wait: OnWait | None = None) -> object:
        """Wait for a slot, the pace and any hold: the request is in flight until ``leave``
        is given the token this returns (``slot`` as two calls, for a class's enter and
        exit)."""
        # A hold is waited out visibly before queueing for a slot: a session behind the
        # slots' holders shows the shared reason too, not just "busy".
        await self._admit(on_wait, pace=False)
        # Borrowed by a token, not by the task: one task may hold two requests (a title
        # asked while a step streams), which a task-owned slot would refuse.
        token = object()
        slots = self._slots
        if slots is not None:
            await slots.acquire_on_behalf_of(token)
        try:
            if slots is not None or self._interval:
                async with self._admission:
                    await self._admit(on_wait)
            # Else there is nothing to queue for: no slot was waited for, so the hold
            # checked above still stands, and the lock would only cost every request a
            # trip through the scheduler.
        except BaseException:
            if slots is not None:
                slots.release_on_behalf_of(token)
            raise
        self.in_flight += 1
        return token

    def leave(self, token: object) -> None:
        """The request that ``enter`` gave ``token`` is over."""
        self.in_flight -= 1
        if self._slots is not None:
            self._slots.release_on_behalf_of(token)

    async def _admit(self, on_wait: OnWait | None, *, pace: bool = True) -> None:
        """Sleep out the hold and (``pace``) the pace; then take the next start time."""
        while True:
            now = trio.current_time()
            held = self.hold_until - now
            paced = self._next_start - now if pace else 0.0
            if held <= 0 and paced <= 0:
                if pace:
                    self._next_start = now + self._interval
                return
            wait = max(held, paced)
            if on_wait is not None and (held > 0 or wait >= NOTICE_SECONDS):
                reason = (
                    f"{self.name}: every session waits: {self.hold_reason}"
                    if held > 0
                    else f"{self.name}: requests_per_minute = {self.limits.requests_per_minute:g}"
                )
                at = time.time() + wait
                await on_wait(RetryNotice(0, wait, at, reason, shared=True))
            await trio.sleep(wait)


class ProviderLimiters:
    """The limiters of one harness, one per provider name and server, made on first use."""

    def __init__(self, limits: Mapping[str, ProviderLimits] | None = None) -> None:
        self._limits = dict(limits or {})
        self._limiters: dict[tuple[str, str], ProviderLimiter] = {}

    def of(self, name: str, base_url: str | None) -> ProviderLimiter:
        key = (name, (base_url or "").rstrip("/"))
        limiter = self._limiters.get(key)
        if limiter is None:
            label = f"{name} ({key[1]})" if key[1] else name
            limiter = self._limiters[key] = ProviderLimiter(label, self._limits.get(name))
        return limiter


class LimitedProvider:
    """A session's provider client, whose every request goes through a shared limiter."""

    def __init__(self, inner: Provider, limiter: ProviderLimiter, on_wait: OnWait) -> None:
        self.inner = inner
        self.name = inner.name
        self._limiter = limiter
        self._on_wait = on_wait

    def __getattr__(self, name: str) -> Any:
        # What a session asks of its client beyond the protocol (``forget_requests``).
        return getattr(self.inner, name)

    def stream(
        self, request: ProviderRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        return _LimitedStream(self, request)

    def _note(self, error: RetryableError) -> None:
        if error.retry_after is not None:
            self._limiter.hold(error.retry_after, str(error))

    async def aclose(self) -> None:
        await self.inner.aclose()


class _LimitedStream:
    """One request of a ``LimitedProvider``: the limiter's slot around the inner stream.

    A class rather than ``@asynccontextmanager`` generators (the slot's and the stream's)
    and a generator around the events that notes a retryable failure: with an
    ``EventStream`` the failure is heard through ``watch``, and the events are handed on
    as they are (issue 14). A failure the inner stream raises on entering or leaving is
    noted here, as one the caller's block lets through.
    """

    __slots__ = ("_inner", "_provider", "_request", "_token")

    def __init__(self, provider: LimitedProvider, request: ProviderRequest) -> None:
        self._provider = provider
        self._request = request
        self._inner: AbstractAsyncContextManager[AsyncIterator[StreamEvent]] | None = None
        self._token: object = None

    async def __aenter__(self) -> AsyncIterator[StreamEvent]:
        provider = self._provider
        limiter = provider._limiter
        token = await limiter.enter(provider._on_wait)
        try:
            inner = provider.inner.stream(self._request)
            events = await inner.__aenter__()
        except BaseException as error:
            if isinstance(error, RetryableError):
                provider._note(error)
            limiter.leave(token)
            raise
        self._inner = inner
        self._token = token
        if isinstance(events, EventStream):
            events.watch(provider._note)
            return events
        return _Watched(events, provider._note)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        inner = self._inner
        if inner is None:
            return None
        self._inner = None
        provider = self._provider
        try:
            suppressed = await inner.__aexit__(kind, error, traceback)
            if not suppressed and isinstance(error, RetryableError):
                provider._note(error)
        except RetryableError as raised:
            provider._note(raised)
            raise
        finally:
            provider._limiter.leave(self._token)
        return suppressed


class _Watched:
    """``events``, with each ``RetryableError`` they raise noted: for a stream that is not an
    ``EventStream``."""

    __slots__ = ("_events", "_note")

    def __init__(
        self, events: AsyncIterator[StreamEvent], note: Callable[[RetryableError], None]
    ) -> None:
        self._events = events
        self._note = note

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> StreamEvent:
        try:
            return await self._events.__anext__()
        except RetryableError as error:
            self._note(error)
            raise

"""stream_with_retries: backoff, Retry-After, give-up, and cancellation during the wait."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from wire_server import Reply, chunk, wire_server

from harness.messages.provider import (
    Finish,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    UserTurn,
)
from harness.providers.errors import (
    AuthError,
    ProviderError,
    RetryableError,
    TruncatedStreamError,
)
from harness.providers.mistral import MistralProvider
from harness.providers.retry import RetryNotice, RetryPolicy, stream_with_retries

FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, factor=2.0, max_delay=0.05, jitter=0.0)
REQUEST = ProviderRequest("m", ("sys",), (UserTurn("hi"),), ())


class Notices:
    def __init__(self) -> None:
        self.seen: list[RetryNotice] = []

    async def __call__(self, notice: RetryNotice) -> None:
        self.seen.append(notice)


async def consume(provider: Any, policy: RetryPolicy, notices: Notices) -> list[StreamEvent]:
    async with stream_with_retries(provider, REQUEST, policy=policy, on_retry=notices) as events:
        return [event async for event in events]


def ok() -> Reply:
    return Reply(events=[chunk("hello"), chunk(None, finish="stop")])


async def test_429_with_retry_after_is_honoured_then_succeeds() -> None:
    notices = Notices()
    async with wire_server(
        Reply(status=429, headers=[("Retry-After", "0.05")], body={"message": "rate limited"}),
        ok(),
    ) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        start = trio.current_time()
        events = await consume(provider, FAST, notices)
        elapsed = trio.current_time() - start
        await provider.aclose()
    assert events[0] == TextDelta("hello")
    assert isinstance(events[-1], Finish)
    assert len(server.requests) == 2
    (notice,) = notices.seen
    assert notice.attempt == 1
    assert notice.delay == pytest.approx(0.05)  # max(backoff 0.01, retry_after 0.05)
    assert notice.at == pytest.approx(time.time() + 0.05 - elapsed, abs=0.5)
    assert "rate limited" in notice.error
    assert elapsed >= 0.05


async def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    notices = Notices()
    replies = [Reply(status=500, body={"message": f"boom {i}"}) for i in range(3)]
    async with wire_server(*replies) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        with pytest.raises(RetryableError, match="boom 2"):
            await consume(provider, FAST, notices)
        await provider.aclose()
    assert len(server.requests) == 3
    assert [n.attempt for n in notices.seen] == [1, 2]
    assert [n.delay for n in notices.seen] == pytest.approx([0.01, 0.02])


async def test_non_retryable_errors_are_not_retried() -> None:
    notices = Notices()
    async with wire_server(Reply(status=401, body="no"), ok()) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        with pytest.raises(AuthError):
            await consume(provider, FAST, notices)
        await provider.aclose()
    assert len(server.requests) == 1
    assert notices.seen == []


async def test_truncation_before_output_is_retried_after_output_is_not() -> None:
    notices = Notices()
    async with wire_server(Reply(events=[]), ok()) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        events = await consume(provider, FAST, notices)
        await provider.aclose()
    assert events[0] == TextDelta("hello")
    assert len(notices.seen) == 1

    notices = Notices()
    async with wire_server(Reply(events=[chunk("par")]), ok()) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        seen: list[StreamEvent] = []
        with pytest.raises(TruncatedStreamError):
            async with stream_with_retries(
                provider, REQUEST, policy=FAST, on_retry=notices
            ) as events_iter:
                async for event in events_iter:
                    seen.append(event)
        await provider.aclose()
    assert seen == [TextDelta("par")]
    assert len(server.requests) == 1
    assert notices.seen == []


async def test_cancel_during_the_wait_returns_at_once() -> None:
    notices = Notices()
    policy = RetryPolicy(max_attempts=5, initial_delay=30.0, jitter=0.0)
    async with wire_server(
        Reply(status=503, headers=[("Retry-After", "60")], body="down"), ok()
    ) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        with trio.move_on_after(0.1) as scope:
            await consume(provider, policy, notices)
        await provider.aclose()
    assert scope.cancelled_caught
    assert len(server.requests) == 1
    (notice,) = notices.seen
    assert notice.delay == 60.0
    # Measured from the notice: the wait began at most 0.1 s before the cancel.
    assert time.time() < notice.at - 59.0


class FakeProvider:
    """Fails with the scripted errors first, then streams the given events."""

    name = "fake"

    def __init__(self, errors: list[ProviderError], events: list[StreamEvent]) -> None:
        self.errors = errors
        self.events = events
        self.calls = 0
        self.open = 0

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        self.calls += 1
        self.open += 1
        try:
            error = self.errors.pop(0) if self.errors else None
            yield self._events(error)
        finally:
            self.open -= 1

    async def _events(self, error: ProviderError | None) -> AsyncGenerator[StreamEvent, None]:
        if error is not None:
            raise error
        for event in self.events:
            yield event

    async def aclose(self) -> None:
        pass


async def test_fake_provider_connections_are_closed_before_waiting() -> None:
    provider = FakeProvider(
        [RetryableError("a"), TruncatedStreamError("b")], [TextDelta("x"), Finish("stop")]
    )
    opened_during_wait: list[int] = []

    async def on_retry(notice: RetryNotice) -> None:
        opened_during_wait.append(provider.open)

    async with stream_with_retries(provider, REQUEST, policy=FAST, on_retry=on_retry) as events:
        got = [e async for e in events]
    assert got == [TextDelta("x"), Finish("stop")]
    assert provider.calls == 3
    assert opened_during_wait == [0, 0]
    assert provider.open == 0


async def test_single_attempt_policy_raises_at_once() -> None:
    provider = FakeProvider([RetryableError("only")], [])
    notices = Notices()
    with pytest.raises(RetryableError, match="only"):
        await consume(provider, RetryPolicy(max_attempts=1), notices)
    assert notices.seen == []


def test_delay_backoff_cap_jitter_and_retry_after() -> None:
    policy = RetryPolicy()
    assert [policy.delay(n, rand=lambda: 0.5) for n in range(1, 7)] == [
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]
    assert policy.delay(1, rand=lambda: 0.0) == pytest.approx(1.6)
    assert policy.delay(1, rand=lambda: 1.0) == pytest.approx(2.4)
    assert policy.delay(1, 120.0, rand=lambda: 0.5) == 120.0
    assert policy.delay(3, 1.0, rand=lambda: 0.5) == 8.0
    assert policy.delay(1, 86400.0, rand=lambda: 0.5) == 900.0

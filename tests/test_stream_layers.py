"""The layers between a step and the wire: the retries, the shared limiter, the provider's
stream. Issue 14: they hand the provider's events on without a generator of their own,
and still do what their generators did (the first event read ahead, a retryable failure
heard by the limiter, an error after the events that came before it)."""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from wire_server import Reply, chunk, wire_server

import harness
from harness.messages.model import Tokens
from harness.messages.provider import (
    Finish,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
    UserTurn,
)
from harness.providers.base import EventStream
from harness.providers.errors import ProviderError, RetryableError
from harness.providers.limiter import LimitedProvider, ProviderLimiter
from harness.providers.mistral import MistralProvider
from harness.providers.openai import OpenAIProvider
from harness.providers.retry import RetryNotice, RetryPolicy, stream_with_retries

REQUEST = ProviderRequest("m", ("sys",), (UserTurn("hi"),), ())
ONCE = RetryPolicy(max_attempts=1)
HARNESS = str(Path(harness.__file__).parent)


async def _no_wait(notice: RetryNotice) -> None:
    pass


def tool_call_reply() -> Reply:
    call = {"id": "abcdefghi", "function": {"name": "read", "arguments": "{}"}, "index": 0}
    return Reply(events=[chunk(""), chunk(tool_calls=[call], finish="tool_calls")])


@contextmanager
def harness_async_generators() -> Iterator[list[str]]:
    """The names of the async generators of harness's own code started meanwhile."""
    hooks = sys.get_asyncgen_hooks()
    started: list[str] = []

    def firstiter(agen: Any) -> None:
        if agen.ag_code.co_filename.startswith(HARNESS):
            started.append(agen.ag_code.co_qualname)
        if hooks.firstiter is not None:
            hooks.firstiter(agen)

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=hooks.finalizer)
    try:
        yield started
    finally:
        sys.set_asyncgen_hooks(*hooks)


@pytest.mark.parametrize("kind", ["mistral", "openai"])
async def test_a_request_through_the_retries_and_the_limiter_starts_no_async_generator(
    kind: str,
) -> None:
    async with wire_server(tool_call_reply(), tool_call_reply(), keep_alive=True) as server:
        inner = (
            MistralProvider("m", api_key="k", base_url=server.url)
            if kind == "mistral"
            else OpenAIProvider("m", base_url=server.url)
        )
        provider = LimitedProvider(inner, ProviderLimiter(kind), _no_wait)
        got: list[list[StreamEvent]] = []
        try:
            for _ in range(2):  # the first one imports what a reply needs
                with harness_async_generators() as started:
                    async with stream_with_retries(
                        provider, REQUEST, policy=ONCE, on_retry=_no_wait
                    ) as events:
                        got.append([event async for event in events])
        finally:
            await provider.aclose()
    assert started == []
    assert [type(event) for event in got[1]] == [ToolCallEvent, Finish]
    assert got[1][0] == ToolCallEvent("abcdefghi", "read", "{}")


class _FailingEvents(EventStream):
    """A stream whose first event is a rate limit with a Retry-After."""

    async def _more(self) -> None:
        raise RetryableError("slow down", retry_after=30.0)


async def _failing_generator() -> AsyncGenerator[StreamEvent, None]:
    raise RetryableError("slow down", retry_after=30.0)
    yield TextDelta("never")  # pragma: no cover - makes this a generator


class _FailingProvider:
    name = "fake"

    def __init__(self, events: str) -> None:
        self._events = events

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        yield _FailingEvents() if self._events == "class" else _failing_generator()

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("events", ["class", "generator"])
async def test_a_rate_limit_on_the_first_event_holds_every_session(events: str) -> None:
    """The retries read the first event ahead, and a failure there is theirs to handle:
    the limiter still hears of its Retry-After, whatever the provider's stream is."""
    limiter = ProviderLimiter("fake")
    provider = LimitedProvider(_FailingProvider(events), limiter, _no_wait)
    with pytest.raises(RetryableError):
        async with stream_with_retries(provider, REQUEST, policy=ONCE, on_retry=_no_wait):
            pass  # pragma: no cover - the first event fails
    assert limiter.hold_until >= trio.current_time() + 29.0
    assert limiter.in_flight == 0


async def test_an_error_after_events_of_its_own_chunk_comes_after_them() -> None:
    bad = chunk("before", tool_calls=["not a call"])  # type: ignore[list-item]
    async with wire_server(Reply(events=[bad, chunk(finish="stop")])) as server:
        provider = OpenAIProvider("m", base_url=server.url)
        got: list[StreamEvent] = []
        try:
            async with provider.stream(REQUEST) as events:
                with pytest.raises(ProviderError, match="malformed tool call"):
                    async for event in events:
                        got.append(event)
                assert [event async for event in events] == []  # over after its error
        finally:
            await provider.aclose()
    assert got == [TextDelta("before")]


async def test_the_first_event_is_handed_out_once_and_in_order() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    reply = Reply(events=[chunk("a"), chunk("b"), chunk(finish="stop", usage=usage)])
    async with wire_server(reply) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        try:
            async with stream_with_retries(
                provider, REQUEST, policy=ONCE, on_retry=_no_wait
            ) as events:
                got = [event async for event in events]
        finally:
            await provider.aclose()
    assert got[:2] == [TextDelta("a"), TextDelta("b")]
    assert got[2:] == [Finish("stop", Tokens(input=3, output=2), got[2].cost)]  # type: ignore[union-attr]

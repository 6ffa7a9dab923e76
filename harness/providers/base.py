"""The provider contract: a request in, an async stream of provider-neutral events out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from harness.messages.provider import ProviderRequest, StreamEvent


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

"""A provider's POSTs after its first go straight to its transport's ``post`` (issue 14):
no ``httpx.Request`` or ``httpx.Response`` is made, and what httpx did for them is still
done: the same bytes on the wire, cookies taken and sent back, a content coding undone.

The server here answers with bytes written out in full, and keeps each request's bytes
as they arrived.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
import trio
from test_http11 import read_head

from harness.messages.provider import ProviderRequest, StreamEvent, TextDelta, UserTurn
from harness.providers.mistral import MistralProvider
from harness.providers.openai import OpenAIProvider

REQUEST = ProviderRequest("m", ("sys",), (UserTurn("hi"),), ())


def sse_body(text: str) -> bytes:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}],
    }
    return b"data: %s\n\ndata: [DONE]\n\n" % json.dumps(chunk).encode()


def reply(text: str, *headers: bytes, gzipped: bool = False) -> bytes:
    body = sse_body(text)
    if gzipped:
        body = gzip.compress(body)
        headers = (*headers, b"content-encoding: gzip")
    head = [b"HTTP/1.1 200 OK", b"content-type: text/event-stream", *headers]
    head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class RawServer:
    """Answers each request with the next of ``replies``, over one kept-alive connection."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.url = ""

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while self.replies:
            request = await read_head(stream, buffer)
            if not request:
                return
            self.requests.append(request)
            await stream.send_all(self.replies.pop(0))


@asynccontextmanager
async def raw_server(*replies: bytes) -> AsyncIterator[RawServer]:
    server = RawServer(list(replies))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        server.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


def provider(kind: str, base_url: str) -> MistralProvider | OpenAIProvider:
    if kind == "mistral":
        return MistralProvider("m", api_key="k", base_url=base_url)
    return OpenAIProvider("m", base_url=base_url)


async def texts(model: MistralProvider | OpenAIProvider) -> list[StreamEvent]:
    async with model.stream(REQUEST) as events:
        return [event async for event in events if isinstance(event, TextDelta)]


@contextmanager
def httpx_models_made() -> Iterator[list[str]]:
    made: list[str] = []
    originals = {cls: cls.__init__ for cls in (httpx.Request, httpx.Response)}

    def counting(cls: type, original: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            made.append(cls.__name__)
            original(self, *args, **kwargs)

        return init

    for cls, original in originals.items():
        cls.__init__ = counting(cls, original)  # type: ignore[method-assign]
    try:
        yield made
    finally:
        for cls, original in originals.items():
            cls.__init__ = original  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", ["mistral", "openai"])
async def test_after_the_first_post_no_httpx_request_or_response_is_made(kind: str) -> None:
    async with raw_server(*(reply(f"r{n}") for n in range(3))) as server:
        model = provider(kind, server.url)
        try:
            assert await texts(model) == [TextDelta("r0")]
            with httpx_models_made() as made:
                assert await texts(model) == [TextDelta("r1")]
                assert await texts(model) == [TextDelta("r2")]
        finally:
            await model.aclose()
    assert made == []


@pytest.mark.parametrize("kind", ["mistral", "openai"])
async def test_the_same_request_is_the_same_bytes_however_it_is_sent(kind: str) -> None:
    """The first POST goes through ``handle_async_request``, the later ones through
    ``post``: one request, one set of bytes."""
    async with raw_server(*(reply(f"r{n}") for n in range(3))) as server:
        model = provider(kind, server.url)
        try:
            for _ in range(3):
                await texts(model)
        finally:
            await model.aclose()
    first, *later = server.requests
    assert later == [first, first]
    assert first.startswith(b"POST /") and b"\r\nHost: 127.0.0.1:" in first


async def test_a_cookie_set_on_a_later_step_is_sent_back() -> None:
    replies = (reply("a"), reply("b", b"set-cookie: lb=node-7; Path=/"), reply("c"))
    async with raw_server(*replies) as server:
        model = provider("mistral", server.url)
        try:
            got = [await texts(model) for _ in range(3)]
        finally:
            await model.aclose()
    assert got == [[TextDelta("a")], [TextDelta("b")], [TextDelta("c")]]
    cookies = [b"\r\ncookie: lb=node-7\r\n" in r.lower() for r in server.requests]
    assert cookies == [False, False, True]


async def test_a_content_coding_on_a_later_step_is_undone() -> None:
    async with raw_server(reply("plain"), reply("squeezed", gzipped=True)) as server:
        model = provider("openai", server.url)
        try:
            assert await texts(model) == [TextDelta("plain")]
            assert await texts(model) == [TextDelta("squeezed")]
        finally:
            await model.aclose()

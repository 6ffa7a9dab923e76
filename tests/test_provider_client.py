"""The providers' own httpx client (``sse.new_client``): proxies from the environment, and
what ``AsyncClient.send`` does that a POST sent straight to the transport must still do.

The servers are real (``wire_server``, on 127.0.0.1); a proxy is played by a wire server
too: a plain-HTTP proxy is sent the request itself, its target in absolute form.
"""

from __future__ import annotations

import logging

import httpx
import pytest
import trio
from wire_server import Reply, chunk, wire_server

from harness.messages.provider import ProviderRequest, TextDelta, UserTurn
from harness.providers.errors import RetryableError
from harness.providers.mistral import MistralProvider
from harness.providers.openai import OpenAIProvider
from harness.providers.sse import PostTemplate, new_client

REQUEST = ProviderRequest("m", ("system",), (UserTurn("hi"),), ())
PROXY_VARIABLES = (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
)  # fmt: skip
# RFC 2606: never resolves, so only a proxy can carry a request there.
UNREACHABLE = "http://model.invalid"


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def provider(kind: str, base_url: str) -> MistralProvider | OpenAIProvider:
    if kind == "mistral":
        return MistralProvider("m", api_key="k", base_url=base_url)
    return OpenAIProvider("m", base_url=base_url)


async def texts_of(model: MistralProvider | OpenAIProvider) -> list[TextDelta]:
    async with model.stream(REQUEST) as stream:
        return [e async for e in stream if isinstance(e, TextDelta)]


@pytest.mark.parametrize("kind", ["mistral", "openai"])
async def test_an_environment_proxy_carries_the_requests(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY is honoured as httpx honours it: the server's name never resolves here."""
    replies = [Reply(events=[chunk("via proxy", finish="stop")]) for _ in range(2)]
    async with wire_server(*replies, keep_alive=True) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        model = provider(kind, UNREACHABLE)
        try:
            for _ in range(2):
                assert await texts_of(model) == [TextDelta("via proxy")]
        finally:
            await model.aclose()
    paths = [r.path for r in proxy.requests]
    assert len(paths) == 2
    assert all(p.startswith(f"{UNREACHABLE}/") and p.endswith("/chat/completions") for p in paths)
    assert proxy.requests[0].headers["host"] == "model.invalid"


async def test_an_https_proxy_is_asked_for_a_tunnel(monkeypatch: pytest.MonkeyPatch) -> None:
    """An https server is reached through the proxy's CONNECT (TLS inside it, verified)."""
    async with wire_server(Reply(status=403, body="no tunnels here")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        model = provider("mistral", "https://model.invalid")
        try:
            with pytest.raises(RetryableError):
                await texts_of(model)
        finally:
            await model.aclose()
    assert [(r.method, r.path) for r in proxy.requests] == [("CONNECT", "model.invalid:443")]


async def test_no_proxy_sends_a_host_straight_to_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        wire_server() as proxy,
        wire_server(Reply(events=[chunk("direct", finish="stop")])) as server,
    ):
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        model = provider("mistral", server.url)
        try:
            assert await texts_of(model) == [TextDelta("direct")]
        finally:
            await model.aclose()
    assert proxy.requests == []
    assert len(server.requests) == 1


async def test_a_cookie_the_server_sets_is_sent_back() -> None:
    """The client's cookie jar still sees every response, however the POST is sent."""
    first = Reply(events=[chunk("a", finish="stop")], headers=[("set-cookie", "lb=node-7")])
    second = Reply(events=[chunk("b", finish="stop")])
    async with wire_server(first, second, keep_alive=True) as server:
        model = provider("mistral", server.url)
        try:
            assert await texts_of(model) == [TextDelta("a")]
            assert await texts_of(model) == [TextDelta("b")]
        finally:
            await model.aclose()
    assert "cookie" not in server.requests[0].headers
    assert server.requests[1].headers["cookie"] == "lb=node-7"


async def test_a_callers_client_keeps_its_hooks_and_auth() -> None:
    """A client given to the provider is sent through as given: its event hooks and auth."""
    seen: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        seen.append(request.url.path)

    replies = [Reply(events=[chunk("x", finish="stop")]) for _ in range(2)]
    async with (
        wire_server(*replies) as server,
        httpx.AsyncClient(
            event_hooks={"request": [on_request]}, auth=httpx.BasicAuth("u", "p")
        ) as http,
    ):
        model = MistralProvider("m", api_key="k", base_url=server.url, http_client=http)
        for _ in range(2):
            assert await texts_of(model) == [TextDelta("x")]
    assert seen == ["/v1/chat/completions"] * 2
    # The client's auth runs last, as httpx's does: it writes Authorization itself.
    assert server.requests[1].headers["authorization"] == "Basic dTpw"


async def test_a_closed_client_refuses_to_send() -> None:
    async with wire_server(Reply(events=[chunk("x", finish="stop")])) as server:
        client = new_client(server.url, httpx.Timeout(5.0), None)
        post = PostTemplate(client, f"{server.url}/x", {})
        response = await post.send(b"{}")
        await response.aclose()
        await client.aclose()
        with pytest.raises(RuntimeError):
            await post.send(b"{}")


async def test_the_clients_timeouts_still_apply() -> None:
    """A read timeout of the client's reaches the transport (the request's extensions)."""
    async with wire_server(Reply(events=[chunk("x", finish="stop")], delay=5.0)) as server:
        client = new_client(server.url, httpx.Timeout(5.0, read=0.2), None)
        post = PostTemplate(client, f"{server.url}/x", {})
        started = trio.current_time()
        with pytest.raises(httpx.ReadTimeout):
            await post.send(b"{}")
        assert trio.current_time() - started < 2.0
        await client.aclose()


async def test_the_providers_own_client_posts_straight_to_its_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``AsyncClient.send`` layers for the providers' own client (issue 14's wire step)."""

    async def refuse(*args: object, **kwargs: object) -> httpx.Response:
        raise AssertionError("AsyncClient.send was called")

    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)
    replies = [Reply(events=[chunk("x", finish="stop")]) for _ in range(3)]
    async with wire_server(*replies, keep_alive=True) as server:
        for kind in ("mistral", "openai"):
            model = provider(kind, server.url)
            try:
                assert await texts_of(model) == [TextDelta("x")]
            finally:
                await model.aclose()


async def test_httpx_request_line_is_still_logged_at_debug() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("httpx")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        replies = [Reply(events=[chunk("x", finish="stop")]) for _ in range(2)]
        async with wire_server(*replies, keep_alive=True) as server:
            model = provider("mistral", server.url)
            try:
                for _ in range(2):  # the first request built by the client, then direct
                    await texts_of(model)
            finally:
                await model.aclose()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [r.getMessage() for r in records]
    # As AsyncClient.send writes it (the test server sends no reason phrase).
    assert lines == [f'HTTP Request: POST {server.url}/v1/chat/completions "HTTP/1.1 200 "'] * 2

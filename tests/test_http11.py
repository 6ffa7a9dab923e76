"""The providers' HTTP/1.1 transport (``harness.providers.http11``), against real sockets.

Each server here is a real Trio TCP (or TLS) server in the test's own loop, answering
with raw bytes, so the transport's keep-alive, timeouts, TLS and error mapping are seen
exactly as a provider sees them: through ``httpx.AsyncClient.send``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import h11
import httpx
import pytest
import trio
from h11._connection import _body_framing, _keep_alive
from h11._readers import ChunkedReader, maybe_read_from_SEND_RESPONSE_server
from h11._receivebuffer import ReceiveBuffer
from wire_server import Reply, chunk, wire_server

from harness.messages.provider import ProviderRequest, TextDelta, UserTurn
from harness.providers.errors import RetryableError
from harness.providers.http11 import H11Transport, read_plain_head, take_whole_chunks
from harness.providers.mistral import MistralProvider
from harness.providers.openai import OpenAIProvider

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


async def read_head(stream: trio.abc.Stream, buffer: bytearray) -> bytes:
    """One request's head (and its body when Content-Length says so); b"" at EOF."""
    while b"\r\n\r\n" not in buffer:
        more = await stream.receive_some(65536)
        if not more:
            return b""
        buffer += more
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        more = await stream.receive_some(65536)
        if not more:
            return b""
        rest += more
    buffer[:] = rest[length:]
    return head + b"\r\n\r\n" + rest[:length]


@contextlib.asynccontextmanager
async def serve(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """Serve ``handler`` on 127.0.0.1; yields the root URL and the accepted connections."""
    accepted: list[int] = []

    async def counted(stream: trio.abc.Stream) -> None:
        accepted.append(1)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await handler(stream)

    async with trio.open_nursery() as nursery:
        if tls is None:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, counted, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            root = f"http://127.0.0.1:{port}"
        else:
            listeners = await nursery.start(
                functools.partial(trio.serve_ssl_over_tcp, counted, 0, tls, host="127.0.0.1")
            )
            port = listeners[0].transport_listener.socket.getsockname()[1]
            root = f"https://127.0.0.1:{port}"
        yield root, accepted
        nursery.cancel_scope.cancel()


async def answer_each(stream: trio.abc.Stream) -> None:
    """Keep-alive: answer every request on the connection with ``OK``."""
    buffer = bytearray()
    while await read_head(stream, buffer):
        await stream.send_all(OK)


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def client(transport: H11Transport, **timeouts: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0, **timeouts))


async def test_requests_share_one_kept_alive_connection() -> None:
    async with serve(answer_each) as (root, accepted), client(H11Transport()) as http:
        for _ in range(3):
            reply = await http.get(f"{root}/x")
            assert (reply.status_code, reply.text, reply.http_version) == (
                200,
                "ok",
                "HTTP/1.1",
            )
    assert len(accepted) == 1


async def test_tls_is_verified_and_kept_alive(tmp_path: Path) -> None:
    server_context, cert = self_signed(tmp_path)
    async with serve(answer_each, tls=server_context) as (root, accepted):
        trusted = ssl.create_default_context(cafile=cert)
        async with client(H11Transport(trusted)) as http:
            assert (await http.get(f"{root}/a")).text == "ok"
            assert (await http.get(f"{root}/b")).text == "ok"
        assert len(accepted) == 1
        # The default context (certifi's CAs) does not vouch for this certificate.
        async with client(H11Transport()) as http:
            with pytest.raises(httpx.ConnectError) as refused:
                await http.get(f"{root}/c")
    causes: list[BaseException] = []
    error: BaseException | None = refused.value
    while error is not None:
        causes.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(c, ssl.SSLCertVerificationError) for c in causes), causes


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def answer_then_leave(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await stream.send_all(OK)  # no "connection: close", and yet it goes
        await stream.aclose()

    async with serve(answer_then_leave) as (root, accepted), client(H11Transport()) as http:
        assert (await http.get(f"{root}/1")).text == "ok"
        await trio.sleep(0.05)  # the server's FIN arrives
        assert (await http.get(f"{root}/2")).text == "ok"
    assert len(accepted) == 2


async def test_an_expired_idle_connection_is_replaced() -> None:
    short = client(H11Transport(keepalive_expiry=0.0))
    async with serve(answer_each) as (root, accepted), short as http:
        assert (await http.get(f"{root}/1")).text == "ok"
        await trio.sleep(0.01)
        assert (await http.get(f"{root}/2")).text == "ok"
    assert len(accepted) == 2


async def test_connection_close_is_honoured() -> None:
    closing = wire_server(Reply(body="a"), Reply(body="b"))
    async with closing as server, client(H11Transport()) as http:
        assert (await http.post(f"{server.url}/x", content=b"1")).text == "a"
        assert (await http.post(f"{server.url}/x", content=b"2")).text == "b"
    assert server.connections == 2
    assert [r.body for r in server.requests] == [b"1", b"2"]


async def test_a_streamed_request_body_arrives_whole() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one ", b"", b"two ", b"three"):
            yield part

    kept = wire_server(Reply(body="got"), keep_alive=True)
    async with kept as server, client(H11Transport()) as http:
        reply = await http.post(f"{server.url}/x", content=parts())
    assert reply.text == "got"
    assert server.requests[0].body == b"one two three"
    assert server.requests[0].headers["transfer-encoding"] == "chunked"


async def test_read_timeout_while_waiting_for_the_response() -> None:
    async def silent(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await trio.sleep_forever()

    async with serve(silent) as (root, _), client(H11Transport(), read=0.2) as http:
        start = trio.current_time()
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{root}/")
        assert trio.current_time() - start < 2


async def test_read_timeout_in_the_middle_of_a_body() -> None:
    async def stalls(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await trio.sleep_forever()

    async with serve(stalls) as (root, accepted), client(H11Transport(), read=0.2) as http:
        async with http.stream("GET", f"{root}/") as reply:
            got = []
            with pytest.raises(httpx.ReadTimeout):
                async for piece in reply.aiter_raw():
                    got.append(piece)
        assert got == [b"abc"]
        # The broken connection was dropped, not pooled: the next request opens one.
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{root}/")
    assert len(accepted) == 2


async def test_a_shorter_read_timeout_after_longer_ones_still_ends_its_wait() -> None:
    """The run's deadline task sleeps until the soonest deadline it was told of: a wait
    with a sooner one (a shorter timeout) moves it, and ends on time."""

    async def first_answers(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        await read_head(stream, buffer)
        await trio.sleep(0.05)  # a wait, with the long timeout
        await stream.send_all(OK)
        await read_head(stream, buffer)
        await trio.sleep_forever()

    async with serve(first_answers) as (root, accepted):
        transport = H11Transport()
        async with client(transport, read=30.0) as slow, client(transport, read=0.2) as quick:
            assert (await slow.get(f"{root}/1")).text == "ok"
            start = trio.current_time()
            with pytest.raises(httpx.ReadTimeout):
                await quick.get(f"{root}/2")
            assert trio.current_time() - start < 2
    assert len(accepted) == 1  # the second request was on the kept connection


async def test_a_read_timeout_ends_only_the_wait_whose_deadline_passed() -> None:
    """Two waits at once, with different timeouts: the short one times out, the other
    reads its answer when it comes, and the transport goes on."""

    async def slow_then_silent(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        request = await read_head(stream, buffer)
        if b" /silent " in request:
            await trio.sleep_forever()
        await trio.sleep(0.5)
        await stream.send_all(OK)
        while await read_head(stream, buffer):
            await stream.send_all(OK)

    results: dict[str, object] = {}
    async with serve(slow_then_silent) as (root, _):
        transport = H11Transport()
        async with client(transport, read=0.2) as quick, client(transport, read=5.0) as patient:

            async def get(http: httpx.AsyncClient, path: str) -> None:
                try:
                    results[path] = (await http.get(f"{root}{path}")).text
                except httpx.ReadTimeout as error:
                    results[path] = error

            async with trio.open_nursery() as nursery:
                nursery.start_soon(get, quick, "/silent")
                nursery.start_soon(get, patient, "/slow")
            assert (await patient.get(f"{root}/again")).text == "ok"
    assert isinstance(results["/silent"], httpx.ReadTimeout)
    assert results["/slow"] == "ok"


async def test_a_read_timeout_over_tls(tmp_path: Path) -> None:
    server_context, cert = self_signed(tmp_path)

    async def silent(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await trio.sleep_forever()

    transport = H11Transport(ssl.create_default_context(cafile=str(cert)))
    served = serve(silent, tls=server_context)
    async with served as (root, accepted), client(transport, read=0.3) as http:
        for _ in range(2):  # the timed-out connection is dropped; a new one times out too
            start = trio.current_time()
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"{root}/")
            assert trio.current_time() - start < 2
    assert len(accepted) == 2


def test_reads_end_on_time_in_run_after_run() -> None:
    """The deadline task is the run's own: another run starts its own."""

    async def one_run() -> None:
        async def silent(stream: trio.abc.Stream) -> None:
            await read_head(stream, bytearray())
            await trio.sleep_forever()

        async with serve(silent) as (root, _), client(H11Transport(), read=0.1) as http:
            with trio.fail_after(5), pytest.raises(httpx.ReadTimeout):
                await http.get(f"{root}/")

    for _ in range(2):
        trio.run(one_run)


async def test_a_tls_handshake_that_never_comes_is_a_connect_timeout() -> None:
    async def mute(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    async with serve(mute) as (root, _):
        url = root.replace("http://", "https://")
        async with client(H11Transport(), connect=0.2) as http:
            with pytest.raises(httpx.ConnectTimeout):
                await http.get(url)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"", "Server disconnected without sending a response"),
        (b"SPDY/9 nonsense\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", None),
    ],
    ids=["closed", "garbage", "cut-body"],
)
async def test_a_broken_response_is_a_protocol_error(reply: bytes, message: str | None) -> None:
    async def broken(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        if reply:
            await stream.send_all(reply)
        await stream.aclose()

    async with serve(broken) as (root, _), client(H11Transport()) as http:
        with pytest.raises(httpx.RemoteProtocolError, match=message):
            await (await http.get(f"{root}/")).aread()


async def test_a_body_cut_inside_a_chunk_header_is_a_protocol_error() -> None:
    """The server leaves after half a chunk-size line: an error, not a wait for more."""

    async def cut(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n1")
        await stream.aclose()

    async with serve(cut) as (root, _), client(H11Transport(), read=5.0) as http:
        cut_off = pytest.raises(httpx.RemoteProtocolError, match="closed connection")
        with trio.fail_after(2), cut_off:
            await (await http.get(f"{root}/")).aread()


async def test_bytes_after_a_response_are_not_taken_for_the_next_one() -> None:
    """A server that sends more than its response: the connection is not used again."""

    async def chatty(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        answers = [OK + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale", FRESH]
        while answers and await read_head(stream, buffer):
            await stream.send_all(answers.pop(0))

    async with serve(chatty) as (root, accepted), client(H11Transport()) as http:
        assert (await http.get(f"{root}/1")).text == "ok"
        assert (await http.get(f"{root}/2")).text == "ok"  # a new connection's first answer
    assert len(accepted) == 2


FRESH = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh"


@pytest.mark.parametrize(
    ("reply", "text", "reused"),
    [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
         b"2;ext=1\r\nok\r\n0\r\nx-trailer: 1\r\n\r\n", "ok", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
         "ok", True),
        (b"HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n", "", True),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", "ok", False),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", "until the end", False),
        (b"HTTP/1.1 200 OK\n\n", "", False),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\ntransfer-encoding: chunked\r\n\r\n"
         b"2\r\nok\r\n0\r\n\r\n", "ok", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nConnection: keep-alive, Close\r\n\r\nok",
         "ok", False),
    ],
    ids=["chunked-trailers", "continue-first", "no-content", "close", "http10", "bare-lf",
         "length-and-chunked", "length-list-and-close"],
)
async def test_response_framings(reply: bytes, text: str, reused: bool) -> None:
    """h11's framing rules, read without its Connection: the body, and whether it is kept."""

    async def answer(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        closes = not reused
        while await read_head(stream, buffer):
            await stream.send_all(reply)
            if closes:
                await stream.aclose()
                return

    async with serve(answer) as (root, accepted), client(H11Transport()) as http:
        for path in ("/1", "/2"):
            assert (await http.get(f"{root}{path}")).text == text
    assert len(accepted) == (1 if reused else 2)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx",
         "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "chunk header"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokXX", "chunk footer"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "header"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"y" * (110 * 1024), "too long"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "(?i)switch"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1,2\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nx: a\x00b\r\ncontent-length: 0\r\n\r\n", "header"),
        (b"HTTP/1.1 200 OK\r\n folded: 1\r\n\r\n", "continuation"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
         "Transfer-Encoding"),
    ],
    ids=["te-gzip", "two-lengths", "chunk-size", "chunk-end", "header", "huge-head", "101",
         "length-list", "negative-length", "nul-in-value", "fold-first", "two-chunked"],
)
async def test_malformed_responses_fail_as_h11_says(reply: bytes, message: str) -> None:
    async def broken(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await stream.send_all(reply)
        await trio.sleep(5)  # still open: the error is the reply's, not the end's

    async with serve(broken) as (root, _), client(H11Transport()) as http:
        with trio.fail_after(2), pytest.raises(httpx.RemoteProtocolError, match=message):
            await (await http.get(f"{root}/")).aread()


async def test_a_request_body_other_than_declared_is_a_local_error() -> None:
    async with serve(answer_each) as (root, _), client(H11Transport()) as http:
        for length in (b"3", b"30"):
            request = http.build_request("POST", f"{root}/", content=b"x" * 10)
            request.headers["content-length"] = length.decode()
            with pytest.raises(httpx.LocalProtocolError, match="Content-Length"):
                await http.send(request)


async def test_connect_and_upgrade_requests_are_refused() -> None:
    async with serve(answer_each) as (root, _), client(H11Transport()) as http:
        with pytest.raises(httpx.LocalProtocolError, match="not supported"):
            await http.get(f"{root}/", headers={"upgrade": "websocket", "connection": "upgrade"})


async def test_connection_refused_is_a_connect_error() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    async with client(H11Transport()) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")


async def test_an_unsupported_scheme_is_refused_before_connecting() -> None:
    async with client(H11Transport()) as http:
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.get("ftp://127.0.0.1/x")


@pytest.mark.parametrize("kind", ["mistral", "openai"])
async def test_a_provider_turn_over_tls_through_the_transport(tmp_path: Path, kind: str) -> None:
    """Both providers stream over TLS with their own transport, one connection for two replies."""
    server_context, cert = self_signed(tmp_path)
    events = [chunk("hello"), chunk(" world", finish="stop")]
    body = b"".join(
        b"data: %s\n\n" % httpx.Response(200, json=e).content for e in events
    ) + b"data: [DONE]\n\n"
    sse = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)

    async def sse_each(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while await read_head(stream, buffer):
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + sse
            )

    async with serve(sse_each, tls=server_context) as (root, accepted):
        transport = H11Transport(ssl.create_default_context(cafile=cert))
        provider: MistralProvider | OpenAIProvider
        if kind == "mistral":
            provider = MistralProvider("m", api_key="k", base_url=root, transport=transport)
        else:
            provider = OpenAIProvider("m", base_url=root, transport=transport)
        request = ProviderRequest("m", ("system",), (UserTurn("hi"),), ())
        for _ in range(2):
            async with provider.stream(request) as stream:
                texts = [e for e in [x async for x in stream] if isinstance(e, TextDelta)]
            assert texts == [TextDelta("hello"), TextDelta(" world")]
        await provider.aclose()
    assert len(accepted) == 1


@pytest.mark.parametrize("tail_delay", [0.0, 0.1], ids=["with-the-reply", "later"])
async def test_the_body_after_done_keeps_the_connection(tail_delay: float) -> None:
    """The end of the chunked body, with ``[DONE]`` or after it: read, and the socket kept."""
    events = [chunk("hi", finish="stop")]
    body = b"".join(b"data: %s\n\n" % httpx.Response(200, json=e).content for e in events)
    body += b"data: [DONE]\n\n"
    reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (
        len(body), body
    )

    async def sse_each(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while await read_head(stream, buffer):
            if tail_delay:
                await stream.send_all(reply)
                await trio.sleep(tail_delay)
                await stream.send_all(b"0\r\n\r\n")
            else:
                await stream.send_all(reply + b"0\r\n\r\n")

    async with serve(sse_each) as (root, accepted):
        provider = MistralProvider("m", api_key="k", base_url=root)
        request = ProviderRequest("m", ("system",), (UserTurn("hi"),), ())
        for _ in range(3):
            async with provider.stream(request) as stream:
                texts = [e for e in [x async for x in stream] if isinstance(e, TextDelta)]
            assert texts == [TextDelta("hi")]
        await provider.aclose()
    assert len(accepted) == 1


async def test_a_provider_read_timeout_is_retryable() -> None:
    async with wire_server(Reply(events=[chunk("a")], hang=True)) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        provider._client.timeout = httpx.Timeout(5.0, read=0.2)
        request = ProviderRequest("m", (), (UserTurn("hi"),), ())
        with pytest.raises(RetryableError, match="connection failed"):
            async with provider.stream(request) as stream:
                async for _ in stream:
                    pass
        await provider.aclose()


def test_checked_headers_are_what_h11_makes_and_bad_ones_still_fail() -> None:
    from harness.providers.http11 import _CheckedHeaders

    checked = _CheckedHeaders()
    base = [(b"Host", b"example.org"), (b"Authorization", b"Bearer k")]
    for length in (b"10", b"12345", b"7"):
        raw = [*base, (b"Content-Length", length)]
        mine = h11.Request(method=b"POST", target=b"/v1", headers=checked.headers(raw))
        theirs = h11.Request(method=b"POST", target=b"/v1", headers=raw)
        assert mine.headers.raw_items() == theirs.headers.raw_items()
        assert list(mine.headers) == list(theirs.headers)
    # A length that is not digits, or a new header set with a bad value, goes to h11.
    with pytest.raises(h11.LocalProtocolError):
        h11.Request(
            method=b"POST",
            target=b"/",
            headers=checked.headers([*base, (b"Content-Length", b"1, 2")]),
        )
    with pytest.raises(h11.LocalProtocolError):
        bad = [(b"Host", b"example.org"), (b"X", b"a\nb"), (b"Content-Length", b"3")]
        h11.Request(method=b"POST", target=b"/", headers=checked.headers(bad))


def test_kept_request_heads_are_the_bytes_h11_writes() -> None:
    from harness.providers.http11 import _RequestHeads

    heads = _RequestHeads()
    sets = [
        [(b"Host", b"example.org"), (b"Authorization", b"Bearer k")],
        [(b"Accept", b"*/*"), (b"Host", b"h:1"), (b"X-Other", b"content-length: 5")],
        [(b"Host", b"h"), (b"Connection", b"close")],
    ]
    for base in sets:
        for at in range(len(base) + 1):
            for length in (b"0", b"10", b"12345", b"007"):
                raw = [*base[:at], (b"Content-Length", length), *base[at:]]
                kept = heads.head("POST", b"/v1?q=1", raw)
                assert kept is not None
                before, value, after, keep_alive = kept
                connection = h11.Connection(h11.CLIENT)
                theirs = connection.send(h11.Request(method="POST", target=b"/v1?q=1", headers=raw))
                assert before + value + after == theirs
                assert keep_alive == (b"close" not in dict(base).get(b"Connection", b""))
    host = [(b"Host", b"h")]
    # Not kept: no length, two, one that is not digits, a chunked body.
    assert heads.head("POST", b"/", host) is None
    assert heads.head("POST", b"/", [*host, (b"Content-Length", b"1")] * 2) is None
    assert heads.head("POST", b"/", [*host, (b"Content-Length", b"1, 1")]) is None
    chunked = [*host, (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")]
    assert heads.head("POST", b"/", chunked) is None
    # What h11 refuses is refused, each time (a bad head is never kept as good).
    for _ in range(2):
        with pytest.raises(h11.LocalProtocolError):
            heads.head("POST", b"/", [(b"X", b"a\nb"), *host, (b"Content-Length", b"3")])
        with pytest.raises(h11.LocalProtocolError):
            heads.head("POST", b"/", [(b"Content-Length", b"3")])  # no Host
        with pytest.raises(h11.LocalProtocolError):
            heads.head("PO ST", b"/", [*host, (b"Content-Length", b"3")])


async def test_bodies_of_every_size_arrive_whole_on_one_connection() -> None:
    bodies = [b"", b"x" * 10, b"y" * 40_000, b"z" * 300_000, b"w" * 5]
    served = wire_server(*[Reply(body="ok") for _ in bodies], keep_alive=True)
    async with served as server, client(H11Transport()) as http:
        for body in bodies:
            assert (await http.post(f"{server.url}/x", content=body)).text == "ok"
    assert [r.body for r in server.requests] == bodies
    assert [r.headers["content-length"] for r in server.requests] == [
        str(len(b)) for b in bodies
    ]
    assert server.connections == 1


async def test_a_direct_post_of_any_size_is_the_request_its_head_and_body_make() -> None:
    """``post`` sends the head and the body in one ``sendmsg``; a body the socket does not
    take at once (megabytes) is sent on from where it stopped."""
    bodies = [b"x" * 10, b"y" * 40_000, bytes(range(256)) * 40_000, b"w" * 5]
    served = wire_server(*[Reply(body="ok") for _ in bodies], keep_alive=True)
    transport = H11Transport()
    async with served as server, client(transport) as http:
        request = http.build_request("POST", f"{server.url}/x", content=b"-")
        prepared = transport.prepare_post(request)
        assert prepared is not None
        for body in bodies:
            reply = await transport.post(prepared, body)
            assert reply.status_code == 200
            assert b"".join([piece async for piece in reply.stream]) == b"ok"
            await reply.aclose()
    assert [r.body for r in server.requests] == bodies
    assert [r.headers["content-length"] for r in server.requests] == [str(len(b)) for b in bodies]
    assert server.connections == 1


_PLAIN_REQUEST = """
import socket, sys, threading
from harness import install_lean_imports
install_lean_imports()  # as the CLI does
import httpx, trio
from harness.providers.sse import new_client
listener = socket.create_server(("127.0.0.1", 0))
def answer():
    conn, _ = listener.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok")
    conn.close()
threading.Thread(target=answer, daemon=True).start()
async def main():
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    async with new_client(url, httpx.Timeout(5.0), None) as client:
        reply = await client.get(url)
    print(reply.text, "ssl" in sys.modules, "httpcore" in sys.modules)
trio.run(main)
"""


def test_a_plain_http_exchange_loads_neither_tls_nor_httpcore() -> None:
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_REQUEST], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "False", "False"]


async def test_reading_a_fast_body_lets_other_tasks_run() -> None:
    """A body that is always there to read still yields to the scheduler, read by read."""
    piece = b"x" * 65536

    async def flood(stream: trio.abc.Stream) -> None:
        await read_head(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (64 * len(piece)))
        for _ in range(64):
            await stream.send_all(piece)

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    reads = 0
    served = serve(flood)
    async with served as (root, _), client(H11Transport()) as http, trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async with http.stream("GET", f"{root}/") as reply:
            async for _ in reply.aiter_raw():
                reads += 1
        nursery.cancel_scope.cancel()
    assert reads > 1
    assert ticks >= reads // 2  # the ticker ran between the reads


async def test_a_cancelled_caller_sends_nothing() -> None:
    received: list[bytes] = []

    async def record(stream: trio.abc.Stream) -> None:
        head = await read_head(stream, bytearray())
        received.append(head)
        await stream.send_all(OK)

    async with serve(record) as (root, _), client(H11Transport()) as http:
        assert (await http.get(f"{root}/warm")).text == "ok"  # a kept-alive connection
        with trio.CancelScope() as scope:
            scope.cancel()
            await http.get(f"{root}/never")
        assert scope.cancelled_caught
        assert (await http.get(f"{root}/after")).text == "ok"
    assert [h.split(b" ")[1] for h in received] == [b"/warm", b"/after"]


async def test_concurrent_requests_take_a_connection_each_and_both_are_kept() -> None:
    async def slow_each(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while await read_head(stream, buffer):
            await trio.sleep(0.05)  # both requests are in flight at once
            await stream.send_all(OK)

    async with serve(slow_each) as (root, accepted), client(H11Transport()) as http:
        for _ in range(2):
            texts: list[str] = []

            async def get(path: str, texts: list[str] = texts) -> None:
                texts.append((await http.get(f"{root}/{path}")).text)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(get, "a")
                nursery.start_soon(get, "b")
            assert texts == ["ok", "ok"]
    assert len(accepted) == 2  # the second pair reused both


# --- whole chunks read without h11's reader (take_whole_chunks) ---------------------------


def _random_chunked(rng: random.Random) -> bytes:
    """A chunked body, mostly well formed, with what h11 alone must judge mixed in."""
    out = []
    for _ in range(rng.randrange(0, 6)):
        size = rng.choice([1, 2, 15, 16, 255, 300, rng.randrange(1, 400)])
        digits = f"{size:x}" if rng.random() < 0.7 else f"{size:X}"
        if rng.random() < 0.1:
            digits = "0" * rng.randrange(1, 4) + digits
        extra = rng.choice([b""] * 8 + [b";ext=1", b" ", b"\t", b"g", b";"])
        footer = rng.choice([b"\r\n"] * 12 + [b"XX", b"\n", b"\r"])
        out.append(digits.encode() + extra + b"\r\n" + bytes([97 + size % 26]) * size + footer)
    last = rng.choice([b"0\r\n\r\n"] * 5 + [b"0\r\nx-t: 1\r\n\r\n", b"00\r\n\r\n", b"0;e\r\n\r\n"])
    after = rng.choice([b"", b"", b"HTTP/1.1 200 OK\r\n"])
    return b"".join(out) + last + after


def _read_chunked(body: bytes, cuts: list[int], fast: bool) -> tuple[bytes, str, bytes]:
    """Feed ``body`` cut at ``cuts`` to a fresh reader: the data, how it ended, what is left."""
    reader, buffer = ChunkedReader(), ReceiveBuffer()
    data: list[bytes | bytearray] = []
    for start, stop in itertools.pairwise([0, *cuts, len(body)]):
        buffer += body[start:stop]
        try:
            while True:
                if fast and take_whole_chunks(reader, buffer, data):
                    return b"".join(data), "end", bytes(buffer)
                event = reader(buffer)
                if event is None:
                    break
                if type(event) is h11.EndOfMessage:
                    return b"".join(data), "end", bytes(buffer)
                data.append(event.data)
        except h11.ProtocolError as error:
            return b"".join(data), f"{type(error).__name__}: {error}", bytes(buffer)
    return b"".join(data), "more needed", bytes(buffer)


def test_whole_chunks_are_read_as_h11_reads_them() -> None:
    """The same data, the same end or error, the same bytes left, however the body is cut."""
    rng = random.Random(14)
    for _ in range(3000):
        body = _random_chunked(rng)
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randrange(0, 5))))
        assert _read_chunked(body, cuts, fast=True) == _read_chunked(body, cuts, fast=False), (
            body,
            cuts,
        )


async def test_a_stream_of_whole_chunks_is_read_without_h11s_chunk_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payloads = [b"data: %d\n\n" % n for n in range(50)]
    events = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in payloads)
    reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + events + b"0\r\n\r\n"

    async def handler(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while await read_head(stream, buffer):
            await stream.send_all(reply)

    calls: list[int] = []
    original = ChunkedReader.__call__

    def counted(self: ChunkedReader, buffer: ReceiveBuffer) -> object:
        calls.append(1)
        return original(self, buffer)

    monkeypatch.setattr(ChunkedReader, "__call__", counted)
    async with serve(handler) as (root, _), client(H11Transport()) as http:
        response = await http.get(root)
        body = await response.aread()
    assert body == b"".join(payloads)
    assert calls == []


# --- plain response heads read without h11's reader (read_plain_head) ---------------------

# Header values, names: h11's first (10 values, 7 names), then what it refuses.
_HEADER_VALUES = [
    b"text/event-stream", b"", b"  spaced  ", b"a\tb", b"\xff\xfe", b"\x01", b"x" * 300,
    b"v: with a colon", b"\t", b" ", b"a\x00b", b"a\x0bb", b"a\x0cb",
]  # fmt: skip
_FRAMING_VALUES = {
    b"content-length": [b"2", b"0", b"00", b"123", b" 7 ", b"1, 1", b"1,2", b"", b"-1",
                        b"1" * 20, b"1" * 21, b"0x10", b"\xd9\xa3", b"1\t"],
    b"transfer-encoding": [b"chunked", b"Chunked", b" chunked\t", b"gzip", b"gzip, chunked",
                           b"chunked, chunked", b"", b"identity"],
    b"connection": [b"close", b"Close", b"keep-alive", b"keep-alive, close", b" upgrade ,CLOSE",
                    b"closed", b"", b",,close,,"],
}  # fmt: skip
_NAMES = [
    b"Content-Type", b"x-request-id", b"Set-Cookie", b"server", b"X_Y", b"~!#$%&'*+.^`|",
    b"na:me", b"Bad Name", b"", b"n\x00", b" leading", b"\tfold", b"name ", b"\xc3\xa9",
]  # fmt: skip


def _random_case(rng: random.Random, name: bytes) -> bytes:
    return bytes(c ^ 0x20 if 97 <= c <= 122 and rng.random() < 0.3 else c for c in name)


def _random_head(rng: random.Random) -> bytes:
    """A response head (and what follows it): half of them plain but for their framing
    headers, the others with what h11 alone must judge mixed in (other versions and
    statuses, bad bytes, folds, bare LFs or CRs, odd names and values)."""
    odd = rng.random() < 0.5

    def pick(choices: list[bytes], plain: int) -> bytes:
        # Odd heads are mostly plain too: one odd thing in a plain head is what tells.
        return rng.choice(choices if odd and rng.random() < 0.3 else choices[:plain])

    version = pick([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/11"], 1)
    status = pick([b"200", b"201", b"204", b"304", b"404", b"429", b"500", b"999", b"100",
                   b"101", b"199", b"099", b"20", b"2000", b"2x0"], 8)  # fmt: skip
    reason = pick([b" OK", b"", b" ", b"  OK", b" Not Found", b" ok\tfine", b" caf\xc3\xa9",
                   b" \x01", b" \x00", b" a\x0bb", b"OK"], 8)  # fmt: skip
    lines = [version + b" " + status + reason]
    for _ in range(rng.randrange(0, 9)):
        if rng.random() < 0.25:
            name = rng.choice(list(_FRAMING_VALUES))
            value = pick(_FRAMING_VALUES[name], 3)
            name = _random_case(rng, name)
        else:
            name = pick(_NAMES, 7)
            value = pick(_HEADER_VALUES, 10)
        space = rng.choice([b" ", b" ", b"", b"  ", b"\t"])
        lines.append(name + b":" + space + value)
    if odd and rng.random() < 0.1:
        lines.insert(rng.randrange(1, len(lines) + 1), b" folded")
    ends = [pick([b"\r\n"] * 8 + [b"\n", b"\r"], 1) for _ in range(len(lines) + 1)]
    head = b"".join(line + end for line, end in zip(lines, ends[:-1], strict=True)) + ends[-1]
    after = rng.choice([b""] * 3 + [b"2\r\nok\r\n0\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n"])
    whole = head + after
    if rng.random() < 0.1:
        whole = whole[: rng.randrange(0, len(whole))]  # not all received yet
    return whole


def _described(
    event: h11.Response, framing: object, keep_alive: bool, buffer: ReceiveBuffer
) -> tuple[object, ...]:
    items = event.headers._full_items
    return (
        type(event), event.status_code, event.reason, type(event.reason), event.http_version,
        items, [tuple(map(type, item)) for item in items], framing, keep_alive,
        bytes(buffer), buffer._next_line_search, buffer._multiple_lines_search,
    )  # fmt: skip


def _head_by_h11(data: bytes, method: bytes) -> object:
    buffer = ReceiveBuffer()
    buffer += data
    try:
        event = maybe_read_from_SEND_RESPONSE_server(buffer)
    except h11.ProtocolError as error:
        return f"{type(error).__name__}: {error}"
    if type(event) is not h11.Response:
        return repr(event)  # more needed, or an informational response
    return _described(event, _body_framing(method, event), _keep_alive(event), buffer)


def _plain_head(data: bytes, method: bytes) -> object:
    buffer = ReceiveBuffer()
    buffer += data
    read = read_plain_head(buffer, method)
    if read is None:
        assert bytes(buffer) == data  # left as it was, for h11
        return None
    event, kind, args, keep_alive = read
    return _described(event, (kind, args), keep_alive, buffer)


def test_plain_heads_are_read_as_h11_reads_them() -> None:
    """Whatever the head, the plain reader gives h11's event, framing, keep-alive and
    leftover bytes, or leaves it to h11; and it does read the plain ones."""
    rng = random.Random(14)
    taken = responses = 0
    for _ in range(6000):
        data = _random_head(rng)
        method = rng.choice([b"POST"] * 4 + [b"GET", b"HEAD", b"CONNECT"])
        by_h11 = _head_by_h11(data, method)
        responses += type(by_h11) is tuple
        plain = _plain_head(data, method)
        if plain is not None:
            taken += 1
            assert plain == by_h11, (data, method)
    assert taken > 1500 and responses > taken + 200  # both routes well exercised


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2026 00:00:00 GMT\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
        b"Connection: keep-alive\r\nmistral-correlation-id: 0199-aa\r\n"
        b"x-ratelimit-remaining-tokens-minute: 499000\r\nCF-RAY: 8f-CDG\r\n\r\n",
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\nretry-after: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 204\r\ncontent-length: 9\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
    ],
    ids=["mistral-like", "429", "no-headers", "no-reason", "close"],
)
@pytest.mark.parametrize("method", [b"POST", b"HEAD"])
def test_the_heads_servers_send_are_read_plain_and_as_h11_reads_them(
    head: bytes, method: bytes
) -> None:
    plain = _plain_head(head, method)
    assert plain is not None
    assert plain == _head_by_h11(head, method)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1" + b"0" * 20 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx: 1\r\n y\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx: 1\n\r\n",
        b"HTTP/1.1 200 OK\r\nx : 1\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n",
    ],
    ids=["two-lengths", "both-framings", "long-length", "gzip", "fold", "bare-lf", "space-colon",
         "continue", "http10", "unfinished"],
)  # fmt: skip
def test_heads_out_of_the_plain_are_left_to_h11(head: bytes) -> None:
    assert _plain_head(head, b"POST") is None


async def test_a_provider_reply_head_is_read_without_h11s_head_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"

    async def handler(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while await read_head(stream, buffer):
            await stream.send_all(reply)

    def refuse(buffer: ReceiveBuffer) -> object:
        raise AssertionError("h11's head reader was called")

    monkeypatch.setattr(
        "harness.providers.http11.maybe_read_from_SEND_RESPONSE_server", refuse
    )
    async with serve(handler) as (root, accepted), client(H11Transport()) as http:
        for _ in range(3):
            response = await http.get(root)
            assert (response.status_code, response.text) == (200, "ok")
            assert response.headers["content-type"] == "text/plain"
    assert len(accepted) == 1

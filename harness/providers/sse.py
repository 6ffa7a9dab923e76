"""What the chat-completions providers share: SSE reading, HTTP errors, tool-call assembly.

Lines are split on the bytes ourselves rather than with ``response.aiter_lines()``: httpx
splits like ``str.splitlines``, which also breaks on U+2028, U+0085 and friends, and JSON
allows those unescaped inside strings, so a model writing one would corrupt its chunk.
SSE itself only knows CRLF, LF and CR.
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import json
import logging
import re
import time
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx
import trio
from httpx._utils import get_environment_proxies

from harness.messages.provider import Finish, ToolCallEvent
from harness.providers.base import EventStream
from harness.providers.errors import (
    AuthError,
    BadRequestError,
    ContextOverflowError,
    ProviderError,
    RetryableError,
    TruncatedStreamError,
)
from harness.providers.http11 import (
    DirectResponse,
    H11Transport,
    PreparedPost,
    ResponseBody,
    shared_ssl_context,
)

if TYPE_CHECKING:
    import ssl  # the client's context, made only for an https URL

    from harness.messages.model import Tokens
    from harness.messages.provider import ProviderRequest
    from harness.providers.pricing import PriceTable
    from harness.providers.wire import WireCache

DONE = "[DONE]"

_httpx_log = logging.getLogger("httpx")  # the line AsyncClient.send writes per request

_EOL = re.compile(rb"\r\n|\r|\n")


class SSEDecoder:
    """Incremental SSE: ``feed`` the body's bytes, get back the ``data`` payloads they complete.

    Multi-line data is joined with ``\\n``; comments and the other fields (``event``,
    ``id``, ``retry``) are skipped: the chat completion streams we read put everything in
    ``data``. ``[DONE]`` sets ``done`` and nothing after it is returned. A plain class
    rather than a chain of async generators: every generator level costs on each
    suspension of the stream, and a streamed reply suspends once or twice per chunk.
    """

    __slots__ = ("_data", "_pending", "done")

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[str] = []
        self.done = False

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        if not chunk or self.done:
            return out
        data = self._pending + chunk if self._pending else chunk
        if b"\r" in data:
            parts = _EOL.split(data)
            pending = parts.pop()
            # A CR that ends a read may be the first half of a CRLF split across reads.
            if pending == b"" and chunk.endswith(b"\r"):
                pending = parts.pop() + b"\r"
        else:
            # LF alone, as the chat APIs send it: a plain split, not the regex's scan.
            parts = data.split(b"\n")
            pending = parts.pop()
        self._pending = pending
        lines = self._data
        for line in parts:
            # The two lines every event is made of, taken here; any other is _line's.
            if line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                lines.append(value.decode("utf-8", "replace"))
            elif line or not lines:
                if self._line(line, out):
                    break
                lines = self._data
            else:
                payload = "\n".join(lines)
                lines.clear()
                if payload == DONE:
                    self.done = True
                    break
                out.append(payload)
        return out

    def end(self) -> list[str]:
        """The payloads the end of the body completes."""
        out: list[str] = []
        # An unterminated last line is a cut, not data: dropping it turns a connection
        # lost mid-chunk into a truncated stream (retryable) instead of a malformed chunk.
        if not self.done and self._pending.endswith(b"\r"):
            self._line(self._pending[:-1], out)
        self._pending = b""
        if not self.done and self._data:
            payload = "\n".join(self._data)
            self._data = []
            if payload != DONE:
                out.append(payload)
        return out

    def _line(self, raw: bytes, out: list[str]) -> bool:
        """Take one line; True once ``[DONE]`` ends the stream."""
        if not raw:
            if self._data:
                payload = "\n".join(self._data)
                self._data = []
                if payload == DONE:
                    self.done = True
                    return True
                out.append(payload)
            return False
        if raw[0] == 0x3A:  # ":" starts a comment
            return False
        name, sep, value = raw.partition(b":")
        if name != b"data":
            return False
        if sep and value.startswith(b" "):
            value = value[1:]
        self._data.append(value.decode("utf-8", "replace"))
        return False


# How long the rest of a body after ``[DONE]`` may take to arrive before we stop waiting.
DRAIN_SECONDS = 0.5


class SSEData:
    """Each event's ``data`` until ``[DONE]`` (see ``SSEDecoder``), from a body's bytes.

    After ``[DONE]`` the rest of the body (the end of the chunked encoding, already sent
    with it by a well-behaved server) is read: a response closed before its end takes its
    connection with it, so every step would open a new one (a TLS handshake, against a
    real API). A tail already received is read without waiting (``ResponseBody``); a
    server that keeps the body open gets ``DRAIN_SECONDS``, then is left.

    An iterator rather than an async generator: Trio tracks every async generator (a
    hook when it starts, a finalizer, a weak set) and each one adds a frame to every
    step of the stream; a provider reads one of these per request.
    """

    __slots__ = ("_chunks", "_decoder", "_ended", "ready")

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = aiter(chunks)
        self._decoder = SSEDecoder()
        self.ready: collections.deque[str] = collections.deque()  # decoded, not yet taken
        self._ended = False  # the body is read to its end, or left

    def __aiter__(self) -> SSEData:
        return self

    async def __anext__(self) -> str:
        if not self.ready and not await self.more():
            raise StopAsyncIteration
        return self.ready.popleft()

    def take(self) -> str | None:
        """The next payload already decoded, if any (``more`` reads on)."""
        ready = self.ready
        return ready.popleft() if ready else None

    async def more(self) -> bool:
        """Read until a payload is ready; False when none ever will be (the body is over)."""
        ready = self.ready
        decoder = self._decoder
        while not ready:
            if self._ended:
                return False
            if decoder.done:  # every payload before [DONE] is taken: now the tail
                self._ended = True
                await self._drain()
                return False
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._ended = True
                ready.extend(decoder.end())
                continue
            ready.extend(decoder.feed(chunk))
        return True

    async def _drain(self) -> None:
        chunks = self._chunks
        if isinstance(chunks, ResponseBody) and chunks.received_to_the_end():
            return  # the tail came with the reply (the usual case): nothing to wait for
        # The reply is whole: a failure to read its tail only costs the connection.
        with trio.move_on_after(DRAIN_SECONDS), contextlib.suppress(httpx.HTTPError):
            async for _ in chunks:
                pass

    async def aclose(self) -> None:
        """Stop: nothing more is read (the response itself is closed by its owner)."""
        self.stop()

    def stop(self) -> None:
        """``aclose``, for an owner that closes it as it closes the response."""
        self._ended = True
        self.ready.clear()


def aiter_sse_data(chunks: AsyncIterable[bytes]) -> SSEData:
    """The ``data`` payloads of ``chunks`` (``SSEData``)."""
    return SSEData(chunks)


def sse_data(response: httpx.Response) -> SSEData:
    """The ``data`` payloads of a streamed response (``open_stream`` closes it).

    With nothing to decode, the body is read from ``response.stream`` itself, the
    transport's pieces as they come: ``aiter_raw`` would only add a generator, a context
    manager and a re-chunker per piece around the same bytes (its one other effect, the
    request attached to a transport error, is not used by the providers' errors).
    """
    identity = response.headers.get("content-encoding", "identity").strip().lower()
    stream = response.stream
    if identity == "identity" and isinstance(stream, httpx.AsyncByteStream):
        return aiter_sse_data(stream)
    return aiter_sse_data(response.aiter_bytes())


# --- HTTP errors -------------------------------------------------------------------------

# Loose on purpose: servers word this differently and change the wording over time; a
# false "overflow" only costs a compaction, a missed one a failed step.
_OVERFLOW = re.compile(
    r"context[ _-]?(length|window)|maximum context|too large for model|prompt is too long"
    r"|input is too long|too many tokens|exceeds? the (maximum|max|context)"
    r"|reduce the length of the (messages|input|prompt)|token limit",
    re.IGNORECASE,
)

# Retry-After may say anything; we cap how long one hint can park a session.
MAX_RETRY_AFTER = 15 * 60.0


def is_context_overflow(message: str) -> bool:
    return _OVERFLOW.search(message) is not None


def retry_after(headers: httpx.Headers, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def message_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict):
        for key in ("message", "msg", "detail", "error"):
            found = message_of(value.get(key))
            if found:
                return found
        return None
    if isinstance(value, list):
        texts: list[str] = []
        for item in value:
            text = message_of(item)
            if text is None:
                continue
            loc = item.get("loc") if isinstance(item, dict) else None
            if isinstance(loc, list) and loc:
                text = f"{'.'.join(str(p) for p in loc)}: {text}"
            texts.append(text)
        return "; ".join(texts) or None
    return None


def error_message(body: bytes) -> str:
    """The human part of an error body (Mistral, OpenAI, FastAPI shapes), else the text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    found = message_of(parsed) if parsed is not None else None
    message = found if found is not None else text
    return message[:2000] if message else "(empty response body)"


def error_for_body(provider: str, message: str) -> ProviderError:
    """An error reported inside a 200 stream (a ``data: {"error": …}`` event)."""
    if is_context_overflow(message):
        return ContextOverflowError(f"{provider}: context overflow: {message}")
    return ProviderError(f"{provider}: {message}")


def error_for_status(
    provider: str, key_env: str, status: int, headers: httpx.Headers, body: bytes
) -> ProviderError:
    if status in (401, 403):
        return AuthError(f"authentication failed: check {key_env}")
    message = error_message(body)
    if status == 429 or status == 408 or status >= 500:
        return RetryableError(
            f"{provider}: HTTP {status}: {message}", retry_after=retry_after(headers)
        )
    if status == 413 or is_context_overflow(message):
        return ContextOverflowError(f"{provider}: context overflow (HTTP {status}): {message}")
    return BadRequestError(f"{provider} rejected the request (HTTP {status}): {message}")


def error_for_transport(
    provider: str, exc: httpx.TransportError | httpx.InvalidURL
) -> ProviderError:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return BadRequestError(f"{provider}: bad base URL: {detail}")
    return RetryableError(f"{provider}: connection failed: {detail}")


def new_client(
    url: str, timeout: httpx.Timeout, transport: httpx.AsyncBaseTransport | None
) -> httpx.AsyncClient:
    """The provider's HTTP client: httpx's ``AsyncClient`` over ``H11Transport``.

    The transport (``http11.py``) speaks HTTP/1.1 over Trio streams without httpcore's
    pool and per-operation layers (issue 14). A plain ``http://`` server (a local model,
    a test server) gets no TLS context at all: httpx loads the whole CA bundle into one
    when a client is made (about 30 ms and 1.5 MB of start-up), and any context needs
    OpenSSL's ``ssl`` module (2.8 MB, ~10 ms); redirects are not followed, so no https
    URL can come of it. A proxy from the environment still gets httpx's own transport,
    verified as always (``environment_proxies``).
    """
    if url.startswith("http://"):
        if transport is not None:
            return ProviderClient(timeout=timeout, transport=transport)
        return ProviderClient(
            timeout=timeout, transport=H11Transport(), mounts=environment_proxies(True)
        )
    context = shared_ssl_context()
    if transport is not None:
        return ProviderClient(timeout=timeout, transport=transport, verify=context)
    return ProviderClient(
        timeout=timeout,
        transport=H11Transport(context),
        verify=context,
        mounts=environment_proxies(context),
    )


def environment_proxies(
    verify: ssl.SSLContext | bool,
) -> dict[str, httpx.AsyncBaseTransport | None]:
    """The proxies ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` ask for.

    httpx reads them only for a client given no transport of its own, so a client over
    ``H11Transport`` would send every request straight to the server, whatever the
    environment says. These are the mounts httpx itself would make from it (its own
    reading of the environment, NO_PROXY included): each proxy through httpx's transport
    (httpcore), TLS verified with the client's context; None where NO_PROXY exempts a
    host, which then goes through the client's own transport. Empty without proxies.
    """
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {}
    for pattern, proxy in get_environment_proxies().items():
        mounts[pattern] = (
            None
            if proxy is None
            else httpx.AsyncHTTPTransport(proxy=httpx.Proxy(proxy), verify=verify)
        )
    return mounts


class SetCookieOnly(httpx.Cookies):
    """httpx's cookies, that look into a response for cookies only when it sets some.

    ``Cookies.extract_cookies`` wraps every response and its request in ``urllib``
    stand-ins (the request's URL parsed again) for ``http.cookiejar``, which then reads
    only the ``Set-Cookie`` and ``Set-Cookie2`` headers: ~30 µs a request, for the rare
    server that sets a cookie. Without either header the jar has nothing to take.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class ProviderClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` (DESIGN §6) whose cookies are ``SetCookieOnly``."""

    _provider_cookies: SetCookieOnly

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.cookies = options.get("cookies") or {}

    def direct_transport(self, url: httpx.URL) -> H11Transport | None:
        """The ``H11Transport`` that ``send`` would hand a request for ``url`` to, when
        nothing on ``send``'s way to it acts: no auth (the client's, or a URL's user and
        password), no event hooks, no redirects followed. None otherwise, a proxy's
        transport included (see ``PostTemplate.send``).
        """
        if self.auth is not None or self.follow_redirects or url.userinfo:
            return None
        if any(self.event_hooks.values()):
            return None
        transport = self._transport_for_url(url)
        return transport if isinstance(transport, H11Transport) else None

    @property
    def cookies(self) -> httpx.Cookies:
        return self._provider_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._provider_cookies = SetCookieOnly(cookies)


class PostTemplate:
    """A provider's POSTs to its URL, with the parts that never change merged once.

    ``client.stream("POST", url, headers=…)`` parses the URL and merges the client's
    headers, the provider's, the cookies and the timeout into a new request each time,
    though for one provider client only the body ever differs (~0.1 ms a step, measured
    through the loop benchmark's wire path). The first request is built by the client;
    later ones are made from its URL, headers and extensions, which gives the same request
    (headers in the same order). While the client holds a cookie a server set, the client
    builds each request as before, so the cookie is sent back.

    A request with a body is made from the raw headers as well, Content-Length appended
    where httpx puts it, with the body as its stream, then read: the same request without
    httpx merging the headers again (``_prepare``: 24 -> 8 µs; an empty body takes the
    longer way, where httpx puts its Content-Length elsewhere).
    """

    __slots__ = (
        "_direct", "_extensions", "_headers", "_prepared", "_raw", "_url", "client",
        "headers", "url",
    )  # fmt: skip

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = headers
        self._url: httpx.URL | None = None
        self._headers: httpx.Headers | None = None
        self._raw: list[tuple[bytes, bytes]] = []
        self._extensions: dict[str, Any] = {}
        self._direct: H11Transport | None = None
        self._prepared: PreparedPost | None = None

    async def open(self, *body: bytes | bytearray) -> httpx.Response | DirectResponse:
        """POST ``body`` (its parts, in order) as ``send`` does; the response's body is
        still to be read.

        Through the direct transport (see ``send``), once the first request has shown
        what every request is, the POST goes to its ``post``: the same bytes on the wire,
        with no ``httpx.Request`` or ``httpx.Response`` made (issue 14). The reply comes
        back as it is read (``DirectResponse``) unless httpx has something to do with it
        (a cookie to take, a content coding to undo): then as the ``httpx.Response``
        ``send`` gives. A request while the client holds a cookie takes ``send``'s way,
        which sends the cookie back.
        """
        client = self.client
        prepared = self._prepared
        transport = self._direct
        if prepared is None or transport is None or not any(body) or client.is_closed:
            return await self.send(b"".join(body))
        if client.cookies:
            return await self.send(b"".join(body))
        # The parts go to the socket as they are (``H11Transport.post``): the whole
        # history, each step, is not copied once more into one bytes.
        reply = await transport.post(prepared, *body)
        if not reply.plain():
            response = reply.to_httpx()
            response.request = self.request(b"".join(body))
            client.cookies.extract_cookies(response)
            self._log(response.http_version, response.status_code, response.reason_phrase)
            return response
        if _httpx_log.isEnabledFor(logging.INFO):
            head = reply.head
            version = b"HTTP/" + head.http_version
            self._log(
                version.decode("ascii", errors="ignore"),
                head.status_code,
                head.reason.decode("ascii", errors="ignore"),
            )
        return reply

    def _log(self, version: str, status: int, reason: str) -> None:
        """The line ``AsyncClient.send`` writes for each request (at debug only: harness.logs)."""
        if _httpx_log.isEnabledFor(logging.INFO):
            _httpx_log.info(
                'HTTP Request: %s %s "%s %d %s"', "POST", self._url, version, status, reason
            )

    async def send(self, body: bytes) -> httpx.Response:
        """POST ``body``; the response's body is still to be read (``stream=True``).

        ``AsyncClient.send`` wraps the transport's call in its auth and redirect
        generators, event hooks, a timer and a stream wrapper: ~35 µs a request of
        Python that, for the providers' own client, does nothing (no auth, no hooks,
        redirects not followed). There the request goes straight to the transport
        ``send`` would pick for the URL (``direct_transport``, decided with the first
        request), the cookies a response sets are taken and its log line written as
        ``send`` does. Any other client, a closed one included, is sent through ``send``
        itself. The transport raises httpx's own errors and applies the request's
        timeouts (its extensions, the client's ``Timeout``), as under ``send``.
        """
        request = self.request(body)
        client = self.client
        transport = self._direct
        if transport is None or client.is_closed:
            return await client.send(request, stream=True)
        response = await transport.handle_async_request(request)
        response.request = request
        client.cookies.extract_cookies(response)
        if _httpx_log.isEnabledFor(logging.INFO):  # at debug only (harness.logs): as send
            _httpx_log.info(
                'HTTP Request: %s %s "%s %d %s"',
                request.method,
                request.url,
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response

    def request(self, body: bytes) -> httpx.Request:
        client = self.client
        if self._url is None or client.cookies:
            request = client.build_request("POST", self.url, headers=self.headers, content=body)
            if self._url is None:
                # What the request adds by itself from the body and the URL is left out
                # (Content-Length and Host lead the headers), so that it comes out the same.
                fixed = httpx.Headers(request.headers)
                for name in ("Content-Length", "Host"):
                    if name in fixed:
                        del fixed[name]
                self._headers = fixed
                self._extensions = dict(request.extensions)
                self._url = request.url
                # With a body, httpx's order: Host, the merged headers, Content-Length.
                sample = client.build_request("POST", self.url, headers=self.headers, content=b"-")
                raw = sample.headers.raw
                if raw and raw[-1][0].lower() == b"content-length":
                    self._raw = raw[:-1]
                if isinstance(client, ProviderClient):
                    self._direct = client.direct_transport(request.url)
                if self._direct is not None and self._raw:
                    self._prepared = self._direct.prepare_post(sample)
            return request
        if body and self._raw:
            made = httpx.Request(
                "POST",
                self._url,
                headers=[*self._raw, (b"Content-Length", b"%d" % len(body))],
                stream=httpx.ByteStream(body),
                extensions=self._extensions,
            )
            made.read()  # as httpx does for a body in memory: ``content`` is there
            return made
        return httpx.Request(
            "POST", self._url, headers=self._headers, content=body, extensions=self._extensions
        )


class ChatEvents(EventStream):
    """The events of one SSE reply, each payload made into events once those before are taken.

    Subclasses say what a payload makes (``take``, which appends to ``_ready``) and what
    the end of the reply makes (``end``: the last events, or the error of a cut reply).
    A class rather than an async generator per reply (see ``EventStream``): the events
    come out as a generator would yield them, lazily, and an error a payload raises
    after some events of its own comes after those events.
    """

    __slots__ = ("_data", "_failure", "_over", "provider")

    def __init__(self, data: SSEData, provider: str) -> None:
        super().__init__()
        self._data = data
        self.provider = provider
        self._over = False  # the end is made, or the stream failed or was closed
        self._failure: BaseException | None = None  # raised once the events before it are taken

    def take(self, payload: str) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    async def _more(self) -> None:
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
        if self._over:
            raise StopAsyncIteration
        data = self._data
        payloads = data.ready  # taken from here: a call of data.take() per payload less
        ready = self._ready
        try:
            while not ready:
                if payloads:
                    try:
                        self.take(payloads.popleft())
                    except ProviderError as error:
                        if not ready:
                            raise
                        self._over = True
                        self._failure = error
                elif not await data.more():
                    self._over = True
                    self.end()
        except httpx.TransportError as exc:
            self._over = True
            raise error_for_transport(self.provider, exc) from exc
        except BaseException:
            self._over = True
            raise

    def stop(self) -> None:
        self._over = True
        self._failure = None
        self._ready.clear()
        self._data.stop()


class CallingEvents(ChatEvents):
    """A chat reply whose tool calls come in fragments and whose finish and usage come
    in its chunks (Mistral's and OpenAI's): the calls assembled as they come, and made
    events with the finish at the end. Subclasses say what a payload adds (``take``),
    what their usage counts (``tokens``) and the id of a call that came without one
    (``new_call_id``)."""

    __slots__ = ("_calls", "_finish", "_model", "_prices", "_usage")

    def __init__(self, data: SSEData, provider: str, model: str, prices: PriceTable) -> None:
        super().__init__(data, provider)
        self._model = model
        self._prices = prices
        self._calls = ToolCallAssembler()
        self._finish: str | None = None
        self._usage: Any = None

    def tokens(self) -> Tokens:
        raise NotImplementedError

    def new_call_id(self) -> str:
        raise NotImplementedError

    def end(self) -> None:
        finish = self._finish
        if finish is None:
            raise TruncatedStreamError(f"{self.provider}: the stream ended without a finish reason")
        calls = self._calls.calls
        ready = self._ready
        for pending in calls:
            ready.append(
                ToolCallEvent(
                    id=pending.id or self.new_call_id(),
                    name=pending.name,
                    arguments=pending.arguments_text(),
                )
            )
        # Ollama, some llama.cpp builds and Mistral finish a tool-calling turn with "stop".
        if calls and finish == "stop":
            finish = "tool_calls"
        tokens = self.tokens()
        cost = self._prices.cost(self._model, tokens)
        ready.append(Finish(reason=finish, usage=tokens, cost=cost))

    async def aclose(self) -> None:
        self.stop()


class ChatStream:
    """One streamed chat completion, as an async context manager: the POST of the request's
    body, a typed error for any status but 200, then the reply's events.

    Everything is closed on leaving the block by any route, a cancel included (as
    ``client.stream`` does): a body not read to its end takes its connection with it.
    httpx's transport errors, entering, leaving or in the block, become the provider's
    ``RetryableError`` or ``BadRequestError`` (``error_for_transport``). A class rather
    than ``@asynccontextmanager`` generators (the POST's and the provider's) and the
    ``aclosing`` blocks around them: each a generator and a layer per request (issue 14).
    The body is encoded on entering, as the request is sent.
    """

    __slots__ = ("_events", "_events_of", "_key_env", "_post", "_provider", "_request",
                 "_requests", "_response")  # fmt: skip

    def __init__(
        self,
        post: PostTemplate,
        requests: WireCache,
        request: ProviderRequest,
        provider: str,
        key_env: str,
        events_of: Callable[[SSEData, ProviderRequest], ChatEvents],
    ) -> None:
        self._post = post
        self._requests = requests
        self._request = request
        self._provider = provider
        self._key_env = key_env
        self._events_of = events_of
        self._response: httpx.Response | DirectResponse | None = None
        self._events: ChatEvents | None = None

    async def __aenter__(self) -> ChatEvents:
        body = self._requests.parts(self._request)
        try:
            response = await self._post.open(*body)
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise error_for_transport(self._provider, exc) from exc
        try:
            if response.status_code != 200:
                if isinstance(response, DirectResponse):
                    response = response.to_httpx()
                raw = await response.aread()
                raise error_for_status(
                    self._provider, self._key_env, response.status_code, response.headers, raw
                )
            data = (
                SSEData(response.stream)
                if isinstance(response, DirectResponse)
                else sse_data(response)
            )
            events = self._events_of(data, self._request)
        except BaseException as error:
            await self._close(response, error)
            raise
        self._response = response
        self._events = events
        return events

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        response = self._response
        if response is None:
            return
        self._response = None
        if self._events is not None:
            self._events.stop()
            self._events = None
        await self._close(response, error)

    async def _close(
        self, response: httpx.Response | DirectResponse, error: BaseException | None
    ) -> None:
        """Close the response; a transport error (its own, or ``error``) as the provider's."""
        try:
            await response.aclose()
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise error_for_transport(self._provider, exc) from exc
        if isinstance(error, httpx.TransportError | httpx.InvalidURL):
            raise error_for_transport(self._provider, error) from error


# --- tool calls --------------------------------------------------------------------------


@dataclass(slots=True)
class PendingCall:
    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def arguments_text(self) -> str:
        return "".join(self.arguments) or "{}"


class ToolCallAssembler:
    """Collects streamed tool-call fragments into whole calls.

    Fragments are grouped by ``index``. With ``new_id_starts_call`` a fragment that
    carries a new id at an index already in use starts another call: Mistral's calls may
    all come with index 0 (the SDK's default), and merging those would glue two calls'
    arguments together. Where the index is reliable it is left off, because some servers
    repeat a fresh id on every fragment of one call.
    """

    __slots__ = ("_by_index", "calls")

    def __init__(self) -> None:
        self.calls: list[PendingCall] = []
        self._by_index: dict[int, PendingCall] = {}

    def add(
        self,
        index: int,
        call_id: str,
        name: str,
        arguments: str | dict[str, Any],
        *,
        new_id_starts_call: bool = True,
    ) -> None:
        current = self._by_index.get(index)
        if current is None or (
            new_id_starts_call and call_id and current.id and call_id != current.id
        ):
            current = PendingCall(index=index, id=call_id, name=name)
            self.calls.append(current)
            self._by_index[index] = current
        else:
            if call_id and not current.id:
                current.id = call_id
            if name and not current.name:
                current.name = name
        if isinstance(arguments, dict):
            # A whole-object fragment replaces whatever text came before it.
            current.arguments = [json.dumps(arguments, ensure_ascii=False)]
        elif arguments:
            current.arguments.append(arguments)

"""The providers' HTTP/1.1 transport: h11 over Trio streams, under ``httpx.AsyncClient``.

A provider client sends one request at a time to one server, step after step, over a
kept-alive connection. httpx's own transport reaches the socket through httpcore's
connection pool (a lock, a request queue and a shielded cancel scope per request), its
connection, its HTTP/1.1 layer (another lock) and its network backend (a
``@contextmanager`` timeout and an exception map around every read and write): about a
sixth of a wire step's CPU (issue 14's profile). This transport keeps what matters of it
and drops the layers:

- the same wire: h11 (what httpcore uses) makes and parses every message, with the same
  size limit on an incomplete event, so malformed responses fail as they did. Its
  writers, readers and framing rules are called directly, without ``h11.Connection``'s
  state machine (see ``_response``); CONNECT and Upgrade, which only that machine
  handles, are refused, and a connection with bytes left over after a response is not
  used again. The plain cases every reply is made of (a head received whole, a body's
  whole chunks) are read by hand to h11's results (``read_plain_head``,
  ``take_whole_chunks``, each held to h11 by a differential test), the rest by h11;
- the same errors: httpx's exception types (``ConnectError``, ``ConnectTimeout``,
  ``ReadTimeout``, ``WriteTimeout``, ``ReadError``, ``RemoteProtocolError``…), raised
  where httpcore raised their httpcore twins, and the ``connect``/``read``/``write``
  timeouts of each request (``pool`` never applies: a request never waits for a
  connection, it opens one when none is idle);
- the same keep-alive: idle connections per origin, dropped after ``keepalive_expiry``
  seconds or when the server has closed them (the socket is readable while idle);
- TLS: ``https`` through ``trio.SSLStream`` with the client's context (ALPN http/1.1, as
  httpcore sets it), verified; a plain-http client given an https URL makes the default
  verified context then (httpcore's behaviour too).

Plain TCP is driven on the socket itself (``_SocketConnection``: Trio's waits only when
the kernel says wait), TLS through a Trio stream. A read's timeout is kept by one task
of the run for every waiting connection (``_ReadDeadlines``), a connect's or a write's
by a ``trio.CancelScope`` with the timeout as its deadline. A response body is handed to
httpx in the pieces the socket delivers (the events one read completes, joined), not one
piece per chunk of the chunked encoding. Concurrent requests of one client each take a
connection of their own.
"""

from __future__ import annotations

import functools
import math
import re
import select
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
import httpx
import trio

# h11's own parsers and writers, without its Connection's state machine (see _response).
from h11._connection import _body_framing, _keep_alive
from h11._headers import Headers, get_comma_header
from h11._readers import (
    ChunkedReader,
    ContentLengthReader,
    Http10Reader,
    maybe_read_from_SEND_RESPONSE_server,
)
from h11._receivebuffer import ReceiveBuffer
from h11._writers import ChunkedWriter, ContentLengthWriter, write_request

if TYPE_CHECKING:
    import ssl  # imported by httpx when a context is made, and only then

# httpcore's figures: a read's size and the largest incomplete event (a header block).
READ_SIZE = 64 * 1024
MAX_INCOMPLETE_EVENT_SIZE = 100 * 1024
# httpx's default limits for keep-alive.
KEEPALIVE_EXPIRY = 5.0
MAX_IDLE = 20

_Origin = tuple[bytes, str, int]


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every provider client of the process.

    httpx builds a context per client, loading the whole CA bundle into it: about 0.8 MB
    of OpenSSL memory that tracemalloc does not see. A provider per session made that
    ~0.86 MB per session a daemon ever ran (issue 12). The context holds no per-connection
    state, so sharing it changes nothing else; ``trust_env`` as httpx's own default.
    """
    return httpx.create_ssl_context()


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else trio.current_time() + timeout


_BODY_READERS: dict[str, Any] = {
    "chunked": ChunkedReader,
    "content-length": ContentLengthReader,
    "http/1.0": Http10Reader,
}
_BODY_WRITERS: dict[str, Any] = {"chunked": ChunkedWriter, "content-length": ContentLengthWriter}


class _ReadDeadlines:
    """The read timeouts of one run's waiting connections, kept by one task of the run.

    A cancel scope around each wait cost more than the wait's own round of the scheduler
    (~57k instructions: its cancel status, its deadline registered and removed, each
    through a context manager), and a provider's reply waits at least once a step, once
    a chunk from a real model (issue 14). Here a wait puts its deadline in ``waits``; one
    system task sleeps until the soonest deadline it knows of, and wakes a wait whose
    deadline has passed with ``notify_closing``: the wait ends in ``ClosedResourceError``,
    which its reader makes a ``ReadTimeout`` (the connection is then closed, as after any
    timeout). Each wait's deadline is usually later than the one before (the same timeout,
    later), so the task's sleep is moved only when it is not: at the first wait, after an
    idle spell, or for a shorter timeout.
    """

    __slots__ = ("_scope", "_wake_at", "waits")

    def __init__(self) -> None:
        self.waits: dict[_Connection, float] = {}
        self._wake_at = math.inf  # when the task wakes next
        self._scope: trio.CancelScope | None = None  # the task's sleep

    def arm(self, connection: _Connection, deadline: float) -> None:
        connection.timed_out = False
        self.waits[connection] = deadline
        if deadline < self._wake_at:
            self._wake_at = deadline
            if self._scope is not None:
                self._scope.deadline = deadline

    async def watch(self) -> None:
        while True:
            with trio.CancelScope(deadline=self._wake_at) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            soonest = math.inf
            for connection, deadline in list(self.waits.items()):
                if deadline <= now:
                    del self.waits[connection]
                    connection.timed_out = True
                    connection.wake()
                elif deadline < soonest:
                    soonest = deadline
            self._wake_at = soonest


_DEADLINES: trio.lowlevel.RunVar[_ReadDeadlines] = trio.lowlevel.RunVar("harness_read_deadlines")


def _read_deadlines() -> _ReadDeadlines | None:
    """The run's ``_ReadDeadlines``, its task started with the first wait; None when no
    task can be started (the run is ending): the wait then takes a cancel scope."""
    try:
        return _DEADLINES.get()
    except LookupError:
        deadlines = _ReadDeadlines()
        try:
            trio.lowlevel.spawn_system_task(deadlines.watch, name="harness.http11 read deadlines")
        except RuntimeError:
            return None
        _DEADLINES.set(deadlines)
        return deadlines


class _Connection:
    """One connection, what it has received and not yet parsed, and whether it may carry
    another exchange (see the two kinds below)."""

    __slots__ = ("buffer", "expires", "origin", "reusable", "timed_out")

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.buffer = ReceiveBuffer()
        self.reusable = False  # set when an exchange ends cleanly and both sides keep it
        self.expires = 0.0
        self.timed_out = False  # its wait's deadline passed (``_ReadDeadlines``)

    def wake(self) -> None:
        """End the read waiting on the socket (``_ReadDeadlines``) with ``ClosedResourceError``."""
        raise NotImplementedError

    async def write(self, data: bytes, seconds: float | None) -> None:
        raise NotImplementedError

    async def write_parts(self, parts: list[bytes | bytearray], seconds: float | None) -> None:
        """``write`` of the parts joined (a head and a body)."""
        await self.write(b"".join(parts), seconds)

    async def read(self, seconds: float | None) -> bytes:
        raise NotImplementedError

    async def read_when_ready(self, seconds: float | None) -> bytes:
        """``read``, for a read that is sure to wait: a reply's first, after its request."""
        return await self.read(seconds)

    async def close(self) -> None:
        """Close at once (no TLS close_notify wait), whatever the cancellation state."""
        raise NotImplementedError

    def readable(self) -> bool:
        """Whether the socket has something to read (idle: the server closed it)."""
        raise NotImplementedError

    def drop(self) -> None:
        """Close an idle connection, without a TLS goodbye to a peer that left."""
        raise NotImplementedError

    def parse(self, reader: Any) -> Any:
        """The next event an h11 reader finds in the buffer, or None (more is needed).

        h11 raises its ``LocalProtocolError`` for some of what it is sent; its
        Connection re-raises those as remote errors, and so does this.
        """
        try:
            event = reader(self.buffer)
        except h11.ProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        if event is None and len(self.buffer) > MAX_INCOMPLETE_EVENT_SIZE:
            raise httpx.RemoteProtocolError("Receive buffer too long")  # h11's words
        return event


class _StreamConnection(_Connection):
    """Over a Trio stream: TLS (``trio.SSLStream``)."""

    __slots__ = ("socket", "stream")

    def __init__(self, origin: _Origin, stream: trio.abc.Stream, socket: Any) -> None:
        super().__init__(origin)
        self.stream = stream
        self.socket = socket  # the trio socket under the stream: idle checks

    async def write(self, data: bytes, seconds: float | None) -> None:
        with trio.CancelScope(deadline=_deadline(seconds)) as scope:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        if scope.cancelled_caught:
            raise httpx.WriteTimeout("timed out writing the request")

    async def read(self, seconds: float | None) -> bytes:
        if seconds is None or (deadlines := _read_deadlines()) is None:
            return await self._read_in_scope(seconds)
        deadlines.arm(self, trio.current_time() + seconds)
        try:
            data = await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self.timed_out:
                raise httpx.ReadTimeout("timed out reading the response") from None
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        finally:
            deadlines.waits.pop(self, None)
        return data if type(data) is bytes else bytes(data)

    async def _read_in_scope(self, seconds: float | None) -> bytes:
        with trio.CancelScope(deadline=_deadline(seconds)) as scope:
            try:
                data = await self.stream.receive_some(READ_SIZE)
                return data if type(data) is bytes else bytes(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        if scope.cancelled_caught:
            raise httpx.ReadTimeout("timed out reading the response")
        raise AssertionError("unreachable")  # pragma: no cover

    def wake(self) -> None:
        if self.socket.fileno() != -1:
            trio.lowlevel.notify_closing(self.socket)

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)

    def readable(self) -> bool:
        return bool(self.socket.is_readable())

    def drop(self) -> None:
        self.socket.close()


class _SocketConnection(_Connection):
    """Plain TCP on the socket itself, with Trio's I/O waits only when the kernel says wait.

    ``SocketStream`` makes every send and receive two scheduler rounds (a receive that
    had to wait for the server: its wait, then a checkpoint after the data came), and the
    timeout around each needs a cancel scope. Here a send the socket takes at once, the
    usual case, takes no round and no scope; a receive takes the one round of its wait. A
    task whose surroundings were cancelled stops at the next call all the same
    (``checkpoint_if_cancelled``), and any wait is one a cancel ends. A receive that
    finds data at once still yields once, as Trio's own does, so a fast stream cannot
    starve the other tasks.
    """

    __slots__ = ("poll", "sock")

    def __init__(self, origin: _Origin, sock: socket.socket) -> None:
        super().__init__(origin)
        self.sock = sock
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)

    async def write(self, data: bytes, seconds: float | None) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._send(data, seconds)

    async def write_parts(self, parts: list[bytes | bytearray], seconds: float | None) -> None:
        """The parts in one ``sendmsg``, the kernel gathering them: a request's head and
        body are not joined into one more copy of the body (the whole history, each
        step). What the socket does not take at once is joined and sent as ``write``
        sends."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            sent = self.sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        except OSError as exc:  # a reset, a closed socket
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        if sent < sum(map(len, parts)):
            await self._send(b"".join(parts)[sent:], seconds)

    async def _send(self, data: bytes, seconds: float | None) -> None:
        sock = self.sock
        view = memoryview(data)
        deadline: float | None = None
        try:
            while view:
                try:
                    sent = sock.send(view)
                except BlockingIOError:
                    if deadline is None:
                        deadline = _deadline(seconds)
                    with trio.CancelScope(deadline=deadline) as scope:
                        await trio.lowlevel.wait_writable(sock)
                    if scope.cancelled_caught:
                        raise httpx.WriteTimeout("timed out writing the request") from None
                    continue
                view = view[sent:]
        except OSError as exc:  # a reset, a closed socket
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        finally:
            view.release()

    async def read(self, seconds: float | None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        sock = self.sock
        try:
            data = sock.recv(READ_SIZE)
        except BlockingIOError:
            pass
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()  # fair: yield once anyway
            return data
        return await self.read_when_ready(seconds)

    async def read_when_ready(self, seconds: float | None) -> bytes:
        """Wait until the socket is readable, then read: without ``read``'s try first,
        which finds nothing after a request is sent (the server has yet to answer) at the
        cost of an exception (~9k instructions). The wait is the checkpoint."""
        if seconds is None or (deadlines := _read_deadlines()) is None:
            with trio.CancelScope(deadline=_deadline(seconds)):
                return await self._wait_and_read()
            raise httpx.ReadTimeout("timed out reading the response")  # the scope's deadline
        deadlines.arm(self, trio.current_time() + seconds)
        try:
            return await self._wait_and_read()
        except trio.ClosedResourceError:
            if self.timed_out:
                raise httpx.ReadTimeout("timed out reading the response") from None
            raise  # closed by another task, as before
        finally:
            deadlines.waits.pop(self, None)

    async def _wait_and_read(self) -> bytes:
        sock = self.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(READ_SIZE)
            except BlockingIOError:
                continue  # woken for nothing
            except OSError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    def wake(self) -> None:
        if self.sock.fileno() != -1:
            trio.lowlevel.notify_closing(self.sock)

    async def close(self) -> None:
        self.drop()

    def readable(self) -> bool:
        return bool(self.poll.poll(0))

    def drop(self) -> None:
        if self.sock.fileno() != -1:
            trio.lowlevel.notify_closing(self.sock)
            self.sock.close()


class H11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 for one provider client: see the module docstring."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None = None,
        *,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        max_idle: int = MAX_IDLE,
    ) -> None:
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._closed = False
        self._heads = _CheckedHeaders()
        self._written = _RequestHeads()

    # --- the request -----------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport has been closed")
        url = request.url
        origin = _origin_of(url.raw_scheme, url.raw_host, url.port, url.scheme)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        connection = await self._connection(
            origin, timeouts.get("connect"), request.extensions.get("sni_hostname")
        )
        try:
            keep_alive = await self._send_request(connection, request, timeouts.get("write"))
            method = request.method.encode("ascii")
            reply = await self._response(connection, method, keep_alive, timeouts.get("read"))
        except BaseException:
            await connection.close()
            raise
        return reply.to_httpx()

    def prepare_post(self, request: httpx.Request) -> PreparedPost | None:
        """What every POST like ``request`` (one its client built, with a body) has in
        common, for ``post``: None for a request whose head is not kept (see
        ``_RequestHeads``), which then goes through ``handle_async_request``."""
        url = request.url
        try:
            origin = _origin_of(url.raw_scheme, url.raw_host, url.port, url.scheme)
        except httpx.UnsupportedProtocol:
            return None
        if request.method != "POST":
            return None
        try:
            written = self._written.head("POST", url.raw_path, request.headers.raw)
        except h11.LocalProtocolError:
            return None
        if written is None:
            return None
        before, _, after, keep_alive = written
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        return PreparedPost(
            origin,
            before,
            after,
            keep_alive,
            timeouts.get("connect"),
            timeouts.get("write"),
            timeouts.get("read"),
            request.extensions.get("sni_hostname"),
        )

    async def post(self, prepared: PreparedPost, *content: bytes | bytearray) -> DirectResponse:
        """POST the body ``content`` (its parts, in order) with the head ``prepared`` says:
        the bytes that ``handle_async_request`` writes for the same request, and its
        response's head read the same way, without an ``httpx.Request`` or
        ``httpx.Response`` made, nor the body's parts joined (``write_parts``).

        httpx's models cost a provider's every step ~25 µs of Python: the request's
        headers merged and normalised, the response's headers wrapped, both objects built,
        for a client that only ever sends the same head with a new body (issue 14).
        """
        if self._closed:
            raise RuntimeError("the transport has been closed")
        connection = await self._connection(prepared.origin, prepared.connect, prepared.sni)
        try:
            length = sum(map(len, content))
            parts = [prepared.before, b"%d" % length, prepared.after, *content]
            keep_alive = prepared.keep_alive
            try:
                await connection.write_parts(parts, prepared.write)
            except httpx.WriteError:
                keep_alive = False  # as _send_request: the answer is read all the same
            return await self._response(connection, b"POST", keep_alive, prepared.read)
        except BaseException:
            await connection.close()
            raise

    async def _connection(
        self, origin: _Origin, seconds: float | None, sni: str | None
    ) -> _Connection:
        connection = self._take_idle(origin)
        if connection is None:
            connection = await self._connect(origin, seconds, sni)
        return connection

    async def _response(
        self, connection: _Connection, method: bytes, keep_alive: bool, read_timeout: float | None
    ) -> DirectResponse:
        """The head of the response to the request just written, read as h11 reads it.

        h11's ``Connection`` runs every event through its state machine (both sides'
        states, keep-alive, protocol switches): ~45 µs of a provider request's ~75 µs of
        h11 (issue 14), for a client that sends one request at a time and reads its
        response to the end. Here the same h11 code builds and checks the request
        (``h11.Request``, its framing and its writers: a body longer or shorter than
        declared still fails) and parses the response (its status-line, header, chunked
        and Content-Length readers, its framing and keep-alive rules, the size limit of
        an incomplete event), and the bookkeeping is this transport's. A plain head that
        came whole with the first read is read by ``read_plain_head``, to h11's results.
        """
        connection.reusable = False
        buffer = connection.buffer
        if not buffer:
            # Nothing of the answer yet, as after every request: wait for it first.
            received = await connection.read_when_ready(read_timeout)
            if not received:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            buffer += received
        plain = read_plain_head(buffer, method) if _WHOLE_CHUNKS else None
        if plain is not None:
            response, kind, args, head_keeps = plain
        else:
            response = await self._h11_head(connection, read_timeout)
            kind, args = _body_framing(method, response)
            head_keeps = _keep_alive(response)
        keep_alive = keep_alive and head_keeps
        body = ResponseBody(self, connection, _BODY_READERS[kind](*args), keep_alive, read_timeout)
        return DirectResponse(response, body)

    async def _h11_head(self, connection: _Connection, read_timeout: float | None) -> h11.Response:
        """The response head through h11's reader, however it comes: in pieces, after
        informational responses, or malformed (then h11's error)."""
        while True:
            response = connection.parse(maybe_read_from_SEND_RESPONSE_server)
            if response is None:
                received = await connection.read(read_timeout)
                if not received:
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                connection.buffer += received
                continue
            if type(response) is h11.Response:
                return response
            if response.status_code == 101:
                raise httpx.RemoteProtocolError("the server switched protocols (101)")
            # 100 Continue and friends: the answer is still to come.

    async def _send_request(
        self, connection: _Connection, request: httpx.Request, seconds: float | None
    ) -> bool:
        """Write the whole request; whether it lets the connection be kept afterwards."""
        try:
            content: bytes | None = request.content
        except httpx.RequestNotRead:  # a streamed body
            content = None
        try:
            written = None
            if content is not None:
                url = request.url
                written = self._written.head(request.method, url.raw_path, request.headers.raw)
            if content is not None and written is not None:
                before, length, after, keep_alive = written
                declared = int(length)
                if len(content) != declared:  # h11's writer's words for either case
                    too = "much" if len(content) > declared else "little"
                    raise h11.LocalProtocolError(f"Too {too} data for declared Content-Length")
                data = b"".join((before, length, after, content))
                writer = None
            else:
                event = h11.Request(
                    method=request.method,
                    target=request.url.raw_path,
                    headers=self._heads.headers(request.headers.raw),
                )
                _refuse_switches(event)
                kind, args = _body_framing(event.method, event)
                writer = _BODY_WRITERS[kind](*args)
                keep_alive = _keep_alive(event)
                parts: list[bytes] = []
                write_request(event, parts.append)
                if content is not None:
                    if content:
                        writer(h11.Data(data=content), parts.append)
                    writer(h11.EndOfMessage(), parts.append)
                data = b"".join(parts)
        except h11.LocalProtocolError as exc:  # a bad head, a body other than declared
            raise httpx.LocalProtocolError(str(exc)) from exc
        try:
            # A body in memory goes in one write with its head, even for a long history:
            # sent in a write of its own it took the writer through Trio's send loop
            # twice, ~170 more Python calls a step at 200 steps, dearer than the copy.
            await connection.write(data, seconds)
            if writer is not None and content is None:
                async for part in request.stream:  # type: ignore[union-attr]
                    if part:
                        parts = []
                        writer(h11.Data(data=part), parts.append)
                        await connection.write(b"".join(parts), seconds)
                parts = []
                writer(h11.EndOfMessage(), parts.append)
                await connection.write(b"".join(parts), seconds)
        except httpx.WriteError:
            # As httpcore: a server may close its side early and still answer (an error
            # status for a body it will not take), so the answer is read all the same.
            return False
        except h11.LocalProtocolError as exc:  # a streamed body other than declared
            raise httpx.LocalProtocolError(str(exc)) from exc
        return keep_alive

    # --- connections -----------------------------------------------------------------

    def _take_idle(self, origin: _Origin) -> _Connection | None:
        now = time.monotonic()
        idle = self._idle
        for index in range(len(idle) - 1, -1, -1):
            connection = idle[index]
            if connection.origin != origin:
                continue
            del idle[index]
            # Readable while idle: the server closed it (or sent what it should not have).
            if connection.expires < now or connection.readable():
                connection.drop()
                continue
            return connection
        return None

    async def _connect(
        self, origin: _Origin, seconds: float | None, sni: str | None
    ) -> _Connection:
        scheme, host, port = origin
        with trio.CancelScope(deadline=_deadline(seconds)) as scope:
            try:
                tcp = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        if scope.cancelled_caught:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}")
        if scheme != b"https":
            # The socket itself from here on (see _SocketConnection); TCP_NODELAY stays set.
            sock = socket.socket(fileno=tcp.socket.detach())
            sock.setblocking(False)
            return _SocketConnection(origin, sock)
        context = self._ssl_context
        if context is None:
            context = self._ssl_context = shared_ssl_context()
        context.set_alpn_protocols(["http/1.1"])
        tls = trio.SSLStream(
            tcp, context, server_hostname=sni or host, https_compatible=True
        )
        try:
            with trio.CancelScope(deadline=_deadline(seconds)) as scope:
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    # The ssl.SSLError (a failed verification…) is its cause.
                    raise httpx.ConnectError(str(exc.__cause__ or exc)) from exc
            if scope.cancelled_caught:
                raise httpx.ConnectTimeout(f"timed out in the TLS handshake with {host}:{port}")
        except BaseException:
            await trio.aclose_forcefully(tcp)
            raise
        return _StreamConnection(origin, tls, tcp.socket)

    async def _release(self, connection: _Connection) -> None:
        # Reusable only with nothing left over: bytes after a response are no response.
        reusable = connection.reusable and not connection.buffer
        if self._closed or not reusable or len(self._idle) >= self._max_idle:
            await connection.close()
            return
        connection.expires = time.monotonic() + self._keepalive_expiry
        self._idle.append(connection)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()


def _origin_of(scheme: bytes, host: bytes, port: int | None, name: str) -> _Origin:
    if scheme == b"https":
        default_port = 443
    elif scheme == b"http":
        default_port = 80
    else:
        raise httpx.UnsupportedProtocol(
            f"the URL's scheme must be 'http' or 'https', not {name!r}"
        )
    if not host:
        raise httpx.UnsupportedProtocol("the URL has no host")
    return (scheme, host.decode("ascii"), port or default_port)


@dataclass(frozen=True, slots=True)
class PreparedPost:
    """A client's POSTs to one URL (``H11Transport.prepare_post``): where they go, their
    head written around Content-Length's value, and their timeouts."""

    origin: _Origin
    before: bytes  # the head up to Content-Length's value
    after: bytes  # from after the value to the blank line
    keep_alive: bool  # whether the head lets the connection be kept
    connect: float | None
    write: float | None
    read: float | None
    sni: str | None


class DirectResponse:
    """A response's head and body, before (or instead of) an ``httpx.Response``."""

    __slots__ = ("_closed", "head", "stream")

    def __init__(self, head: h11.Response, stream: ResponseBody) -> None:
        self.head = head
        self.stream = stream
        self._closed = False

    @property
    def status_code(self) -> int:
        return int(self.head.status_code)

    def plain(self) -> bool:
        """Whether the body is sent as it is (no Content-Encoding but identity) and no
        cookie is set: what a reader may take without httpx's decoders and cookie jar."""
        # h11's checked headers, lower-cased names (the private list its Headers wraps:
        # this module drives h11's internals throughout).
        for _, name, value in self.head.headers._full_items:
            if name == b"content-encoding":
                if value.strip().lower() != b"identity":
                    return False
            elif name == b"set-cookie" or name == b"set-cookie2":
                return False
        return True

    def to_httpx(self) -> httpx.Response:
        head = self.head
        return httpx.Response(
            status_code=head.status_code,
            headers=head.headers.raw_items(),
            stream=self.stream,
            extensions={
                "http_version": b"HTTP/" + head.http_version,
                "reason_phrase": head.reason,
            },
        )

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.stream.aclose()


def _content_length(raw: list[tuple[bytes, bytes]]) -> tuple[int, bytes] | None:
    """Where the one Content-Length header is and its value, if it is one run of digits
    (h11's own rule for it); None for none, two, or another value: h11 then decides."""
    at = -1
    length = b""
    for index, (name, value) in enumerate(raw):
        if len(name) == 14 and name.lower() == b"content-length":
            if at >= 0:
                return None
            at, length = index, value
    if at < 0 or not length.isdigit():
        return None
    return at, length


def _refuse_switches(event: h11.Request) -> None:
    """CONNECT and Upgrade: only ``h11.Connection``'s state machine handles them."""
    if event.method == b"CONNECT" or get_comma_header(event.headers, b"upgrade"):
        raise h11.LocalProtocolError("CONNECT and Upgrade are not supported here")


class _RequestHeads:
    """A request's head as h11 writes it, checked and written once per set of headers.

    Checking a head (``h11.Request``: the method, the target, Host and every header
    against its grammar), its framing and keep-alive rules and writing it took ~17 µs a
    request, and a provider client sends the same head every time but for
    Content-Length's value. For a head with one Content-Length of digits, h11's
    output is kept by the method, the target and the headers' exact bytes (that value
    left out), as the bytes before and after the value, with its keep-alive: the new
    value goes between them, so what is sent is what h11 would have written (a test
    holds the two to the same bytes). The body must be as long as the value says, as
    h11's writer requires. Any other head (no length, several, chunked) is not kept.
    """

    __slots__ = ("_heads",)

    LIMIT = 16  # heads kept; a provider client has one or two

    def __init__(self) -> None:
        self._heads: dict[tuple[Any, ...], tuple[bytes, bytes, bool] | None] = {}

    def head(
        self, method: str, target: bytes, raw: list[tuple[bytes, bytes]]
    ) -> tuple[bytes, bytes, bytes, bool] | None:
        """(before, the length, after, keep-alive), or None for a head not kept."""
        found = _content_length(raw)
        if found is None:
            return None
        at, length = found
        key = (method, target, *raw[:at], (raw[at][0], b""), *raw[at + 1 :])
        try:
            written = self._heads[key]
        except KeyError:
            written = self._write(method, target, raw)
            if len(self._heads) >= self.LIMIT:
                self._heads.clear()
            self._heads[key] = written
        if written is None:
            return None
        return written[0], length, written[1], written[2]

    @staticmethod
    def _write(
        method: str, target: bytes, raw: list[tuple[bytes, bytes]]
    ) -> tuple[bytes, bytes, bool] | None:
        event = h11.Request(method=method, target=target, headers=raw)  # h11's checks
        _refuse_switches(event)
        if _body_framing(event.method, event)[0] != "content-length":
            return None  # Transfer-Encoding wins over the length
        parts: list[bytes] = []
        write_request(event, parts.append)  # the request line, each header, the blank line
        (at,) = (i for i, part in enumerate(parts) if part[:15].lower() == b"content-length:")
        name = parts[at][: parts[at].index(b":") + 2]
        before = b"".join((*parts[:at], name))
        after = b"".join((b"\r\n", *parts[at + 1 :]))
        return before, after, _keep_alive(event)


class _CheckedHeaders:
    """h11's validation of a request's headers, done once per set of headers.

    ``h11.Request`` checks every header name and value against its grammar (~20 µs for a
    provider's seven headers), and a provider client sends the same headers with every
    request but for Content-Length. The checked form (h11's ``Headers``) is kept by the
    headers' exact bytes, Content-Length's value left out, and reused with the new
    length, itself checked to be digits (h11's own rule for it): what h11 is given is what
    it would have made. ``h11.Request`` still checks Host, the method and the target.
    """

    __slots__ = ("_checked",)

    LIMIT = 16  # sets of headers kept; a provider client has one or two

    def __init__(self) -> None:
        self._checked: dict[tuple[tuple[bytes, bytes], ...], tuple[Any, int]] = {}

    def headers(self, raw: list[tuple[bytes, bytes]]) -> Any:
        found = _content_length(raw)
        if found is None:
            return raw
        at, length = found
        key = (*raw[:at], (raw[at][0], b""), *raw[at + 1 :])
        cached = self._checked.get(key)
        if cached is None:
            checked = h11.Request(method=b"GET", target=b"/", headers=raw).headers
            if len(self._checked) >= self.LIMIT:
                self._checked.clear()
            self._checked[key] = (checked, at)
            return checked
        template, at = cached
        items = list(zip(template.raw_items(), template, strict=True))
        full = [(raw_name, name, value) for (raw_name, value), (name, _) in items]
        full[at] = (full[at][0], b"content-length", length)
        return type(template)(full)


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,20}")  # h11's chunk-size, with nothing after it


def _h11_internals_as_known() -> bool:
    """Whether h11's chunked reader and receive buffer keep their state where
    ``take_whole_chunks`` looks for it (h11 0.16's names); otherwise h11 reads it all."""
    reader, buffer = ChunkedReader(), ReceiveBuffer()
    fresh = {"_bytes_in_chunk": 0, "_bytes_to_discard": b"", "_reading_trailer": False}
    return (
        reader.__dict__ == fresh
        and type(getattr(buffer, "_data", None)) is bytearray
        and hasattr(buffer, "_next_line_search")
        and hasattr(buffer, "_multiple_lines_search")
    )


_WHOLE_CHUNKS = _h11_internals_as_known()

# A response head as servers send it: HTTP/1.1, a status (2xx and up) and its reason, then
# lines of a token, a colon and a value, CRLF throughout, the blank line. The classes are
# h11's own grammar (``_abnf``): a reason or a value is any bytes but NUL, CR, LF, FF and
# VT (its \s), and a value's spaces and tabs at either end are not its own. No CR or LF
# inside a line, and a name (a token) first on each: so the head ends where h11's search
# for a blank line ends it, and there is no obs-fold to undo.
_PLAIN_HEAD = re.compile(
    rb"HTTP/1\.1 ([0-9]{3})(?: ([^\x00\n\r\f\v]*))?\r\n"
    rb"((?:[-!#$%&'*+.^_`|~0-9A-Za-z]+:[^\x00\n\r\f\v]*\r\n)*)\r\n"
)
_CONTENT_LENGTH_DIGITS = 20  # h11's CONTENT_LENGTH_MAX_DIGITS


def read_plain_head(
    buffer: ReceiveBuffer, method: bytes
) -> tuple[h11.Response, str, tuple[int] | tuple[()], bool] | None:
    """The response head at the start of ``buffer``, read as h11 reads it, when it is a
    plain one (``_PLAIN_HEAD``) with plain framing: the ``h11.Response``, the body's
    framing (``_body_framing``'s kind and arguments) and whether the response lets the
    connection be kept (``_keep_alive``); the head is taken from the buffer.

    h11's status-line and header readers, its header normalisation and its framing and
    keep-alive rules are ~60 Python calls for the head every reply has (issue 14). None,
    the buffer untouched, for anything else: a head not all received, HTTP/1.0, 1xx, an
    obs-fold or a bare LF, a byte h11 refuses, a Content-Length other than one run of
    digits, a Transfer-Encoding other than one ``chunked``, both of them; h11 then reads,
    accepts or refuses it as before (a test holds the two to the same results).
    """
    data = buffer._data
    match = _PLAIN_HEAD.match(data)
    if match is None:
        return None
    code, reason, block = match.groups()
    status = int(code)
    if status < 200:
        return None  # informational, or a protocol switch: h11's
    items: list[tuple[bytes, bytes, bytes]] = []
    length: bytes | None = None
    chunked = False
    keep_alive = True
    for line in block.split(b"\r\n")[:-1]:
        raw_name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        name = raw_name.lower()
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > _CONTENT_LENGTH_DIGITS:
                return None  # several, a list, or not a number: h11 judges
            length = value
        elif name == b"transfer-encoding":
            value = value.lower()
            if chunked or value != b"chunked":
                return None
            chunked = True
        elif name == b"connection" and keep_alive:
            keep_alive = b"close" not in [word.strip() for word in value.lower().split(b",")]
        items.append((raw_name, name, value))
    if chunked and length is not None:
        return None  # both: h11's rule (Transfer-Encoding wins), read by h11
    args: tuple[int] | tuple[()]
    if status in (204, 304) or method == b"HEAD" or (method == b"CONNECT" and status < 300):
        kind, args = "content-length", (0,)
    elif chunked:
        kind, args = "chunked", ()
    elif length is not None:
        kind, args = "content-length", (int(length),)
    else:
        kind, args = "http/1.0", ()
    del data[: match.end()]
    buffer._next_line_search = 0  # as ReceiveBuffer._extract leaves them
    buffer._multiple_lines_search = 0
    head = h11.Response(
        headers=Headers(items),
        status_code=status,
        reason=b"" if reason is None else reason,
        http_version=b"1.1",
        _parsed=True,
    )
    return head, kind, args, keep_alive


def take_whole_chunks(
    reader: ChunkedReader, buffer: ReceiveBuffer, pieces: list[bytes | bytearray]
) -> bool:
    """Take the chunks of a chunked body that are whole in ``buffer``, as h11's reader
    would, their data appended to ``pieces``; True when the last chunk (``0``, no
    trailers) was among them: the body is over.

    h11's ``ChunkedReader`` makes each chunk three passes (its size line, its data as a
    ``Data`` event, its closing CRLF), ~35 Python calls, and a provider's reply is a
    chunk per SSE event. Here a whole chunk whose size line is only its hex digits (what
    every server sends) is one ``find`` and two slices. Only where h11 would read the
    same bytes the same way: anything else (an extension, trailers, a chunk not all
    received, a malformed end) is left where it starts, for h11's reader to read,
    accept or refuse, from a state it knows (between two chunks).
    """
    if reader._bytes_in_chunk or reader._bytes_to_discard or reader._reading_trailer:
        return False  # inside a chunk: h11's to finish
    data = buffer._data
    end = len(data)
    position = 0
    over = False
    while position < end:
        line_end = data.find(b"\r\n", position, position + 22)
        if line_end < 0 or _CHUNK_SIZE.fullmatch(data, position, line_end) is None:
            break
        size = int(data[position:line_end], 16)
        start = line_end + 2
        if size == 0:
            if data[start : start + 2] == b"\r\n":
                position, over = start + 2, True
            break  # trailers, or not all received: h11's
        stop = start + size
        if stop + 2 > end or data[stop : stop + 2] != b"\r\n":
            break
        pieces.append(data[start:stop])  # joined into bytes by the caller
        position = stop + 2
    if position:
        del data[:position]
        buffer._next_line_search = 0  # as ReceiveBuffer._extract leaves them
        buffer._multiple_lines_search = 0
    return over


class ResponseBody(httpx.AsyncByteStream):
    """A response's body: what each read completes, as one piece; the connection on close.

    An iterator rather than an async generator: a generator suspended mid-body would be
    finalized later by the event loop, and every generator level costs each suspension.
    """

    __slots__ = (
        "_chunked", "_connection", "_done", "_keep_alive", "_reader", "_released", "_timeout",
        "_transport",
    )  # fmt: skip

    def __init__(
        self,
        transport: H11Transport,
        connection: _Connection,
        reader: Any,
        keep_alive: bool,
        timeout: float | None,
    ) -> None:
        self._transport = transport
        self._connection = connection
        self._reader = reader  # h11's body reader for the response's framing
        self._chunked = _WHOLE_CHUNKS and type(reader) is ChunkedReader
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._done = False
        self._released = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    def _ended(self) -> None:
        self._done = True
        self._connection.reusable = self._keep_alive

    async def __anext__(self) -> bytes:
        if self._done or self._released:
            raise StopAsyncIteration
        connection = self._connection
        reader = self._reader
        pieces: list[bytes | bytearray] = []
        chunked = self._chunked
        try:
            while True:
                if chunked and take_whole_chunks(reader, connection.buffer, pieces):
                    self._ended()  # the last chunk, without trailers
                    if not pieces:
                        raise StopAsyncIteration
                    break
                event = connection.parse(reader)
                if type(event) is h11.Data:
                    pieces.append(event.data)
                    continue
                if event is None:
                    if pieces:
                        break
                    received = await connection.read(self._timeout)
                    if received:
                        connection.buffer += received
                        continue
                    # The server closed: the end of an HTTP/1.0 body, a cut one otherwise
                    # (h11's readers say which, and raise for a cut one).
                    try:
                        event = reader.read_eof()
                    except h11.ProtocolError as exc:
                        raise httpx.RemoteProtocolError(str(exc)) from exc
                    self._keep_alive = False
                self._ended()  # EndOfMessage
                if not pieces:
                    raise StopAsyncIteration
                break
        except StopAsyncIteration:
            raise
        except BaseException:
            self._released = True
            await connection.close()
            raise
        return b"".join(pieces)  # h11 hands out bytearrays: bytes, as httpx promises

    def received_to_the_end(self) -> bool:
        """Whether the rest of the body is already received: then it is read (and dropped)
        without waiting, and the body has ended. A reader that stopped early (at an SSE
        stream's ``[DONE]``) asks, to wait for the rest only when it is not there yet."""
        if not self._done and not self._released:
            try:
                while True:
                    event = self._connection.parse(self._reader)
                    if type(event) is not h11.Data:
                        break
            except httpx.RemoteProtocolError:
                return False
            if type(event) is h11.EndOfMessage:
                self._ended()
        return self._done

    async def aclose(self) -> None:
        if self._released:
            return
        # A reader that stopped early may have left only what is already received
        # (the end of a chunked body): taken without waiting, to keep the socket.
        if not self.received_to_the_end():
            self._released = True
            await self._connection.close()
            return
        self._released = True
        await self._transport._release(self._connection)

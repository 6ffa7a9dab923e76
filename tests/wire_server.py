"""A real HTTP server on 127.0.0.1 that plays scripted chat-completions replies.

Only the wire is fake: the providers talk to it through their real httpx client, so
status handling, SSE framing and connection teardown are exercised for real. Built on
``trio.serve_tcp`` and ``h11`` (which ships with httpx) so it runs inside the test's own
Trio loop and can observe the client disconnecting.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import h11
import trio


@dataclass
class Reply:
    """One scripted response.

    ``events`` are SSE data payloads (a dict is sent as JSON, a str as is); ``raw`` is
    appended byte for byte after them. ``done`` ends the stream with ``data: [DONE]``.
    ``hang`` keeps the response open after the events until the client goes away;
    ``abort`` drops the connection mid-body instead of finishing it.
    """

    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    events: Sequence[dict[str, Any] | str] = ()
    raw: bytes = b""
    done: bool = True
    body: dict[str, Any] | str | None = None
    delay: float = 0.0
    event_delay: float = 0.0
    hang: bool = False
    abort: bool = False


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WireServer:
    replies: list[Reply]
    url: str = ""
    requests: list[Received] = field(default_factory=list)
    disconnected: trio.Event = field(default_factory=trio.Event)
    disconnected_at: float | None = None
    # Answer with keep-alive (as real APIs do) instead of closing after each response.
    keep_alive: bool = False
    connections: int = 0
    # Builds each reply from its request instead of taking the next of ``replies`` (a
    # server whose answer depends on the time, as a rate-limited one does).
    responder: Callable[[Received], Reply] | None = None
    arrivals: list[float] = field(default_factory=list)  # trio.current_time() per request
    in_flight: int = 0  # requests read and not yet answered to the end
    max_in_flight: int = 0

    @property
    def base(self) -> str:
        return self.url

    async def _read_request(self, stream: trio.SocketStream, conn: h11.Connection) -> Received:
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("client closed before a full request")
        assert request is not None
        return Received(
            method=request.method.decode(),
            path=request.target.decode(),
            headers={k.decode().lower(): v.decode() for k, v in request.headers},
            body=body,
        )

    async def _send(self, stream: trio.SocketStream, conn: h11.Connection, event: Any) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    async def _wait_for_disconnect(self, stream: trio.SocketStream) -> None:
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.disconnected_at = trio.current_time()
                self.disconnected.set()
                return

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._exchange(stream, conn):
                conn.start_next_cycle()
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _exchange(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        """One request and its reply; True when the connection may carry another."""
        try:
            received = await self._read_request(stream, conn)
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return False
        self.requests.append(received)
        self.arrivals.append(trio.current_time())
        if self.responder is not None:
            reply = self.responder(received)
        elif self.replies:
            reply = self.replies.pop(0)
        else:
            reply = Reply(status=500, body="no reply left")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._reply(stream, conn, reply)
        finally:
            self.in_flight -= 1

    async def _reply(self, stream: trio.SocketStream, conn: h11.Connection, reply: Reply) -> bool:
        if reply.delay:
            await trio.sleep(reply.delay)
        keep = self.keep_alive and not (reply.hang or reply.abort)
        headers = [*([] if keep else [("connection", "close")]), *reply.headers]
        try:
            if reply.body is not None or reply.status != 200:
                content = reply.body if reply.body is not None else ""
                data = (
                    content.encode() if isinstance(content, str) else json.dumps(content).encode()
                )
                kind = "text/plain" if isinstance(content, str) else "application/json"
                headers += [("content-type", kind), ("content-length", str(len(data)))]
                await self._send(
                    stream, conn, h11.Response(status_code=reply.status, headers=headers)
                )
                await self._send(stream, conn, h11.Data(data=data))
                await self._send(stream, conn, h11.EndOfMessage())
                return keep
            headers.append(("content-type", "text/event-stream"))
            await self._send(stream, conn, h11.Response(status_code=200, headers=headers))
            for item in reply.events:
                payload = item if isinstance(item, str) else json.dumps(item)
                await self._send(stream, conn, h11.Data(data=f"data: {payload}\n\n".encode()))
                if reply.event_delay:
                    await trio.sleep(reply.event_delay)
            if reply.raw:
                await self._send(stream, conn, h11.Data(data=reply.raw))
            if reply.hang:
                await self._wait_for_disconnect(stream)
                return False
            if reply.abort:
                return False
            if reply.done:
                await self._send(stream, conn, h11.Data(data=b"data: [DONE]\n\n"))
            await self._send(stream, conn, h11.EndOfMessage())
        except trio.BrokenResourceError:
            self.disconnected_at = trio.current_time()
            self.disconnected.set()
            return False
        return keep


@asynccontextmanager
async def wire_server(
    *replies: Reply,
    keep_alive: bool = False,
    responder: Callable[[Received], Reply] | None = None,
) -> AsyncIterator[WireServer]:
    """Serve ``replies`` in order, one per request (or ``responder``'s), on an ephemeral port."""
    server = WireServer(replies=list(replies), keep_alive=keep_alive, responder=responder)
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        server.url = f"http://127.0.0.1:{port}"
        try:
            yield server
        except Exception as exc:
            # Re-raised outside the nursery so tests see the error itself, not a group.
            failure = exc
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


def chunk(
    content: str | list[dict[str, Any]] | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    extra_delta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat-completion chunk as both Mistral and OpenAI-compatible servers send it."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    if extra_delta:
        delta.update(extra_delta)
    out: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out

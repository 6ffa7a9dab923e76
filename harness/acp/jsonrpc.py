"""JSON-RPC 2.0 over byte streams, one JSON object per line, in Trio.

The peer is an editor we did not write, so every line it sends is untrusted: a line that is
not JSON, not an object, too long, or not a request gets an error response (-32700,
-32600), an unknown method -32601, and a handler's bad parameters -32602; nothing it sends
ends the connection except closing it. Each request runs in a task of its own, so a long
``session/prompt`` never holds up ``session/cancel`` or the client's answers to our own
requests.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio
from pydantic import ValidationError

log = structlog.get_logger("harness.acp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # ACP's code for an unknown session

# An editor may embed whole files in a prompt: a few MiB is ordinary, 16 MiB is not.
MAX_LINE = 16 * 1024 * 1024
_READ_SIZE = 65536

Params = dict[str, Any]
Handler = Callable[[Params], Awaitable[Any]]
NotificationHandler = Callable[[Params], Awaitable[None]]
RequestId = str | int


class RpcError(Exception):
    """An error response: raised by a handler, or received for a request we sent."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ConnectionClosed(Exception):
    """The peer went away before it answered our request."""


def invalid_params(error: ValidationError) -> RpcError:
    """A pydantic error as -32602, each problem with where it is (no input echoed back:
    the input may be megabytes)."""
    problems = [
        {"loc": ".".join(str(part) for part in item["loc"]), "msg": item["msg"]}
        for item in error.errors(include_url=False, include_input=False)[:20]
    ]
    summary = "; ".join(f"{p['loc'] or 'params'}: {p['msg']}" for p in problems[:3])
    return RpcError(INVALID_PARAMS, f"Invalid params: {summary}", {"errors": problems})


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return value is None or isinstance(value, str | int)


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: RpcError | None = None


class Connection:
    """One JSON-RPC peer: ``serve`` reads and dispatches; ``notify`` and ``request`` send."""

    def __init__(
        self,
        receive: trio.abc.ReceiveStream,
        send: trio.abc.SendStream,
        *,
        max_line: int = MAX_LINE,
        scrub: Callable[[Any], Any] | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._max_line = max_line
        self._scrub = scrub  # applied to every message sent (redaction of known secrets)
        self._write_lock = trio.Lock()
        self._next_id = 0
        self._waiting: dict[int, _Waiter] = {}
        self._closed = False
        self._closed_for_writing = False

    # --- sending ------------------------------------------------------------------------

    async def _write(self, message: Mapping[str, Any]) -> None:
        if self._scrub is not None:
            message = self._scrub(message)
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        async with self._write_lock:
            if self._closed_for_writing:
                raise ConnectionClosed("the client stopped reading")
            try:
                await self._send.send_all(line.encode("utf-8"))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                # The client closed its end of our stdout: nothing more can reach it.
                self._closed_for_writing = True
                raise ConnectionClosed("the client stopped reading") from error

    async def notify(self, method: str, params: Params) -> None:
        await self._write({"jsonrpc": "2.0", "method": method, "params": params})

    async def request(self, method: str, params: Params) -> Any:
        """Send a request and wait for its result; ``RpcError`` if the peer answers with
        an error, ``ConnectionClosed`` if it goes away first. Cancelling the caller
        forgets the request: a late answer is dropped."""
        if self._closed:
            raise ConnectionClosed(method)
        self._next_id += 1
        request_id = self._next_id
        waiter = self._waiting[request_id] = _Waiter()
        try:
            await self._write(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            )
            await waiter.done.wait()
        finally:
            self._waiting.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    async def _respond(self, request_id: RequestId | None, result: Any) -> None:
        await self._write({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _respond_error(self, request_id: RequestId | None, error: RpcError) -> None:
        await self._write({"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()})

    # --- receiving ----------------------------------------------------------------------

    async def serve(
        self,
        methods: Mapping[str, Handler],
        notifications: Mapping[str, NotificationHandler],
    ) -> None:
        """Read and dispatch until the peer closes its end; then wake every waiter and
        cancel the handlers still running."""
        try:
            async with trio.open_nursery() as nursery:
                async for line in self._lines():
                    with contextlib.suppress(ConnectionClosed):  # its answer cannot be sent
                        await self._dispatch(line, methods, notifications, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            for waiter in self._waiting.values():
                waiter.error = RpcError(INTERNAL_ERROR, "the client closed the connection")
                waiter.done.set()

    async def _lines(self) -> Any:
        """Each complete line; an overlong one is answered with -32600 and skipped."""
        buffer = bytearray()
        skipping = False  # inside an overlong line: drop bytes until its newline
        while True:
            chunk = await self._receive.receive_some(_READ_SIZE)
            if not chunk:
                if buffer.strip() and not skipping:
                    yield bytes(buffer)
                return
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if end < 0:
                    if not skipping:
                        buffer += chunk[start:]
                        if len(buffer) > self._max_line:
                            buffer.clear()
                            skipping = True
                            await self._too_long()
                    break
                if skipping:
                    skipping = False
                else:
                    buffer += chunk[start:end]
                    if len(buffer) > self._max_line:
                        await self._too_long()
                    elif buffer.strip():
                        yield bytes(buffer)
                    buffer.clear()
                start = end + 1

    async def _too_long(self) -> None:
        log.warning("acp message too long", limit=self._max_line)
        error = RpcError(
            INVALID_REQUEST, f"Invalid request: message longer than {self._max_line} bytes"
        )
        await self._respond_error(None, error)

    async def _dispatch(
        self,
        line: bytes,
        methods: Mapping[str, Handler],
        notifications: Mapping[str, NotificationHandler],
        nursery: trio.Nursery,
    ) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as bad:  # bad JSON, bad UTF-8, too deep
            detail = str(bad)[:200]
            await self._respond_error(None, RpcError(PARSE_ERROR, f"Parse error: {detail}"))
            return
        if not isinstance(message, dict):
            what = "batches are not supported" if isinstance(message, list) else "not an object"
            await self._respond_error(None, RpcError(INVALID_REQUEST, f"Invalid request: {what}"))
            return
        raw_id = message.get("id")
        has_id = "id" in message
        request_id: RequestId | None = raw_id if _valid_id(raw_id) else None
        if isinstance(request_id, float):
            request_id = int(request_id)
        if message.get("jsonrpc") != "2.0" or (has_id and not _valid_id(raw_id)):
            problem = "jsonrpc must be '2.0'" if message.get("jsonrpc") != "2.0" else "bad id"
            await self._respond_error(
                request_id, RpcError(INVALID_REQUEST, f"Invalid request: {problem}")
            )
            return
        if "method" not in message:
            if "result" not in message and "error" not in message:
                reason = RpcError(INVALID_REQUEST, "Invalid request: no method, result or error")
                await self._respond_error(request_id, reason)
                return
            self._answer(message, request_id)
            return
        method = message["method"]
        params = message.get("params", {})
        if not isinstance(method, str):
            reason = RpcError(INVALID_REQUEST, "Invalid request: method must be a string")
            await self._respond_error(request_id, reason)
            return
        if not has_id:  # a notification: never answered, even when it is wrong
            handler = notifications.get(method)
            if handler is None or not isinstance(params, dict):
                log.info("acp notification ignored", method=method[:100])
                return
            nursery.start_soon(self._run_notification, method, handler, params)
            return
        call = methods.get(method)
        if call is None:
            reason = RpcError(METHOD_NOT_FOUND, f"Method not found: {method[:100]}")
            await self._respond_error(request_id, reason)
            return
        if not isinstance(params, dict):
            reason = RpcError(INVALID_PARAMS, "Invalid params: params must be an object")
            await self._respond_error(request_id, reason)
            return
        nursery.start_soon(self._run_request, method, call, params, request_id)

    def _answer(self, message: dict[str, Any], request_id: RequestId | None) -> None:
        """A response to one of our requests; an unknown or malformed one is dropped."""
        waiter = self._waiting.get(request_id) if isinstance(request_id, int) else None
        if waiter is None:
            log.info("acp response to no request", id=str(request_id)[:40])
            return
        error = message.get("error")
        if "result" in message:
            waiter.result = message["result"]
        elif isinstance(error, dict):
            code = error.get("code")
            text = error.get("message")
            waiter.error = RpcError(
                code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
                str(text)[:500] if text is not None else "error",
                error.get("data"),
            )
        else:
            waiter.error = RpcError(INVALID_REQUEST, "the client's error response is malformed")
        waiter.done.set()

    async def _run_request(
        self, method: str, call: Handler, params: Params, request_id: RequestId | None
    ) -> None:
        try:
            await self._answer_request(method, call, params, request_id)
        except ConnectionClosed:
            log.info("acp answer not sent: the client stopped reading", method=method)

    async def _answer_request(
        self, method: str, call: Handler, params: Params, request_id: RequestId | None
    ) -> None:
        try:
            result = await call(params)
        except ConnectionClosed:
            raise
        except RpcError as error:
            await self._respond_error(request_id, error)
        except ValidationError as error:
            await self._respond_error(request_id, invalid_params(error))
        except Exception as error:
            log.exception("acp handler failed", method=method)
            detail = f"{type(error).__name__}: {error}"[:500]
            await self._respond_error(request_id, RpcError(INTERNAL_ERROR, detail))
        else:
            await self._respond(request_id, result)

    async def _run_notification(
        self, method: str, handler: NotificationHandler, params: Params
    ) -> None:
        try:
            await handler(params)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("acp notification failed", method=method)

"""The daemon: HTTP/1.1 + JSON over a Unix socket, h11 on a Trio listener (DESIGN §9).

A thin adapter: every handler validates its input, calls one ``Harness`` method (or
reads the ledger) and turns the answer into JSON. The loop lives in the actors.

Socket rules: the directory is 0700 and the socket 0600; a peer of another uid is
refused (``SO_PEERCRED``); before binding, an existing socket file is probed: a daemon
that answers means we refuse to start, a dead one is removed; the file is removed on
exit (if it is still ours).
"""

from __future__ import annotations

import json
import math
import os
import resource
import socket as stdlib_socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import structlog
import trio
from pydantic import BaseModel, ValidationError

from harness.actors.collector import collect_when_idle
from harness.agents import UnknownAgentError
from harness.config import Config, ConfigError
from harness.config_files import daemon_cannot_apply, file_rules, read_project
from harness.messages.api import (
    MAX_ID,
    CancelAnswer,
    CompactBody,
    CreateSessionBody,
    Health,
    McpStatus,
    PermissionReplied,
    PermissionReplyBody,
    PromptAccepted,
    PromptBody,
    QuestionAnswered,
    QuestionRejected,
    QuestionReplyBody,
    RevertBody,
    Reverted,
    SessionDeleted,
    SessionDiff,
    UpdateSessionBody,
)
from harness.messages.errors import ApiError
from harness.messages.events import Event
from harness.messages.model import MessageWithParts, Session
from harness.messages.permission import PermissionRequest
from harness.messages.question import QuestionRequest
from harness.messages.todo import Todo
from harness.openapi import Operation, Param, Route, build_document
from harness.providers.errors import ProviderError
from harness.runtime import (
    Harness,
    HarnessError,
    PromptConflict,
    UnknownSession,
    open_harness,
)
from harness.snapshots import RevertConflict, SessionBusy, SnapshotError
from harness.storage.ledger import LedgerError
from harness.storage.lock import LockHolder

log = structlog.get_logger("harness.server")

MAX_BODY = 10 * 1024 * 1024
HEARTBEAT = 15.0  # seconds between SSE comments; clients give up after three missed
SUBSCRIBER_BUFFER = 4096  # events a stream may fall behind before it is cut off
_READ_SIZE = 65536
_MAX_SEQ_DIGITS = 19  # a seq is a SQLite integer: at most 9223372036854775807
_SSE_HEADERS = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
]


class DaemonRunning(RuntimeError):
    """Another daemon answers on the socket path: refuse to start."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a connection may take and how many may be open (``serve(limits=...)``).

    Without them, 200 clients sending a byte a second held 200 connections for good, and
    idle connections used up the descriptors a session's ``bash`` needed.
    """

    header_timeout: float = 10.0  # from a request's first byte to the end of its head
    body_timeout: float = 60.0  # from the end of the head to the end of the body
    idle_timeout: float = 30.0  # a keep-alive connection waiting for its next request
    max_connections: int = 0  # 0: min(512, RLIMIT_NOFILE soft / 4)

    def connection_cap(self) -> int:
        if self.max_connections > 0:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 512
        # Three quarters of the descriptors stay for the ledger, tools and their pipes.
        return max(8, min(512, soft // 4))


class _Gate:
    """Counts open connections; past the cap a connection gets a 503 and is closed."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self, model: type[BaseModel]) -> Any:
        """The body validated against ``model``; 400 when not JSON, 422 when it does not fit."""
        try:
            raw = json.loads(self.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, "malformed_json", f"the body is not valid JSON: {error}") from None
        except RecursionError:
            raise ApiError(400, "malformed_json", "the body is nested too deeply") from None
        if not isinstance(raw, dict):
            raise ApiError(422, "invalid_body", "the body must be a JSON object")
        where = _unencodable(raw)
        if where is not None:
            # JSON may spell a lone surrogate ("\ud800"): no UTF-8 file or row can hold it.
            raise ApiError(422, "invalid_body", f"{where}: not valid Unicode (a lone surrogate)")
        try:
            return model.model_validate(raw)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in item['loc']) or 'body'}: {item['msg']}"
                for item in error.errors()
            )
            raise ApiError(422, "invalid_body", problems) from None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        if not values:
            return None
        if len(values[-1]) > MAX_ID:
            raise ApiError(422, "invalid_query", f"{name}: at most {MAX_ID} characters")
        return values[-1]


def _unencodable(raw: Any) -> str | None:
    """The path of the first string (key or value) UTF-8 cannot encode, or None.

    Iterative: the JSON decoder allows deeper nesting than Python's recursion would.
    """
    stack: list[tuple[str, Any]] = [("body", raw)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                return where
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodes(key):
                    return where
                stack.append((f"{where}.{key}" if where != "body" else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}.{index}", item) for index, item in enumerate(value))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(slots=True)
class Response:
    status: int
    body: Any


def _json(answer: BaseModel) -> Any:
    """An answer model as the JSON value sent: its fields in declaration order."""
    return answer.model_dump(mode="json")


# --- handlers: validate, call the Harness, answer --------------------------------------------


def _session_or_404(h: Harness, session_id: str) -> Any:
    session = h.ledger.session(session_id)
    if session is None:
        raise ApiError(404, "not_found", f"no session {session_id}")
    return session


async def _health(h: Harness, request: Request) -> Response:
    health = Health(pid=os.getpid(), last_seq=h.ledger.last_seq(), sandbox=h.sandbox.mode)
    return Response(200, _json(health))


async def _mcp(h: Harness, request: Request) -> Response:
    return Response(200, _json(McpStatus.model_validate(h.mcp_status())))


async def _create_session(h: Harness, request: Request) -> Response:
    body: CreateSessionBody = request.json(CreateSessionBody)
    model, agent, rules = body.model, body.agent, body.rules()
    default_model: str | None = None
    try:
        # The project file of the session's directory, read now: a changed file applies
        # to the next session. Its rules come before the request's (which win).
        project = read_project(Path(body.directory or "."))
    except ConfigError as error:
        raise ApiError(422, "invalid_config", str(error)) from None
    if project is not None:
        path, parsed = project
        local = daemon_cannot_apply(parsed)
        if local:
            raise ApiError(
                422,
                "invalid_config",
                f"{path}: {', '.join(local)}: applied by embedded runs only "
                "(harness run --embedded), or move them to the daemon's global file",
            )
        default_model = parsed.model  # after the agent's own model
        agent = agent or parsed.agent
        rules = [*file_rules(parsed, path), *rules]
    try:
        session = await h.create_session(
            body.directory or ".",
            model=model,
            agent=agent,
            title=body.title,
            permission=rules,
            base_url=body.base_url,
            default_model=default_model,
        )
    except ConfigError as error:  # a project agent file that cannot be read
        raise ApiError(422, "invalid_config", str(error)) from None
    except (HarnessError, UnknownAgentError, ProviderError) as error:
        raise ApiError(422, "invalid_session", str(error)) from None
    return Response(201, session.model_dump(mode="json"))


async def _update_session(h: Harness, request: Request, session_id: str) -> Response:
    body: UpdateSessionBody = request.json(UpdateSessionBody)
    _session_or_404(h, session_id)
    try:
        session = await h.update_session(
            session_id,
            title=body.title,
            add_rules=body.rules(),
            base_url=body.base_url,
            model=body.model,
            agent=body.agent,
        )
    except SessionBusy as error:
        raise ApiError(409, "session_busy", str(error)) from None
    except (UnknownAgentError, ProviderError) as error:
        raise ApiError(422, "invalid_session", str(error)) from None
    return Response(200, session.model_dump(mode="json"))


async def _list_sessions(h: Harness, request: Request) -> Response:
    return Response(200, [s.model_dump(mode="json") for s in h.sessions()])


async def _get_session(h: Harness, request: Request, session_id: str) -> Response:
    return Response(200, _session_or_404(h, session_id).model_dump(mode="json"))


async def _delete_session(h: Harness, request: Request, session_id: str) -> Response:
    _session_or_404(h, session_id)
    await h.delete_session(session_id)
    return Response(200, _json(SessionDeleted(id=session_id)))


async def _messages(h: Harness, request: Request, session_id: str) -> Response:
    _session_or_404(h, session_id)
    messages = await h.messages(session_id)
    return Response(200, [m.model_dump(mode="json") for m in messages])


async def _prompt(h: Harness, request: Request, session_id: str) -> Response:
    body: PromptBody = request.json(PromptBody)
    try:
        # The session is looked up there, once: 404 if it does not exist.
        message_id = await h.prompt(
            session_id,
            body.text,
            delivery=body.delivery,
            message_id=body.message_id,
            max_steps=body.max_steps,
        )
    except UnknownSession:
        raise ApiError(404, "not_found", f"no session {session_id}") from None
    except PromptConflict as error:
        raise ApiError(409, "message_id_conflict", str(error)) from None
    except HarnessError as error:
        raise ApiError(422, "invalid_prompt", str(error)) from None
    return Response(202, _json(PromptAccepted(message_id=message_id)))


async def _compact(h: Harness, request: Request, session_id: str) -> Response:
    body: CompactBody = request.json(CompactBody)
    _session_or_404(h, session_id)
    try:
        message_id = await h.compact(session_id, message_id=body.message_id)
    except PromptConflict as error:
        raise ApiError(409, "message_id_conflict", str(error)) from None
    return Response(202, _json(PromptAccepted(message_id=message_id)))


async def _cancel(h: Harness, request: Request, session_id: str) -> Response:
    _session_or_404(h, session_id)
    return Response(200, _json(CancelAnswer(cancelled=await h.cancel(session_id))))


async def _diff(h: Harness, request: Request, session_id: str) -> Response:
    _session_or_404(h, session_id)
    try:
        text, files = await h.diff(session_id, since_message=request.param("since"))
    except SnapshotError as error:
        raise ApiError(422, "invalid_diff", str(error)) from None
    diff = SessionDiff.model_validate({"session_id": session_id, "files": files, "diff": text})
    return Response(200, _json(diff))


async def _revert(h: Harness, request: Request, session_id: str) -> Response:
    body: RevertBody = request.json(RevertBody)
    _session_or_404(h, session_id)
    try:
        result = await h.revert(session_id, body.message_id)
    except SessionBusy as error:
        raise ApiError(409, "session_busy", str(error)) from None
    except RevertConflict as error:
        raise ApiError(409, "revert_conflict", str(error)) from None
    except SnapshotError as error:
        raise ApiError(422, "invalid_revert", str(error)) from None
    return Response(200, _json(Reverted.model_validate(result.to_dict())))


async def _list_permissions(h: Harness, request: Request) -> Response:
    session_id = request.param("session")
    if session_id is not None:
        _session_or_404(h, session_id)
    pending = await h.pending_permissions(session_id)
    return Response(200, [p.model_dump(mode="json") for p in pending])


async def _reply_permission(h: Harness, request: Request, request_id: str) -> Response:
    body: PermissionReplyBody = request.json(PermissionReplyBody)
    if not await h.reply_permission(
        request_id, body.reply, body.message, no_terminal=body.no_terminal
    ):
        raise ApiError(404, "not_found", f"no pending permission {request_id}")
    return Response(200, _json(PermissionReplied(id=request_id, reply=body.reply)))


async def _todos(h: Harness, request: Request, session_id: str) -> Response:
    _session_or_404(h, session_id)
    return Response(200, [t.model_dump(mode="json") for t in h.todos(session_id)])


async def _list_questions(h: Harness, request: Request) -> Response:
    session_id = request.param("session")
    if session_id is not None:
        _session_or_404(h, session_id)
    pending = await h.pending_questions(session_id)
    return Response(200, [q.model_dump(mode="json") for q in pending])


async def _reply_question(h: Harness, request: Request, request_id: str) -> Response:
    body: QuestionReplyBody = request.json(QuestionReplyBody)
    try:
        if body.answers is None:
            found = await h.reject_question(request_id, body.message)
        else:
            found = await h.answer_question(request_id, body.answers)
    except HarnessError as error:
        raise ApiError(422, "invalid_answer", str(error)) from None
    if not found:
        raise ApiError(404, "not_found", f"no pending question {request_id}")
    if body.answers is None:
        return Response(200, _json(QuestionRejected(id=request_id)))
    return Response(200, _json(QuestionAnswered(id=request_id, answers=body.answers)))


async def _openapi(h: Harness, request: Request) -> Response:
    return Response(200, _document())


@cache
def _document() -> dict[str, Any]:
    """Built on the first request, not at import: ``harness --help`` never pays for it."""
    return build_document(ROUTES)


Handler = Callable[..., Awaitable[Response]]
_SESSION_FILTER = Param(
    "session",
    "Only this session's (a missing session is a 404)",
    schema={"type": "string", "maxLength": MAX_ID},
    errors=((404, "not_found"), (422, "invalid_query")),
)
_SEQ = {"type": "string", "pattern": r"^[0-9]{0,19}$"}
_BUSY = (409, "session_busy")
ROUTES: list[Route] = [
    Route("/v1/health", {"GET": Operation(_health, "The daemon is up", Health)}),
    Route(
        "/v1/mcp",
        {"GET": Operation(_mcp, "The configured MCP servers and their state", McpStatus)},
    ),
    Route(
        "/v1/openapi.json",
        {"GET": Operation(_openapi, "This document: OpenAPI 3.1", dict[str, Any])},
    ),
    Route(
        "/v1/sessions",
        {
            "GET": Operation(_list_sessions, "Every session, newest first", list[Session]),
            "POST": Operation(
                _create_session,
                "Create a session",
                Session,
                status=201,
                body=CreateSessionBody,
                errors=((422, "invalid_config"), (422, "invalid_session")),
            ),
        },
    ),
    Route(
        "/v1/sessions/{session_id}",
        {
            "GET": Operation(_get_session, "One session", Session),
            "PATCH": Operation(
                _update_session,
                "Change the settings a later turn uses",
                Session,
                body=UpdateSessionBody,
                errors=(_BUSY, (422, "invalid_session")),
            ),
            "DELETE": Operation(_delete_session, "Delete a session", SessionDeleted),
        },
    ),
    Route(
        "/v1/sessions/{session_id}/messages",
        {"GET": Operation(_messages, "The messages with their parts", list[MessageWithParts])},
    ),
    Route(
        "/v1/sessions/{session_id}/prompt",
        {
            "POST": Operation(
                _prompt,
                "Queue (or steer with) user input; answered once it is durable",
                PromptAccepted,
                status=202,
                body=PromptBody,
                errors=((409, "message_id_conflict"), (422, "invalid_prompt")),
            )
        },
    ),
    Route(
        "/v1/sessions/{session_id}/cancel",
        {"POST": Operation(_cancel, "Cancel the running turn", CancelAnswer)},
    ),
    Route(
        "/v1/sessions/{session_id}/compact",
        {
            "POST": Operation(
                _compact,
                "Compact the history now; answered once the request is durable",
                PromptAccepted,
                status=202,
                body=CompactBody,
                errors=((409, "message_id_conflict"),),
            )
        },
    ),
    Route(
        "/v1/sessions/{session_id}/diff",
        {
            "GET": Operation(
                _diff,
                "A unified diff of the files the session changed",
                SessionDiff,
                params=(
                    Param(
                        "since",
                        "Only the changes from this message on",
                        schema={"type": "string", "maxLength": MAX_ID},
                        errors=((422, "invalid_query"),),
                    ),
                ),
                errors=((422, "invalid_diff"),),
            )
        },
    ),
    Route(
        "/v1/sessions/{session_id}/revert",
        {
            "POST": Operation(
                _revert,
                "Put the files back as they were before a message",
                Reverted,
                body=RevertBody,
                errors=(_BUSY, (409, "revert_conflict"), (422, "invalid_revert")),
            )
        },
    ),
    Route(
        "/v1/sessions/{session_id}/todos",
        {"GET": Operation(_todos, "The session's task list", list[Todo])},
    ),
    Route(
        "/v1/permissions",
        {
            "GET": Operation(
                _list_permissions,
                "Pending permission asks",
                list[PermissionRequest],
                params=(_SESSION_FILTER,),
            )
        },
    ),
    Route(
        "/v1/permissions/{permission_id}",
        {
            "POST": Operation(
                _reply_permission,
                "Answer a pending ask: once, always or reject",
                PermissionReplied,
                body=PermissionReplyBody,
                errors=((404, "not_found"),),
            )
        },
    ),
    Route(
        "/v1/questions",
        {
            "GET": Operation(
                _list_questions,
                "Pending questions",
                list[QuestionRequest],
                params=(_SESSION_FILTER,),
            )
        },
    ),
    Route(
        "/v1/questions/{question_id}",
        {
            "POST": Operation(
                _reply_question,
                "Answer a pending question set, or reject it",
                QuestionAnswered | QuestionRejected,
                body=QuestionReplyBody,
                errors=((404, "not_found"), (422, "invalid_answer")),
            )
        },
    ),
    Route(
        "/v1/events",
        {
            # None: the connection serves the stream itself (Connection._events).
            "GET": Operation(
                None,
                "The event stream (Server-Sent Events)",
                Event,
                stream=True,
                description=(
                    "`id:` is the ledger seq; `Last-Event-ID` (or `after`) resumes after "
                    "it. A subscriber that falls too far behind gets a `feed.overflow` "
                    "event and the stream ends."
                ),
                params=(
                    _SESSION_FILTER,
                    Param(
                        "after",
                        "Only events after this seq",
                        schema=_SEQ,
                        errors=((400, "bad_after"),),
                    ),
                    Param(
                        "Last-Event-ID",
                        "As `after`; wins over it",
                        where="header",
                        schema=_SEQ,
                        errors=((400, "bad_after"),),
                    ),
                ),
            )
        },
    ),
]
_PATTERNS = [(r.pattern(), r.methods) for r in ROUTES]


class MethodNotAllowed(ApiError):
    """A 405, which must say in an ``Allow`` header what the path takes (RFC 9110 §15.5.6)."""

    def __init__(self, method: str, path: str, allowed: str) -> None:
        super().__init__(405, "method_not_allowed", f"{method} {path}: use {allowed}")
        self.allowed = allowed


def route(method: str, path: str) -> tuple[Operation, list[str]]:
    """The operation and the path's ids (its handler is ``None`` for the events stream)."""
    for pattern, methods in _PATTERNS:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if method not in methods:
            raise MethodNotAllowed(method, path, ", ".join(sorted(methods)))
        return methods[method], list(match.groups())
    raise ApiError(404, "not_found", f"no route {path}")


def _check_query(operation: Operation, query: dict[str, list[str]]) -> None:
    """Refuse a query parameter the operation does not read, as a body's unknown field is:
    ``/v1/events?sesion=ses_1`` would otherwise stream every session's events."""
    known = {param.name for param in operation.params if param.where == "query"}
    unknown = sorted(name for name in query if name not in known)
    if unknown:
        shown = ", ".join(repr(name[:40]) for name in unknown[:3])
        takes = ", ".join(sorted(known)) or "none"
        raise ApiError(422, "invalid_query", f"unknown query parameter {shown} (takes: {takes})")


# --- one connection ------------------------------------------------------------------------


class _ClientGone(Exception):
    """The peer closed the connection or broke the protocol: stop quietly."""


class _TimedOut(Exception):
    """The peer was too slow: idle between requests, or a request that never ends."""


class Connection:
    """One client connection: requests in order (keep-alive), or one event stream."""

    def __init__(self, h: Harness, stream: trio.SocketStream, limits: Limits | None = None):
        self.h = h
        self.stream = stream
        self.limits = limits or Limits()
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self._deadline = math.inf
        self._head = False  # answering a HEAD request: headers only, no body

    async def _send(self, *events: h11.Event) -> None:
        data = b"".join(self.conn.send(event) or b"" for event in events)
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            raise _ClientGone from error

    async def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self._receive()
            self.conn.receive_data(data)

    async def _receive(self) -> bytes:
        with trio.move_on_at(self._deadline) as waited:
            try:
                return await self.stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                raise _ClientGone from error
        assert waited.cancelled_caught
        raise _TimedOut

    async def _read_request(self) -> Request | None:
        """The next request with its body; None when the client closed between requests
        or stayed idle past the idle timeout."""
        limits = self.limits
        try:
            if not self.conn.trailing_data[0]:
                # Nothing of a next request yet: wait for its first bytes (keep-alive).
                self._deadline = trio.current_time() + limits.idle_timeout
                try:
                    data = await self._receive()
                except _TimedOut:
                    return None
                self.conn.receive_data(data)
            self._deadline = trio.current_time() + limits.header_timeout
            event = await self._next_event()
            if isinstance(event, h11.ConnectionClosed):
                return None
            if not isinstance(event, h11.Request):
                raise _ClientGone
            self._head = event.method == b"HEAD"
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
            target = urlsplit(event.target.decode("latin-1"))
            request = Request(
                event.method.decode("ascii"),
                unquote(target.path).rstrip("/") or "/",
                parse_qs(target.query),
                headers,
                b"",
            )
            declared = headers.get("content-length", "0")
            if declared.isdigit() and int(declared) > MAX_BODY:
                raise ApiError(413, "body_too_large", f"the body is over {MAX_BODY} bytes")
            if self.conn.they_are_waiting_for_100_continue:  # curl waits for this on big bodies
                await self._send(h11.InformationalResponse(status_code=100, headers=[]))
            self._deadline = trio.current_time() + limits.body_timeout
            chunks: list[bytes] = []
            size = 0
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > MAX_BODY:
                        raise ApiError(413, "body_too_large", f"the body is over {MAX_BODY} bytes")
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise _ClientGone
            request.body = b"".join(chunks)
            self._deadline = math.inf
            return request
        except _TimedOut:
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                raise ApiError(
                    408, "request_timeout", "the request did not arrive in time"
                ) from None
            raise _ClientGone from None
        except h11.RemoteProtocolError as error:
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                raise ApiError(400, "bad_request", f"malformed HTTP request: {error}") from None
            raise _ClientGone from error

    async def send_json(
        self,
        status: int,
        body: Any,
        *,
        close: bool = False,
        extra: Sequence[tuple[str, str]] = (),
    ) -> None:
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
        headers += extra
        if close:
            headers.append(("connection", "close"))
        response = h11.Response(status_code=status, headers=headers)
        if self._head:
            # The answer to a HEAD has the length of the body but not the body (h11
            # refuses to send one, and the client would not read it).
            await self._send(response, h11.EndOfMessage())
            return
        # One write: the end of the message in a send of its own was an empty
        # ``send_all``, a checkpoint (a scheduler round on a busy loop) per answer.
        await self._send(response, h11.Data(data=data), h11.EndOfMessage())

    async def serve(self) -> None:
        started = 0.0
        request: Request | None = None
        while True:
            try:
                request = await self._read_request()
                if request is None:
                    return
                started = time.perf_counter()
                operation, ids = route(request.method, request.path)
                _check_query(operation, request.query)
                handler = operation.handler
                if handler is None:
                    await self._events(request)
                    return
                with _session_context(request.path, ids):
                    try:
                        response = await handler(self.h, request, *ids)
                    except (ApiError, _ClientGone):
                        raise
                    except LedgerError as error:  # a full disk: the client may retry later
                        raise ApiError(503, "storage_failed", str(error)) from None
                    except Exception:
                        # Answered here, with the connection still open: a real 500.
                        log.exception("request failed", method=request.method, path=request.path)
                        raise ApiError(
                            500, "internal", "internal error (see the daemon's log)"
                        ) from None
                    await self.send_json(response.status, response.body)
                    _log_request(request, response.status, started)
            except ApiError as error:
                await self._refuse(request, error, started)
                if error.status == 413:
                    await self._discard_rest()
                if self.conn.our_state is not h11.DONE or error.status in (400, 408, 413, 500):
                    return  # the request was not read to its end: the connection is spent
            if self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is not h11.DONE:
                return
            self.conn.start_next_cycle()
            request = None

    async def _refuse(self, request: Request | None, error: ApiError, started: float) -> None:
        log.warning(
            "request refused",
            method=request.method if request else None,
            path=request.path if request else None,
            status=error.status,
            code=error.code,
            error=error.message,
            ms=round((time.perf_counter() - started) * 1000, 2) if started else None,
        )
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise _ClientGone  # a response already started: nothing better to do than close
        body = {"error": {"code": error.code, "message": error.message}}
        spent = error.status in (408, 413, 500) or self.conn.their_state is h11.ERROR
        extra = [("allow", error.allowed)] if isinstance(error, MethodNotAllowed) else []
        await self.send_json(error.status, body, close=spent, extra=extra)

    async def _discard_rest(self) -> None:
        """Read what a refused client is still sending, briefly, so that it gets to read
        the 413 instead of a broken pipe; then the connection closes."""
        with trio.move_on_after(1.0):
            received = 0
            while received < 4 * MAX_BODY:
                try:
                    data = await self.stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                received += len(data)

    # --- server-sent events ----------------------------------------------------------------

    async def _events(self, request: Request) -> None:
        session_id = request.param("session")
        if session_id is not None:
            _session_or_404(self.h, session_id)
        after = _after(request)
        log.info("event stream opened", session_id=session_id, after=after)
        async with self.h.follow(session_id, after, buffer=SUBSCRIBER_BUFFER) as events:
            # Subscribed before the headers go out: a client may prompt once it has them.
            await self._send(h11.Response(status_code=200, headers=_SSE_HEADERS))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._until_peer_closes, nursery.cancel_scope)
                await self._pump(events)
                nursery.cancel_scope.cancel()
        log.info("event stream closed", session_id=session_id, last_seq=events.last_seq)

    async def _pump(self, events: Any) -> None:
        while True:
            with trio.move_on_after(HEARTBEAT) as waited:
                event: Event = await events.receive()
            if waited.cancelled_caught:
                await self._send(h11.Data(data=b": heartbeat\n\n"))
                continue
            # Whatever else is already waiting goes out in the same write: one system call
            # for a burst instead of one per event.
            frames = [sse_frame(event)]
            while event.type != "feed.overflow" and len(frames) < _BATCH_FRAMES:
                try:
                    event = events.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                frames.append(sse_frame(event))
            await self._send(h11.Data(data=b"".join(frames)))
            if event.type == "feed.overflow":
                log.warning("event stream cut off", last_seq=event.data.get("last_seq"))
                await self._send(h11.EndOfMessage())
                return

    async def _until_peer_closes(self, scope: trio.CancelScope) -> None:
        """A stream only writes; reading tells us at once when the client went away."""
        while True:
            try:
                data = await self.stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                scope.cancel()
                return


_BATCH_FRAMES = 256


def sse_frame(event: Event) -> bytes:
    """One event: ``id:`` is the ledger seq (durable events only), ``data:`` the event."""
    head = f"id: {event.seq}\n" if event.seq is not None else ""
    return f"{head}data: {event.to_json()}\n\n".encode()


def _after(request: Request) -> int | None:
    """The seq to resume after: ``Last-Event-ID`` wins over ``after``, but a malformed
    ``after`` is refused even then (it was once ignored beside a good header)."""
    header = _seq(request.headers.get("last-event-id"))
    query = _seq(request.param("after"))
    return header if header is not None else query


def _seq(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    # ASCII digits only: "²" passes str.isdigit() and then fails int().
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_SEQ_DIGITS:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise ApiError(400, "bad_after", f"after / Last-Event-ID must be a seq number: {shown!r}")
    return int(text)


@contextmanager
def _session_context(path: str, ids: list[str]) -> Any:
    if ids and path.startswith("/v1/sessions/"):
        with structlog.contextvars.bound_contextvars(session_id=ids[0]):
            yield
    else:
        yield


def _log_request(request: Request, status: int, started: float) -> None:
    ms = round((time.perf_counter() - started) * 1000, 2)
    log.info("request", method=request.method, path=request.path, status=status, ms=ms)


def peer_uid(stream: trio.SocketStream) -> int:
    raw = stream.socket.getsockopt(
        stdlib_socket.SOL_SOCKET, stdlib_socket.SO_PEERCRED, struct.calcsize("3i")
    )
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


async def handle_connection(
    h: Harness, stream: trio.SocketStream, limits: Limits | None = None, gate: _Gate | None = None
) -> None:
    """Serve one connection; whatever happens here never reaches the listener.

    The ``except`` sits inside ``async with stream``: outside it, the stream was closed
    before the 500 could be sent and the client got no answer at all.
    """
    connection = Connection(h, stream, limits)
    async with stream:
        try:
            if peer_uid(stream) != os.getuid():
                log.warning("peer refused: another user")
                await connection.send_json(
                    403,
                    {"error": {"code": "forbidden", "message": "this daemon serves its owner"}},
                    close=True,
                )
                return
            if gate is not None and gate.open >= gate.cap:
                await _refuse_busy(connection, gate)
                return
            if gate is not None:
                gate.open += 1
            try:
                await connection.serve()
            finally:
                if gate is not None:
                    gate.open -= 1
        except _ClientGone:
            pass
        except Exception:
            log.exception("connection failed")
            if connection.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                body = {"error": {"code": "internal", "message": "internal error (see the log)"}}
                with suppress(_ClientGone, h11.LocalProtocolError):
                    await connection.send_json(500, body, close=True)


async def _refuse_busy(connection: Connection, gate: _Gate) -> None:
    """Past the cap: answer 503 and close at once, without waiting for the request, so
    that a flood of connections holds each descriptor for microseconds only. (A Unix
    socket's peer reads what was sent before the close, unread request or not.)"""
    log.warning("connection refused: at the cap", open=gate.open, cap=gate.cap)
    body = {
        "error": {
            "code": "too_many_connections",
            "message": f"the daemon has {gate.cap} connections open; retry shortly",
        }
    }
    with suppress(_ClientGone, h11.LocalProtocolError):
        await connection.send_json(503, body, close=True)


# --- the socket ----------------------------------------------------------------------------


def _probe(path: Path) -> bool:
    """Whether a daemon answers on ``path``."""
    probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def prepare_socket_path(path: Path) -> None:
    """Make the directory private and clear a stale socket; refuse if a daemon answers."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    # Our own directory is made private; a shared sticky one (/tmp) is left alone and the
    # socket's own mode and the peer uid check still keep others out.
    if info.st_uid == os.getuid() and not info.st_mode & stat.S_ISVTX:
        directory.chmod(0o700)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise DaemonRunning(f"{path} exists and is not a socket; move it away or pick another")
    if _probe(path):
        raise DaemonRunning(f"a daemon is already listening on {path}")
    log.info("removing a stale socket", socket=str(path))
    path.unlink(missing_ok=True)


async def open_listener(path: Path) -> trio.SocketListener:
    prepare_socket_path(path)
    sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        await sock.bind(str(path))
    except OSError as error:
        sock.close()
        raise DaemonRunning(f"cannot bind {path}: {error.strerror}") from None
    finally:
        os.umask(old_umask)
    path.chmod(0o600)
    sock.listen(512)
    return trio.SocketListener(sock)


def _remove_if_ours(path: Path, inode: int) -> None:
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass




async def serve(
    config: Config,
    socket_path: Path | None = None,
    *,
    limits: Limits | None = None,
    task_status: trio.TaskStatus[tuple[Harness, Path]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled: the actor tree plus the listener on the socket."""
    limits = limits or Limits()
    gate = _Gate(limits.connection_cap())
    path = socket_path or config.socket_path
    listener = await open_listener(path)
    inode = path.lstat().st_ino
    try:
        holder = LockHolder("daemon", os.getpid(), str(path))
        async with open_harness(config, holder=holder) as h, trio.open_nursery() as nursery:

            async def handler(stream: trio.SocketStream) -> None:
                await handle_connection(h, stream, limits, gate)

            await nursery.start(trio.serve_listeners, handler, [listener])
            # The daemon's garbage collection: young passes rarer, full ones moved out
            # of its busy moments (actors/collector.py).
            await nursery.start(collect_when_idle)
            log.info(
                "daemon listening",
                socket=str(path),
                pid=os.getpid(),
                max_connections=gate.cap,
                model=config.model,
                durability=config.durability,
                ledger=h.ledger.location,
            )
            task_status.started((h, path))
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        _remove_if_ours(path, inode)
        log.info("daemon stopped", socket=str(path))

"""A client of the daemon, on the standard library only (DESIGN §9).

``harness sessions`` against a live daemon must start, ask and print in well under
150 ms, so this module imports nothing beyond ``http.client``, ``json`` and ``socket`` (and
the standard-library-only ``harness.messages.errors``): no Trio, no httpx, no pydantic.

``EventStream`` follows ``GET /v1/events`` and reconnects by itself with
``Last-Event-ID`` when the connection drops, stays silent for 45 s (three missed
heartbeats), or is cut off for falling behind, so a daemon restart loses nothing.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from harness.messages.errors import ApiError

__all__ = ["ApiError", "Client", "DaemonUnavailable", "EventStream", "WireEvent"]

SILENCE = 45.0  # seconds without a byte (three heartbeats) before reconnecting
RECONNECT_FOR = 60.0  # seconds of failed reconnects before giving up


class DaemonUnavailable(ConnectionError):
    """No daemon answers on the socket."""


class _UnixConnection(http.client.HTTPConnection):
    """``http.client`` speaking over a Unix socket instead of TCP."""

    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(slots=True, frozen=True)
class WireEvent:
    """An event as the stream carries it; ``raw`` is the exact JSON the daemon sent."""

    seq: int | None
    ts: float
    type: str
    session_id: str
    data: dict[str, Any]
    raw: str

    def to_json(self) -> str:
        return self.raw

    @classmethod
    def parse(cls, raw: str) -> WireEvent:
        body = json.loads(raw)
        return cls(body["seq"], body["ts"], body["type"], body["session_id"], body["data"], raw)


class Client:
    """One request per connection: simple, and a dropped connection never poisons the next."""

    def __init__(self, socket_path: Path, *, timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        connection = _UnixConnection(self.socket_path, self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"content-type": "application/json"} if data is not None else {}
            try:
                connection.request(method, path, body=data, headers=headers)
            except (FileNotFoundError, ConnectionRefusedError) as error:
                raise DaemonUnavailable(
                    f"no daemon answers on {self.socket_path} (start one with `harness serve`)"
                ) from error
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        answer = json.loads(payload) if payload else None
        if response.status >= 400:
            detail = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise ApiError(
                response.status,
                detail.get("code", "error"),
                detail.get("message", f"HTTP {response.status}"),
            )
        return answer

    def alive(self) -> bool:
        try:
            self.request("GET", "/v1/health")
        except (DaemonUnavailable, OSError, ApiError, ValueError):
            return False
        return True

    # --- the routes ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("GET", "/v1/health")
        return answer

    def mcp(self) -> dict[str, Any]:
        """The daemon's MCP servers as they are now (``harness mcp``)."""
        answer: dict[str, Any] = self.request("GET", "/v1/mcp")
        return answer

    def sessions(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self.request("GET", "/v1/sessions")
        return answer

    def session(self, session_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("GET", f"/v1/sessions/{quote(session_id)}")
        return answer

    def create_session(self, **body: Any) -> dict[str, Any]:
        fields = {name: value for name, value in body.items() if value is not None}
        answer: dict[str, Any] = self.request("POST", "/v1/sessions", fields)
        return answer

    def update_session(self, session_id: str, **body: Any) -> dict[str, Any]:
        """``PATCH /v1/sessions/{id}``: ``title``, ``permission`` (rules added),
        ``base_url``, ``model`` or ``agent``; 409 while the session is busy."""
        fields = {name: value for name, value in body.items() if value not in (None, [])}
        answer: dict[str, Any] = self.request(
            "PATCH", f"/v1/sessions/{quote(session_id)}", fields
        )
        return answer

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self.request(
            "GET", f"/v1/sessions/{quote(session_id)}/messages"
        )
        return answer

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        delivery: str = "queue",
        message_id: str | None = None,
        max_steps: int | None = None,
    ) -> str:
        body: dict[str, Any] = {"text": text, "delivery": delivery}
        if message_id is not None:
            body["message_id"] = message_id
        if max_steps is not None:
            body["max_steps"] = max_steps
        answer = self.request("POST", f"/v1/sessions/{quote(session_id)}/prompt", body)
        return str(answer["message_id"])

    def compact(self, session_id: str, *, message_id: str | None = None) -> str:
        """Queue a compaction turn; its message id (follow its ``turn.finished``)."""
        body = {"message_id": message_id} if message_id is not None else {}
        answer = self.request("POST", f"/v1/sessions/{quote(session_id)}/compact", body)
        return str(answer["message_id"])

    def cancel(self, session_id: str) -> bool:
        answer = self.request("POST", f"/v1/sessions/{quote(session_id)}/cancel", {})
        return bool(answer["cancelled"])

    def diff(self, session_id: str, since: str | None = None) -> dict[str, Any]:
        query = f"?{urlencode({'since': since})}" if since else ""
        answer: dict[str, Any] = self.request(
            "GET", f"/v1/sessions/{quote(session_id)}/diff{query}"
        )
        return answer

    def revert(self, session_id: str, message_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.request(
            "POST", f"/v1/sessions/{quote(session_id)}/revert", {"message_id": message_id}
        )
        return answer

    def delete(self, session_id: str) -> None:
        self.request("DELETE", f"/v1/sessions/{quote(session_id)}")

    def permissions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        query = f"?{urlencode({'session': session_id})}" if session_id else ""
        answer: list[dict[str, Any]] = self.request("GET", f"/v1/permissions{query}")
        return answer

    def reply_permission(
        self,
        request_id: str,
        reply: str,
        message: str | None = None,
        *,
        no_terminal: bool = False,
    ) -> None:
        body: dict[str, Any] = {"reply": reply}
        if message is not None:
            body["message"] = message
        if no_terminal:
            body["no_terminal"] = True
        self.request("POST", f"/v1/permissions/{quote(request_id)}", body)

    def todos(self, session_id: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self.request(
            "GET", f"/v1/sessions/{quote(session_id)}/todos"
        )
        return answer

    def questions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        query = f"?{urlencode({'session': session_id})}" if session_id else ""
        answer: list[dict[str, Any]] = self.request("GET", f"/v1/questions{query}")
        return answer

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        self.request("POST", f"/v1/questions/{quote(request_id)}", {"answers": answers})

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        body: dict[str, Any] = {"reject": True}
        if message is not None:
            body["message"] = message
        self.request("POST", f"/v1/questions/{quote(request_id)}", body)

    def events(self, session_id: str | None = None, after: int | None = None) -> EventStream:
        return EventStream(self.socket_path, session_id=session_id, after=after)


class EventStream:
    """``GET /v1/events`` as an iterator of ``WireEvent``, reconnecting by itself.

    ``open()`` connects and returns once the daemon has subscribed (its headers
    arrived), so a caller may then prompt knowing no event will be missed. Ephemeral
    events (deltas) sent while disconnected are lost; durable ones are replayed.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        session_id: str | None = None,
        after: int | None = None,
        silence: float = SILENCE,
        reconnect_for: float = RECONNECT_FOR,
    ) -> None:
        self.socket_path = socket_path
        self.session_id = session_id
        self.last_id = after
        self.silence = silence
        self.reconnect_for = reconnect_for
        self.reconnects = 0
        self._connection: _UnixConnection | None = None
        self._response: http.client.HTTPResponse | None = None

    def open(self) -> None:
        query: dict[str, str] = {}
        if self.session_id is not None:
            query["session"] = self.session_id
        headers = {"accept": "text/event-stream"}
        if self.last_id is not None:
            headers["last-event-id"] = str(self.last_id)
        path = "/v1/events" + (f"?{urlencode(query)}" if query else "")
        connection = _UnixConnection(self.socket_path, self.silence)
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as error:
            connection.close()
            raise DaemonUnavailable(f"no daemon answers on {self.socket_path}") from error
        except BaseException:
            connection.close()
            raise
        if response.status != 200:
            payload = response.read()
            connection.close()
            detail = json.loads(payload).get("error", {}) if payload else {}
            raise ApiError(response.status, detail.get("code", "error"), detail.get("message", ""))
        self._connection, self._response = connection, response

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = self._response = None

    def _reopen(self) -> None:
        """Connect again, retrying for ``reconnect_for`` seconds (a daemon restart)."""
        self.close()
        self.reconnects += 1
        deadline = time.monotonic() + self.reconnect_for
        delay = 0.05
        while True:
            try:
                self.open()
                return
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(
                        f"lost the daemon on {self.socket_path} and could not reconnect"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _frames(self) -> Iterator[WireEvent]:
        """Events of the current connection until it ends, drops or goes silent."""
        assert self._response is not None
        data: list[str] = []
        seq: int | None = None
        while True:
            try:
                line = self._response.readline()
            except (OSError, http.client.HTTPException, ValueError):
                return  # dropped or silent for too long (socket timeout)
            if not line:
                return
            text = line.decode("utf-8").rstrip("\r\n")
            if text.startswith(":"):
                continue  # heartbeat
            if text.startswith("id:"):
                seq = int(text[3:].strip())
            elif text.startswith("data:"):
                data.append(text[5:].removeprefix(" "))
            elif not text and data:
                event = WireEvent.parse("\n".join(data))
                if seq is not None:
                    self.last_id = seq
                data, seq = [], None
                yield event

    def __iter__(self) -> Iterator[WireEvent]:
        if self._response is None:
            self.open()
        while True:
            for event in self._frames():
                if event.type == "feed.overflow":
                    # Cut off for falling behind: resume from the last event it names.
                    last = event.data.get("last_seq")
                    if isinstance(last, int):
                        self.last_id = last
                    break
                yield event
            self._reopen()

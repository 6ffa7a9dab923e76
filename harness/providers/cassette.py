"""Record and replay provider exchanges: ``--record FILE`` and ``--model replay:FILE``.

A cassette is JSON lines, one per HTTP exchange, in the order the requests were sent::

    {"v": 1, "provider": "mistral", "model": "devstral-medium-latest", "base_url": null,
     "method": "POST", "url": "https://api.mistral.ai/v1/chat/completions",
     "request": {...the JSON body...}, "status": 200,
     "headers": {"content-type": "text/event-stream"}, "body": "data: {...}\\n\\n..."}

``body`` is the response body exactly as received (up to where the client stopped
reading: the end, ``[DONE]``, or a cancel), as text when it is UTF-8 and not
content-encoded, else ``body_b64``. A connection that failed carries
``"error": {"type": "ConnectError", "message": ...}`` (with no ``status`` when it failed
before any response). Request headers are never written, so neither is the API key or
the ``Authorization`` header; of the response headers only those the provider code reads
are kept.

Recording wraps the transport of the provider's own httpx client; replay builds the
recorded provider kind over an httpx client whose transport answers the recorded
responses, so parsing, error mapping and events are exactly those of the real path. Each
request takes the first unplayed exchange whose recorded body is identical to it, else
the next unplayed one in order (with a warning in the log); asking past the end is a
clear error.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import IO, Any

import httpx

from harness.messages.provider import ProviderRequest, StreamEvent
from harness.private import open_private
from harness.providers.base import Provider
from harness.providers.errors import BadRequestError
from harness.providers.table import PROVIDERS, http_kinds, http_provider
from harness.secrets import redact

VERSION = 1
# The response headers the provider code reads (content decoding, retry hints).
KEPT_HEADERS = ("content-type", "content-encoding", "retry-after", "retry-after-ms")


class CassetteError(BadRequestError):
    """A cassette that cannot be read, or a run that asks more than it recorded."""


# --- recording ---------------------------------------------------------------------------


class CassetteWriter:
    """Appends one JSON line per exchange; each line is written whole, then flushed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    def write(self, entry: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Responses echo what the session saw: the cassette is the owner's only.
            self._file = open_private(self.path, "ab")
        line = redact(json.dumps(entry, ensure_ascii=False))
        self._file.write(line.encode("utf-8") + b"\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _body_fields(raw: bytes, headers: httpx.Headers) -> dict[str, str]:
    if "content-encoding" not in headers:
        try:
            return {"body": raw.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"body_b64": base64.b64encode(raw).decode("ascii")}


async def _content(request: httpx.Request) -> bytes:
    try:
        return request.content
    except httpx.RequestNotRead:
        return await request.aread()


def _request_json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")


class _RecordingStream(httpx.AsyncByteStream):
    """Passes the raw body through, keeping a copy; the exchange is written on close."""

    def __init__(
        self, response: httpx.Response, entry: dict[str, Any], writer: CassetteWriter
    ) -> None:
        self._response = response
        self._entry = entry
        self._writer = writer
        self._parts: list[bytes] = []
        self._written = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._response.aiter_raw():
                self._parts.append(part)
                yield part
        except httpx.TransportError as exc:
            self._entry["error"] = {"type": type(exc).__name__, "message": str(exc)}
            raise

    async def aclose(self) -> None:
        try:
            # The connection is closed first: recording must not delay a cancel.
            await self._response.aclose()
        finally:
            if not self._written:
                self._written = True
                self._entry.update(_body_fields(b"".join(self._parts), self._response.headers))
                self._writer.write(self._entry)


class RecordingTransport(httpx.AsyncBaseTransport):
    """Sends through a plain httpx client (so proxies from the environment still apply)
    and writes every exchange to the cassette."""

    def __init__(
        self, writer: CassetteWriter, *, provider: str, model: str, base_url: str | None
    ) -> None:
        self._writer = writer
        self._provider = provider
        self._model = model
        self._base_url = base_url
        self._client: httpx.AsyncClient | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await _content(request)
        entry: dict[str, Any] = {
            "v": VERSION,
            "provider": self._provider,
            "model": self._model,
            "base_url": self._base_url,
            "method": request.method,
            "url": str(request.url.copy_with(query=None)),
            "request": _request_json(content),
        }
        if self._client is None:
            self._client = httpx.AsyncClient()
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            entry["error"] = {"type": type(exc).__name__, "message": str(exc)}
            self._writer.write(entry)
            raise
        entry["status"] = response.status_code
        entry["headers"] = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_RecordingStream(response, entry, self._writer),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        try:
            if self._client is not None:
                await self._client.aclose()
        finally:
            self._writer.close()


def recording_transport(
    path: Path, *, provider: str, model: str, base_url: str | None
) -> RecordingTransport:
    writer = CassetteWriter(path)
    return RecordingTransport(writer, provider=provider, model=model, base_url=base_url)


# --- replay ------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Exchange:
    line: int
    provider: str
    model: str
    base_url: str | None
    request: Any
    status: int | None
    headers: dict[str, str]
    body: bytes
    error: dict[str, str] | None


def _field(entry: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CassetteError(f"{where}: missing or invalid {name!r}")
    return value


def _exchange(entry: Any, line: int, where: str) -> Exchange:
    if not isinstance(entry, dict):
        raise CassetteError(f"{where}: not a cassette entry (expected a JSON object)")
    if entry.get("v") != VERSION:
        raise CassetteError(f"{where}: unsupported cassette version {entry.get('v')!r}")
    provider = _field(entry, "provider", str, where)
    if provider not in http_kinds():
        raise CassetteError(f"{where}: unknown provider {provider!r}")
    model = _field(entry, "model", str, where)
    base_url = entry.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise CassetteError(f"{where}: missing or invalid 'base_url'")
    error = entry.get("error")
    if error is not None and not (
        isinstance(error, dict) and all(isinstance(v, str) for v in error.values())
    ):
        raise CassetteError(f"{where}: missing or invalid 'error'")
    status: int | None = None
    headers: dict[str, str] = {}
    body = b""
    if entry.get("status") is not None or error is None:
        status = _field(entry, "status", int, where)
        headers = entry.get("headers") or {}
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise CassetteError(f"{where}: missing or invalid 'headers'")
        if isinstance(entry.get("body"), str):
            body = entry["body"].encode("utf-8")
        elif isinstance(entry.get("body_b64"), str):
            try:
                body = base64.b64decode(entry["body_b64"], validate=True)
            except ValueError as exc:
                raise CassetteError(f"{where}: invalid 'body_b64': {exc}") from None
        else:
            raise CassetteError(f"{where}: missing or invalid 'body'")
    return Exchange(
        line=line,
        provider=provider,
        model=model,
        base_url=base_url,
        request=entry.get("request"),
        status=status,
        headers=headers,
        body=body,
        error=error,
    )


def load_cassette(path: Path) -> list[Exchange]:
    """Every exchange of the cassette at ``path``; a clear ``CassetteError`` otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CassetteError(f"replay: no cassette at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CassetteError(f"replay: cannot read the cassette {path}: {exc}") from None
    exchanges: list[Exchange] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"replay: {path} line {number}"
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise CassetteError(f"{where}: not JSON ({exc})") from None
        exchanges.append(_exchange(entry, number, where))
    if not exchanges:
        raise CassetteError(f"replay: the cassette {path} holds no exchange")
    return exchanges


_TRANSPORT_ERRORS: dict[str, type[httpx.TransportError]] = {
    cls.__name__: cls
    for cls in (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.ReadError,
        httpx.ReadTimeout,
        httpx.WriteError,
        httpx.WriteTimeout,
        httpx.PoolTimeout,
        httpx.RemoteProtocolError,
        httpx.LocalProtocolError,
        httpx.ProxyError,
        httpx.NetworkError,
        httpx.TimeoutException,
    )
}


def _transport_error(error: dict[str, str], request: httpx.Request) -> httpx.TransportError:
    cls = _TRANSPORT_ERRORS.get(error.get("type", ""), httpx.ReadError)
    return cls(error.get("message", ""), request=request)


class _ReplayStream(httpx.AsyncByteStream):
    def __init__(self, exchange: Exchange, request: httpx.Request) -> None:
        self._exchange = exchange
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._exchange.body:
            yield self._exchange.body
        if self._exchange.error is not None:
            raise _transport_error(self._exchange.error, self._request)


class ReplayTransport(httpx.AsyncBaseTransport):
    """Answers each request with a recorded response (see the module docstring)."""

    def __init__(self, path: Path, exchanges: list[Exchange]) -> None:
        self.path = path
        self.exchanges = exchanges
        self.played = [False] * len(exchanges)

    def take(self, body: Any) -> Exchange:
        for index, exchange in enumerate(self.exchanges):
            if not self.played[index] and exchange.request == body:
                self.played[index] = True
                return exchange
        for index, exchange in enumerate(self.exchanges):
            if not self.played[index]:
                self.played[index] = True
                _warn_mismatch(self.path, exchange.line, first_difference(exchange.request, body))
                return exchange
        raise CassetteError(
            f"replay: the run asked for more than the {len(self.exchanges)} exchange(s) "
            f"recorded in {self.path}: the session went further than the recording"
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await _content(request)
        exchange = self.take(_request_json(content))
        if exchange.status is None:
            assert exchange.error is not None
            raise _transport_error(exchange.error, request)
        return httpx.Response(
            status_code=exchange.status,
            headers=exchange.headers,
            stream=_ReplayStream(exchange, request),
            request=request,
        )


def first_difference(recorded: Any, sent: Any, where: str = "") -> str:
    """Where two JSON values first differ, as a path like ``messages[2].content``."""
    if isinstance(recorded, dict) and isinstance(sent, dict):
        for key in [*recorded, *(k for k in sent if k not in recorded)]:
            if recorded.get(key) != sent.get(key):
                return first_difference(recorded.get(key), sent.get(key), f"{where}.{key}")
    elif isinstance(recorded, list) and isinstance(sent, list):
        for index, (old, new) in enumerate(zip(recorded, sent, strict=False)):
            if old != new:
                return first_difference(old, new, f"{where}[{index}]")
        if len(recorded) != len(sent):
            return f"{where}[{min(len(recorded), len(sent))}]".lstrip(".")
    return where.lstrip(".") or "(the whole body)"


def _warn_mismatch(path: Path, line: int, where: str) -> None:
    import structlog

    structlog.get_logger("harness.replay").warning(
        "replay request differs from the recording",
        cassette=str(path),
        line=line,
        first_difference=where,
    )


class ReplayProvider:
    """The recorded provider kind, built over a ``ReplayTransport``: no network, no key."""

    def __init__(self, path: Path) -> None:
        exchanges = load_cassette(path)
        first = exchanges[0]
        self.model = first.model
        self.transport = ReplayTransport(path, exchanges)
        self._inner: Provider
        kind = PROVIDERS[first.provider]
        self._inner = http_provider(
            first.provider,
            first.model,
            base_url=first.base_url,
            transport=self.transport,
            api_key="replay" if kind.key_required else None,
        )
        self.name = self._inner.name

    def stream(
        self, request: ProviderRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        # The session's model string is replay:FILE; the recording asked for the model.
        return self._inner.stream(dataclasses.replace(request, model=self.model))

    async def aclose(self) -> None:
        await self._inner.aclose()

"""Random requests at every route of a live daemon (issue 12, "Tests that must exist").

Hypothesis makes methods, paths, query strings, headers and bodies, some shaped like the
API's (known fields with random values), some arbitrary bytes. Each goes over a real Unix
socket to a real ``serve`` (in a thread of its own, with small timeouts), the client then
closes its sending side. Whatever was sent, the first thing back must be a well-formed
HTTP response, a 4xx/5xx must carry ``{"error": {"code", "message"}}``, and the daemon
must still answer ``/v1/health``.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import string
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from urllib.parse import quote

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import server
from harness.client import Client
from harness.config import Config

LIMITS = server.Limits(header_timeout=1.0, body_timeout=1.0, idle_timeout=1.0)


class LiveDaemon:
    """``serve`` running in a thread's own Trio loop, stopped by cancelling it."""

    def __init__(self, home: Path, path: Path) -> None:
        self.path = path
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main, home), daemon=True)

    async def _main(self, home: Path) -> None:
        config = Config(home=home, log_file=home.parent / "daemon.jsonl")
        with trio.CancelScope() as scope:
            self._scope = scope
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(server.serve, config, self.path, limits=LIMITS))
                self._ready.set()

    def __enter__(self) -> LiveDaemon:
        self._thread.start()
        assert self._ready.wait(20), "the daemon never started"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None and self._scope is not None
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(20)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[LiveDaemon, str]]:
    root = Path(tempfile.mkdtemp(prefix="hz", dir="/tmp"))
    try:
        project = root / "project"
        project.mkdir()
        script = root / "script.json"
        script.write_text(json.dumps([{"text": "answer"}]))
        with LiveDaemon(root / "home", root / "d.sock") as daemon:
            session = Client(daemon.path).create_session(
                directory=str(project), model=f"scripted:{script}"
            )
            yield daemon, session["id"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- what to send ---------------------------------------------------------------------------

FIELDS = [
    "text", "title", "directory", "model", "base_url", "agent", "permission", "message_id",
    "max_steps", "delivery", "reply", "message", "no_terminal", "answers", "reject",
]
ROUTES = [
    ("GET", "/v1/health"), ("GET", "/v1/sessions"), ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"), ("PATCH", "/v1/sessions/{id}"),
    ("DELETE", "/v1/sessions/{id}"), ("GET", "/v1/sessions/{id}/messages"),
    ("POST", "/v1/sessions/{id}/prompt"), ("POST", "/v1/sessions/{id}/cancel"),
    ("GET", "/v1/sessions/{id}/diff"), ("POST", "/v1/sessions/{id}/revert"),
    ("GET", "/v1/sessions/{id}/todos"), ("GET", "/v1/permissions"),
    ("POST", "/v1/permissions/{id}"), ("GET", "/v1/questions"), ("POST", "/v1/questions/{id}"),
    ("GET", "/v1/events"),
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=5),
    max_leaves=20,
)
api_bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4)
bodies = st.one_of(
    api_bodies.map(lambda body: json.dumps(body).encode()),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=300),
    st.just(b"[" * 5000),
    st.just(b'{"title": "\\ud800"}'),
)
token = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=20)
header_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=40,
)
headers = st.lists(
    st.one_of(
        st.tuples(token, header_value),
        st.tuples(token, header_value),
        st.tuples(token, header_value),
        st.tuples(
            st.sampled_from(
                ["content-length", "last-event-id", "transfer-encoding", "expect", "connection"]
            ),
            st.one_of(header_value, st.integers(-5, 10**6).map(str), st.just("chunked"),
                      st.just("100-continue"), st.just("²"), st.just("9" * 5000)),
        ),
    ),
    max_size=4,
)
query = st.one_of(
    st.just(""),
    st.lists(
        st.tuples(st.sampled_from(["session", "after", "since", "x"]), header_value),
        max_size=3,
    ).map(lambda pairs: "?" + "&".join(f"{k}={quote(v)}" for k, v in pairs)),
    st.integers(0, 10**30).map(lambda n: f"?after={n}"),
    st.just("?after=" + "9" * 5000),
    st.sampled_from(["?after=²", "?session=%ED%A0%80", "?after=%00"]),
)


@st.composite
def requests(draw: st.DrawFn, session_id: str) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(min_size=1, max_size=400))  # not HTTP at all, most likely
    method, template = draw(st.sampled_from(ROUTES))
    if draw(st.integers(0, 4)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PATCH", "DELETE", "PUT", "HEAD"]) | token)
    identifier = draw(st.sampled_from([session_id, "ses_nope", "per_x", "que_x"]) | token)
    path = template.replace("{id}", identifier) + draw(query)
    body = draw(bodies)
    lines = [f"{method} {path} HTTP/1.1", "host: h"]
    extra = draw(headers)
    if not any(name.lower() in ("content-length", "transfer-encoding") for name, _ in extra):
        extra.append(("content-length", str(len(body))))
    lines += [f"{name}: {value}" for name, value in extra]
    head = "\r\n".join(lines) + "\r\n\r\n"
    return head.encode("utf-8" if draw(st.booleans()) else "latin-1", "replace") + body


# --- what must come back --------------------------------------------------------------------

_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) [^\r\n]*\r\n")


def exchange(path: Path, payload: bytes) -> bytes:
    """Send, close the sending side, read until the daemon closes (at most 10 s)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before reading everything: read the answer
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return data


def first_response(data: bytes, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """The first final response: status, headers, body (by content-length; none for a
    HEAD request, whose answer only announces its length)."""
    while True:
        match = _STATUS.match(data)
        assert match is not None, f"not an HTTP response: {data[:200]!r}"
        lines, separator, rest = data.partition(b"\r\n\r\n")
        assert separator, f"an unfinished head: {data[:200]!r}"
        fields = {}
        for line in lines.split(b"\r\n")[1:]:
            name, colon, value = line.partition(b":")
            assert colon, f"a malformed header line: {line!r}"
            fields[name.decode().strip().lower()] = value.decode("latin-1").strip()
        status = int(match.group(1))
        if 100 <= status < 200:
            data = rest
            continue
        if head:
            return status, fields, b""
        if "content-length" in fields:
            length = int(fields["content-length"])
            assert len(rest) >= length, "the body was cut short"
            return status, fields, rest[:length]
        return status, fields, rest


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_answer_is_well_formed_http_with_the_json_error_shape(
    live: tuple[LiveDaemon, str], data: st.DataObject
) -> None:
    daemon, session_id = live
    payload = data.draw(requests(session_id))
    answer = exchange(daemon.path, payload)
    assert answer, f"the connection closed without an answer to {payload[:200]!r}"
    head = payload.startswith(b"HEAD ")
    status, fields, body = first_response(answer, head=head)
    if status >= 400 and not head:
        assert fields.get("content-type") == "application/json"
        error = json.loads(body)["error"]
        assert set(error) == {"code", "message"}
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
    assert status != 500, f"an unforeseen error for {payload[:300]!r}: {body[:300]!r}"
    health = Client(daemon.path, timeout=10).health()
    assert health["ok"] is True


def test_the_daemon_is_healthy_after_the_storm(live: tuple[LiveDaemon, str]) -> None:
    daemon, _ = live
    client = Client(daemon.path)
    assert client.health()["ok"] is True
    assert isinstance(client.sessions(), list)

"""The daemon's answers to hostile or unlucky clients (issue 12, items 7-10).

Each request goes over a real Unix socket to a real ``serve``; what comes back must be a
well-formed HTTP response with the JSON error body, and the daemon must keep serving.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import wait_for_daemon
from test_daemon import Daemon, _config, raw, sse, until_finished

from harness import server
from harness.client import ApiError, Client
from harness.messages import api

FAST = server.Limits(header_timeout=0.5, body_timeout=0.5, idle_timeout=0.5, max_connections=6)


@pytest.fixture
async def daemon(tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery) -> Daemon:
    h, path = await nursery.start(server.serve, _config(tmp_path), socket_dir / "d.sock")
    return Daemon(h, path, Client(path), tmp_path)


@pytest.fixture
async def fast_daemon(
    tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery
) -> Daemon:
    """A daemon with small timeouts and a cap of 6 connections."""
    h, path = await nursery.start(
        lambda **kw: server.serve(_config(tmp_path), socket_dir / "f.sock", limits=FAST, **kw)
    )
    return Daemon(h, path, Client(path), tmp_path)


def _post(path: str, body: bytes, method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: h\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _get(path: str, *headers: str) -> bytes:
    extra = "".join(f"{line}\r\n" for line in headers)
    return f"GET {path} HTTP/1.1\r\nhost: h\r\n{extra}\r\n".encode()


# --- item 7: empty replies instead of errors ---------------------------------------------


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (_post("/v1/sessions", b"[" * 100_000 + b"]" * 100_000), 400, "malformed_json"),
        (_post("/v1/sessions", b'{"a":' * 50_000 + b"1" + b"}" * 50_000), 400, "malformed_json"),
        (_get("/v1/events", "last-event-id: \xc2\xb2"), 400, "bad_after"),  # "²" in UTF-8
        (_get("/v1/events", "last-event-id: " + "9" * 5000), 400, "bad_after"),
        (_get("/v1/events?after=" + "9" * 5000), 422, "invalid_query"),
        (_get("/v1/events?after=" + "9" * 30), 400, "bad_after"),
        (_post("/v1/sessions", b'{"title": "\\ud800"}'), 422, "invalid_body"),
        (_post("/v1/sessions", b'{"directory": "/tmp/\\udfff"}'), 422, "invalid_body"),
        (_post("/v1/sessions", b'{"\\ud800": 1}'), 422, "invalid_body"),
        (_post("/v1/sessions", json.dumps({"directory": "/" + "d" * 10_000}).encode()), 422,
         "invalid_body"),
        (_post("/v1/sessions", json.dumps({"directory": "/tmp/a\x00b"}).encode()), 422,
         "invalid_body"),
    ],
)
async def test_malformed_input_gets_a_json_error_not_a_closed_connection(
    daemon: Daemon, payload: bytes, status: int, code: str
) -> None:
    answer_status, body = await raw(daemon.path, payload)
    assert answer_status == status, body
    assert body["error"]["code"] == code and body["error"]["message"]
    assert (await daemon.call("health"))["ok"] is True


async def test_a_head_request_gets_headers_and_no_body(daemon: Daemon) -> None:
    # h11 refuses to send a body after a HEAD: the connection used to close unanswered.
    async with await trio.open_unix_socket(str(daemon.path)) as stream:
        await stream.send_all(b"HEAD /v1/health HTTP/1.1\r\nhost: h\r\n\r\n" + _get("/v1/health"))
        data = b""
        with trio.fail_after(5):
            while b'"ok":true' not in data:
                data += await stream.receive_some(65536)
    assert data.startswith(b"HTTP/1.1 405 ")
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"content-length:" in head and rest.startswith(b"HTTP/1.1 200 "), "no body, kept alive"


async def test_a_long_directory_component_is_refused_by_the_harness_too(daemon: Daemon) -> None:
    # Under PATH_MAX but one component over NAME_MAX: the kernel's ENAMETOOLONG.
    status, body = await raw(
        daemon.path, _post("/v1/sessions", json.dumps({"directory": "/" + "n" * 300}).encode())
    )
    assert (status, body["error"]["code"]) == (422, "invalid_session")
    assert "File name too long" in body["error"]["message"]


async def test_an_unforeseen_error_is_a_500_with_the_json_body(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("a bug nobody foresaw")

    monkeypatch.setattr(daemon.h, "sessions", broken)
    status, body = await raw(daemon.path, _get("/v1/sessions"))
    assert status == 500
    assert body == {"error": {"code": "internal", "message": body["error"]["message"]}}
    monkeypatch.undo()
    assert (await daemon.call("health"))["ok"] is True


# --- item 9: a prompt silently dropped ----------------------------------------------------


async def test_a_message_id_is_idempotent_only_in_its_session_with_its_text(
    daemon: Daemon,
) -> None:
    first = await daemon.session([{"text": "one"}, {"text": "two"}])
    second = await daemon.session([{"text": "other"}])
    async with sse(daemon.path, f"?session={first}") as events:
        assert await daemon.call("prompt", first, "hi", message_id="msg_c1") == "msg_c1"
        await until_finished(events)
    # Same session, same body, after the turn took it: still the same answer.
    assert await daemon.call("prompt", first, "hi", message_id="msg_c1") == "msg_c1"
    with pytest.raises(ApiError) as elsewhere:
        await daemon.call("prompt", second, "hi", message_id="msg_c1")
    assert elsewhere.value.status == 409 and elsewhere.value.code == "message_id_conflict"
    assert first in elsewhere.value.message
    with pytest.raises(ApiError) as other_text:
        await daemon.call("prompt", first, "something else", message_id="msg_c1")
    assert other_text.value.status == 409 and "another text" in other_text.value.message
    assistant = next(
        m["info"]["id"]
        for m in await daemon.call("messages", first)
        if m["info"]["role"] == "assistant"
    )
    with pytest.raises(ApiError) as taken:
        await daemon.call("prompt", second, "hi", message_id=assistant)
    assert taken.value.status == 409
    assert await daemon.call("messages", second) == [], "nothing queued in B"
    assert daemon.h.ledger.inbox(second) == []


async def test_a_queued_message_id_conflicts_too(daemon: Daemon) -> None:
    busy = await daemon.session([{"text": "slow", "delay": 30}, {"text": "next"}])
    await daemon.call("prompt", busy, "first")
    await daemon.call("prompt", busy, "queued", message_id="msg_q1")  # waits in the inbox
    assert await daemon.call("prompt", busy, "queued", message_id="msg_q1") == "msg_q1"
    with pytest.raises(ApiError) as changed:
        await daemon.call("prompt", busy, "queued but different", message_id="msg_q1")
    assert changed.value.status == 409
    assert [item.text for item in daemon.h.ledger.inbox(busy)] == ["queued"]
    await daemon.call("cancel", busy)


# --- item 10: sizes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/sessions", {"title": "t" * (api.MAX_TITLE + 1)}),
        ("/v1/sessions", {"title": "t" * 9_000_000}),
        ("/v1/sessions", {"directory": "/" + "é" * (api.MAX_PATH_BYTES // 2)}),  # bytes count
        ("/v1/sessions", {"agent": "a" * (api.MAX_NAME + 1)}),
        ("/v1/sessions", {"model": "m" * (api.MAX_MODEL + 1)}),
        ("/v1/sessions", {"base_url": "http://" + "h" * api.MAX_URL}),
        ("/v1/sessions", {"permission": [{"permission": "bash", "action": "allow"}] * 257}),
        (
            "/v1/sessions",
            {"permission": [{"permission": "bash", "pattern": "p" * 5000, "action": "allow"}]},
        ),
        ("/v1/sessions/{id}/prompt", {"text": "x" * (api.MAX_PROMPT + 1)}),
        ("/v1/sessions/{id}/prompt", {"text": "x", "message_id": "m" * (api.MAX_ID + 1)}),
        ("/v1/sessions/{id}/prompt", {"text": "x", "message_id": "msg with spaces"}),
        ("/v1/sessions/{id}/prompt", {"text": "x", "max_steps": 0}),
        ("/v1/sessions/{id}", {"title": "t" * (api.MAX_TITLE + 1)}),
        ("/v1/permissions/per_x", {"reply": "reject", "message": "m" * (api.MAX_MESSAGE + 1)}),
        ("/v1/questions/que_x", {"answers": [["a" * (api.MAX_ANSWER + 1)]]}),
        ("/v1/questions/que_x", {"answers": [["a"]] * (api.MAX_ANSWERS + 1)}),
    ],
)
async def test_every_free_text_field_is_capped(
    daemon: Daemon, route: str, body: dict[str, Any]
) -> None:
    session_id = await daemon.session([{"text": "never"}])
    method = "PATCH" if route == "/v1/sessions/{id}" else "POST"
    payload = _post(route.replace("{id}", session_id), json.dumps(body).encode(), method)
    status, answer = await raw(daemon.path, payload)
    assert (status, answer["error"]["code"]) == (422, "invalid_body"), answer
    assert len(json.dumps(await daemon.call("sessions"))) < 10_000


async def test_fields_at_their_cap_are_accepted(daemon: Daemon) -> None:
    title = "t" * api.MAX_TITLE
    created = await daemon.call(
        "create_session", directory=str(daemon.tmp / "project"), title=title
    )
    assert created["title"] == title


# --- item 8: connections that never end ----------------------------------------------------


async def _closed_within(stream: trio.SocketStream, seconds: float) -> bytes:
    """Everything the daemon sends until it closes the connection (fails if it does not)."""
    data = b""
    with trio.fail_after(seconds):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return data
            if not chunk:
                return data
            data += chunk


async def test_a_slowloris_client_is_cut_off_with_a_408(fast_daemon: Daemon) -> None:
    async with await trio.open_unix_socket(str(fast_daemon.path)) as stream:
        head = b"GET /v1/health HTTP/1.1\r\nhost: h\r\nx-slow: " + b"a" * 100
        started = time.monotonic()

        async def drip() -> None:
            for byte in head:
                try:
                    await stream.send_all(bytes([byte]))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drip)
            answer = await _closed_within(stream, 5)
            nursery.cancel_scope.cancel()
    assert time.monotonic() - started < 2.0, "cut at the header timeout, not at the end"
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer
    assert (await fast_daemon.call("health"))["ok"] is True


async def test_a_slow_body_is_cut_off_too(fast_daemon: Daemon) -> None:
    async with await trio.open_unix_socket(str(fast_daemon.path)) as stream:
        await stream.send_all(_post("/v1/sessions", b"{" * 50)[:-49])  # 1 of 50 bytes
        answer = await _closed_within(stream, 5)
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_an_idle_connection_is_closed_after_the_idle_timeout(fast_daemon: Daemon) -> None:
    async with await trio.open_unix_socket(str(fast_daemon.path)) as silent:
        assert await _closed_within(silent, 3) == b""
    async with await trio.open_unix_socket(str(fast_daemon.path)) as kept:
        await kept.send_all(_get("/v1/health"))
        started = time.monotonic()
        answer = await _closed_within(kept, 3)  # the answer, then the idle close
        assert answer.startswith(b"HTTP/1.1 200 ") and b'"ok":true' in answer
        assert 0.3 < time.monotonic() - started < 2.5


async def test_an_event_stream_with_heartbeats_is_not_idle(
    fast_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "HEARTBEAT", 0.1)
    async with await trio.open_unix_socket(str(fast_daemon.path)) as stream:
        await stream.send_all(_get("/v1/events"))
        data = b""
        with trio.move_on_after(FAST.idle_timeout * 3):
            while True:
                chunk = await stream.receive_some(65536)
                assert chunk, "the stream was closed while heartbeats flowed"
                data += chunk
    assert data.count(b": heartbeat") >= 5


async def test_past_the_cap_a_connection_gets_a_503_and_the_rest_are_served(
    tmp_path: Path, project: Path, socket_dir: Path
) -> None:
    limits = server.Limits(idle_timeout=30, max_connections=3)
    async with trio.open_nursery() as nursery:
        _, path = await nursery.start(
            lambda **kw: server.serve(_config(tmp_path), socket_dir / "c.sock", limits=limits, **kw)
        )
        held = [await trio.open_unix_socket(str(path)) for _ in range(3)]
        await trio.sleep(0.1)  # all three accepted and counted
        async with await trio.open_unix_socket(str(path)) as extra:
            await extra.send_all(_get("/v1/health"))
            answer = await _closed_within(extra, 3)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b'"code":"too_many_connections"' in answer
        await held[0].aclose()
        await trio.sleep(0.1)
        status, body = await raw(path, _get("/v1/health"))
        assert status == 200 and body["ok"] is True
        for stream in held[1:]:
            await stream.aclose()
        nursery.cancel_scope.cancel()


def test_the_default_cap_leaves_descriptors_for_the_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    assert server.Limits().connection_cap() == 256
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1_048_576, 1_048_576))
    assert server.Limits().connection_cap() == 512


def test_a_session_bash_runs_while_the_daemon_is_at_its_cap(
    tmp_path: Path, project: Path, socket_dir: Path
) -> None:
    """A real ``harness serve`` with 256 descriptors and 400 clients holding connections:
    the cap (64) keeps enough free for a turn's bash and its pipes."""
    import subprocess
    import sys

    import test_client

    env = dict(__import__("os").environ)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(socket_dir / "s.sock")
    script = tmp_path / "s.json"
    command = "sleep 2; ls /proc/self/fd > fds.txt; echo ran > ran.txt"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
                    {"text": "done"}])
    )
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c",
             "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256));"
             "from harness.cli import main; sys.argv[1:] = ['serve']; main()"],
            stderr=out, env=env,
        )
    clients: list[socket.socket] = []
    try:
        client = wait_for_daemon(process, socket_dir / "s.sock", log)
        session = client.create_session(
            directory=str(project),
            model=f"scripted:{script}",
            # `> fds.txt` is a write: edit as well as bash.
            permission=[
                {"permission": name, "pattern": "*", "action": "allow"} for name in ("bash", "edit")
            ],
        )
        after = client.health()["last_seq"]
        client.prompt(session["id"], "run it")
        refused = 0
        for _ in range(400):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(socket_dir / "s.sock"))
            clients.append(sock)
        for sock in clients:
            sock.setblocking(False)
        waiting = list(clients)
        deadline = time.monotonic() + 10
        while waiting and refused < 400 - 64 and time.monotonic() < deadline:
            time.sleep(0.05)
            for sock in list(waiting):
                with contextlib.suppress(BlockingIOError):
                    refused += sock.recv(64).startswith(b"HTTP/1.1 503")
                    waiting.remove(sock)
        assert refused >= 400 - 64, f"only {refused} connections were refused"
        deadline = time.monotonic() + 15
        while not (project / "ran.txt").exists():
            assert time.monotonic() < deadline, "the bash call never ran"
            time.sleep(0.1)
        for sock in clients:
            sock.close()
        clients.clear()
        events = client.events(session["id"], after=after)
        finished = next(e for e in events if e.type == "turn.finished")
        events.close()
        assert finished.data["reason"] == "answered"
        tool = next(
            p for m in client.messages(session["id"]) for p in m["parts"] if p["type"] == "tool"
        )
        assert tool["state"]["status"] == "completed", tool["state"]
        assert "Too many open files" not in log.read_text()
    finally:
        for sock in clients:
            sock.close()
        test_client.stop(process)


async def test_patch_adds_rules_and_changes_title_and_base_url(daemon: Daemon) -> None:
    session_id = await daemon.session([{"text": "slow", "delay": 30}], permission=[
        {"permission": "edit", "pattern": "*", "action": "deny"}
    ])
    rule = {"permission": "bash", "pattern": "git *", "action": "allow"}
    body = {"permission": [rule], "title": "renamed", "base_url": "http://127.0.0.1:9"}
    updated = await daemon.call("request", "PATCH", f"/v1/sessions/{session_id}", body)
    assert updated["title"] == "renamed" and updated["base_url"] == "http://127.0.0.1:9"
    assert updated["permission"] == [
        {"permission": "edit", "pattern": "*", "action": "deny"},
        rule,
    ], "added after the session's own rules"
    assert await daemon.call("session", session_id) == updated
    await daemon.call("prompt", session_id, "wait")
    with pytest.raises(ApiError) as busy:
        await daemon.call("request", "PATCH", f"/v1/sessions/{session_id}", {"title": "x"})
    assert (busy.value.status, busy.value.code) == (409, "session_busy")
    with pytest.raises(ApiError) as unknown:
        await daemon.call("request", "PATCH", f"/v1/sessions/{session_id}", {"model": "x"})
    assert unknown.value.status == 422
    with pytest.raises(ApiError) as missing:
        await daemon.call("request", "PATCH", "/v1/sessions/ses_nope", {"title": "x"})
    assert missing.value.status == 404
    await daemon.call("cancel", session_id)

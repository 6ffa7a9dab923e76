"""The daemon in-process: a real ``serve`` on a temp socket inside the test's Trio loop.

Requests go over the socket, through the standard-library client (in a thread) or raw
bytes; events are read as Server-Sent Events with a small h11 reader.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from harness import server
from harness.actors import collector
from harness.client import ApiError, Client, EventStream
from harness.config import Config
from harness.runtime import Harness


@dataclass
class Daemon:
    h: Harness
    path: Path
    client: Client
    tmp: Path

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.client, name)
        return await trio.to_thread.run_sync(partial(method, *args, **kwargs))

    def script(self, turns: list[dict[str, Any]]) -> str:
        path = self.tmp / f"script-{len(list(self.tmp.glob('script-*')))}.json"
        path.write_text(json.dumps(turns))
        return f"scripted:{path}"

    async def session(self, turns: list[dict[str, Any]], **body: Any) -> str:
        created = await self.call(
            "create_session", directory=str(self.tmp / "project"), model=self.script(turns), **body
        )
        return str(created["id"])


def _config(tmp_path: Path) -> Config:
    return Config(home=tmp_path / "home", log_file=tmp_path / "daemon.jsonl")


@pytest.fixture
async def daemon(tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery) -> Daemon:
    h, path = await nursery.start(server.serve, _config(tmp_path), socket_dir / "d.sock")
    return Daemon(h, path, Client(path), tmp_path)


# --- a small SSE reader and raw requests -------------------------------------------------


@asynccontextmanager
async def sse(
    path: Path, query: str = "", headers: dict[str, str] | None = None
) -> AsyncIterator[AsyncIterator[tuple[int | None, dict[str, Any]]]]:
    """Open ``GET /v1/events?query``; yields an iterator of (id, event) once subscribed."""
    stream = await trio.open_unix_socket(str(path))
    conn = h11.Connection(h11.CLIENT)
    head = [("host", "h"), *(headers or {}).items()]
    await stream.send_all(
        conn.send(h11.Request(method="GET", target=f"/v1/events{query}", headers=head))
    )
    await stream.send_all(conn.send(h11.EndOfMessage()))
    buffer = b""

    async def next_h11() -> Any:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            return event

    response = await next_h11()
    assert isinstance(response, h11.Response) and response.status_code == 200, response

    async def frames() -> AsyncIterator[tuple[int | None, dict[str, Any]]]:
        nonlocal buffer
        while True:
            while b"\n\n" not in buffer:
                event = await next_h11()
                if not isinstance(event, h11.Data):
                    return
                buffer += bytes(event.data)
            frame, buffer = buffer.split(b"\n\n", 1)
            seq: int | None = None
            data = None
            for line in frame.decode().splitlines():
                if line.startswith("id: "):
                    seq = int(line[4:])
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
            if data is not None:
                yield seq, data

    async with stream:
        yield frames()


async def raw(path: Path, payload: bytes, *, close_write: bool = False) -> tuple[int, Any]:
    """Send raw bytes; the status and the JSON body of the answer."""
    async with await trio.open_unix_socket(str(path)) as stream:
        await stream.send_all(payload)
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("host", "h")]))  # sync states
        data = b""
        with trio.fail_after(5):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(line.split(b":")[1])
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        ),
                        None,
                    )
                    if length is not None and len(body) >= length:
                        break
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        return status, json.loads(body) if body else None


async def until_finished(
    events: AsyncIterator[tuple[int | None, dict[str, Any]]], count: int = 1
) -> list[tuple[int | None, dict[str, Any]]]:
    seen: list[tuple[int | None, dict[str, Any]]] = []
    finished = 0
    with trio.fail_after(10):
        async for seq, event in events:
            seen.append((seq, event))
            if event["type"] == "turn.finished":
                finished += 1
                if finished == count:
                    return seen
    raise AssertionError(f"the stream ended early: {[e['type'] for _, e in seen]}")


# --- the tests ---------------------------------------------------------------------------


async def test_socket_is_private(daemon: Daemon) -> None:
    assert stat.S_IMODE(daemon.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.path.parent.stat().st_mode) == 0o700
    assert (await daemon.call("health"))["ok"] is True


async def test_create_and_prompt_over_the_socket(daemon: Daemon) -> None:
    session_id = await daemon.session(
        [
            {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
            {"text": "two lines"},
        ]
    )
    async with sse(daemon.path, f"?session={session_id}") as events:
        message_id = await daemon.call("prompt", session_id, "read notes")
        seen = await until_finished(events)
    ids = [seq for seq, _ in seen if seq is not None]
    assert ids == sorted(set(ids)), "ids strictly increase"
    assert all(event["session_id"] == session_id for _, event in seen)
    assert all(seq == event["seq"] for seq, event in seen)
    finished = seen[-1][1]["data"]
    assert finished == {
        **finished,
        "message_id": message_id,
        "reason": "answered",
        "answer": "two lines",
    }
    messages = await daemon.call("messages", session_id)
    assert [m["info"]["role"] for m in messages] == ["user", "assistant", "assistant"]
    tool = next(p for m in messages for p in m["parts"] if p["type"] == "tool")
    assert tool["state"]["status"] == "completed"
    session = await daemon.call("session", session_id)
    assert session["status"] == "idle" and session["title"] == "read notes"
    assert any(s["id"] == session_id for s in await daemon.call("sessions"))


async def test_prompt_is_idempotent_on_message_id(daemon: Daemon) -> None:
    session_id = await daemon.session([{"text": "once"}, {"text": "twice"}])
    async with sse(daemon.path, f"?session={session_id}") as events:
        first = await daemon.call("prompt", session_id, "hi", message_id="msg_client_1")
        again = await daemon.call("prompt", session_id, "hi", message_id="msg_client_1")
        await until_finished(events)
    assert first == again == "msg_client_1"
    messages = await daemon.call("messages", session_id)
    assert [m["info"]["role"] for m in messages] == ["user", "assistant"]


async def test_resume_with_last_event_id_neither_repeats_nor_skips(daemon: Daemon) -> None:
    slow = {"text": "slowly streamed answer", "chunks": 6, "chunk_delay": 0.02}
    session_id = await daemon.session([slow, slow])
    start = (await daemon.call("health"))["last_seq"]
    async with sse(daemon.path, f"?session={session_id}&after={start}") as events:
        await daemon.call("prompt", session_id, "one")
        everything = [seq for seq, _ in await until_finished(events) if seq is not None]
    # Resume from the middle of that turn while a second turn runs: the replay and the
    # live events join without a gap or a duplicate.
    middle = everything[len(everything) // 2]
    async with sse(daemon.path, f"?session={session_id}", {"last-event-id": str(middle)}) as events:
        await daemon.call("prompt", session_id, "two")
        resumed = [seq for seq, _ in await until_finished(events, count=2) if seq is not None]
    stored = [e.seq for e in daemon.h.ledger.events_after(middle, session_ids=[session_id])]
    assert resumed == [seq for seq in stored if seq is not None and seq <= resumed[-1]]
    assert (
        resumed[: len(everything) - everything.index(middle) - 1]
        == everything[everything.index(middle) + 1 :]
    )


async def test_a_subscriber_that_never_reads_is_cut_off(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "SUBSCRIBER_BUFFER", 64)
    # Many durable events quickly: 80 reads in one step (live deltas are coalesced, so a
    # long text alone would not make enough events).
    reads = [
        {"name": "read", "arguments": {"path": "notes.txt", "offset": i + 1}} for i in range(80)
    ]
    session_id = await daemon.session([{"tool_calls": reads}, {"text": "done"}])
    stalled = await trio.open_unix_socket(str(daemon.path))
    stalled.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await stalled.send_all(b"GET /v1/events HTTP/1.1\r\nhost: h\r\n\r\n")
    await trio.sleep(0.05)
    await daemon.call("prompt", session_id, "stream a lot")
    with trio.fail_after(10):  # the session finishes: nobody waits for the stalled reader
        while not [e for e in daemon.h.ledger.events_after(0) if e.type == "turn.finished"]:
            await trio.sleep(0.02)
    data = b""
    with trio.fail_after(10):
        while b"feed.overflow" not in data:
            chunk = await stalled.receive_some(1 << 20)
            assert chunk, "the stream ended without a feed.overflow event"
            data += chunk
    tail = data[data.rindex(b"data: ") :].split(b"\n")[0]
    overflow = json.loads(tail[6:])
    assert overflow["type"] == "feed.overflow"
    assert isinstance(overflow["data"]["last_seq"], int)
    await stalled.aclose()


async def test_steer_and_queue_are_delivered_in_order(daemon: Daemon) -> None:
    read = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}], "delay": 0.3}
    session_id = await daemon.session([read, {"text": "first done"}, {"text": "queued done"}])
    async with sse(daemon.path, f"?session={session_id}") as events:
        first = await daemon.call("prompt", session_id, "first")
        await trio.sleep(0.1)  # the first turn is now waiting on its slow model step
        queued = await daemon.call("prompt", session_id, "afterwards", delivery="queue")
        steered = await daemon.call("prompt", session_id, "also this", delivery="steer")
        seen = await until_finished(events, count=2)
    finished = [e["data"] for _, e in seen if e["type"] == "turn.finished"]
    assert [f["message_id"] for f in finished] == [first, queued]
    users = [
        m["info"]["id"]
        for m in await daemon.call("messages", session_id)
        if m["info"]["role"] == "user"
    ]
    assert users == [first, steered, queued]


async def test_a_pending_permission_is_listed_and_answered(daemon: Daemon) -> None:
    bash = {"tool_calls": [{"name": "bash", "arguments": {"command": "touch made-it"}}]}
    session_id = await daemon.session([bash, {"text": "done"}])
    async with sse(daemon.path, f"?session={session_id}") as events:
        await daemon.call("prompt", session_id, "touch it")
        with trio.fail_after(10):
            async for _, event in events:
                if event["type"] == "permission.asked":
                    break
        pending = await daemon.call("permissions", session_id)
        assert [p["permission"] for p in pending] == ["bash"]
        assert pending == await daemon.call("permissions")
        await daemon.call("reply_permission", pending[0]["id"], "once")
        seen = await until_finished(events)
    assert seen[-1][1]["data"]["reason"] == "answered"
    assert (daemon.tmp / "project" / "made-it").exists()
    assert await daemon.call("permissions") == []
    with pytest.raises(ApiError) as missing:
        await daemon.call("reply_permission", pending[0]["id"], "once")
    assert missing.value.status == 404


async def test_cancel_and_delete(daemon: Daemon) -> None:
    session_id = await daemon.session([{"text": "never", "delay": 30}])
    assert await daemon.call("cancel", session_id) is False
    async with sse(daemon.path, f"?session={session_id}") as events:
        await daemon.call("prompt", session_id, "wait")
        await trio.sleep(0.1)
        assert await daemon.call("cancel", session_id) is True
        seen = await until_finished(events)
    assert seen[-1][1]["data"]["reason"] == "cancelled"
    await daemon.call("prompt", session_id, "wait again")
    await trio.sleep(0.1)
    await daemon.call("delete", session_id)
    with pytest.raises(ApiError) as gone:
        await daemon.call("session", session_id)
    assert gone.value.status == 404
    await trio.sleep(0.1)  # a late write of the cancelled turn must not bring it back
    assert daemon.h.ledger.session(session_id) is None


def _post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nhost: h\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (
            b"POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\n\r\n{bad}",
            400,
            "malformed_json",
        ),
        (
            b"POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n[]",
            422,
            "invalid_body",
        ),
        (
            b'POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 15\r\n\r\n{"directory":5}',
            422,
            "invalid_body",
        ),
        (
            _post("/v1/sessions", b'{"directory":"/x"}'),
            422,
            "invalid_session",
        ),
        (
            b'POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 10\r\n\r\n{"oops":1}',
            422,
            "invalid_body",
        ),
        (b"GET /v1/nothing HTTP/1.1\r\nhost: h\r\n\r\n", 404, "not_found"),
        (b"PUT /v1/sessions HTTP/1.1\r\nhost: h\r\n\r\n", 405, "method_not_allowed"),
        (b"GET /v1/sessions/ses_nope HTTP/1.1\r\nhost: h\r\n\r\n", 404, "not_found"),
        (b"GET /v1/events?after=x HTTP/1.1\r\nhost: h\r\n\r\n", 400, "bad_after"),
        (b"GET /v1/events?session=ses_nope HTTP/1.1\r\nhost: h\r\n\r\n", 404, "not_found"),
        (
            _post("/v1/permissions/per_x", b'{"reply":"nope"}'),
            422,
            "invalid_body",
        ),
        (
            b"POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 20000000\r\n\r\n{",
            413,
            "body_too_large",
        ),
        (b"NONSENSE\r\n\r\n", 400, "bad_request"),
    ],
)
async def test_bad_input_is_a_json_4xx_and_the_daemon_keeps_serving(
    daemon: Daemon, payload: bytes, status: int, code: str
) -> None:
    answer_status, body = await raw(daemon.path, payload)
    assert answer_status == status, body
    assert body["error"]["code"] == code and body["error"]["message"]
    assert (await daemon.call("health"))["ok"] is True


async def test_a_real_oversized_body_and_a_client_that_leaves_mid_request(daemon: Daemon) -> None:
    big = b"x" * (server.MAX_BODY + 1)
    with pytest.raises(ApiError) as too_big:
        await daemon.call("request", "POST", "/v1/sessions", big.decode())
    assert too_big.value.status == 413
    async with await trio.open_unix_socket(str(daemon.path)) as stream:
        await stream.send_all(
            b"POST /v1/sessions HTTP/1.1\r\nhost: h\r\ncontent-length: 100\r\n\r\n{"
        )
    async with await trio.open_unix_socket(str(daemon.path)) as stream:
        await stream.send_all(b"GET /v1/events HTTP/1.1\r\nhost: h\r\n\r\n")
        await stream.receive_some(1024)  # the headers: subscribed; now leave mid-stream
    assert (await daemon.call("health"))["ok"] is True


async def test_keep_alive_serves_several_requests_on_one_connection(daemon: Daemon) -> None:
    request = b"GET /v1/health HTTP/1.1\r\nhost: h\r\n\r\n"
    async with await trio.open_unix_socket(str(daemon.path)) as stream:
        await stream.send_all(request * 3)
        data = b""
        with trio.fail_after(5):
            while data.count(b'"ok":true') < 3:
                data += await stream.receive_some(65536)


async def test_a_second_daemon_is_refused_and_a_stale_socket_replaced(
    tmp_path: Path, socket_dir: Path, daemon: Daemon
) -> None:
    with pytest.raises(server.DaemonRunning, match="already listening"):
        await server.open_listener(daemon.path)
    stale = socket_dir / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()  # a socket file nobody listens on: a daemon that died
    listener = await server.open_listener(stale)
    assert stat.S_ISSOCK(stale.stat().st_mode)
    await listener.aclose()


async def test_the_event_stream_client_reconnects_across_a_daemon_restart(
    tmp_path: Path, project: Path, socket_dir: Path
) -> None:
    path = socket_dir / "r.sock"
    config = _config(tmp_path)
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    seen: list[tuple[int | None, str]] = []

    def follow(stream: EventStream) -> None:
        for event in stream:
            seen.append((event.seq, event.type))
            if event.type == "turn.finished" and event.data["answer"] == "two":
                return

    async with trio.open_nursery() as outer:
        with trio.CancelScope() as first_life:
            async with trio.open_nursery() as life:
                h, _ = await life.start(server.serve, config, path)
                session = await h.create_session(project, model=f"scripted:{script}")
                stream = EventStream(path, session_id=session.id, after=0, reconnect_for=10)
                await trio.to_thread.run_sync(stream.open)
                outer.start_soon(partial(trio.to_thread.run_sync, follow, stream))
                await h.prompt(session.id, "first")
                with trio.fail_after(5):
                    while not any(kind == "turn.finished" for _, kind in seen):
                        await trio.sleep(0.02)
                first_life.cancel()
        assert not path.exists(), "the socket is removed on exit"
        async with trio.open_nursery() as life:
            h, _ = await life.start(server.serve, config, path)
            await h.prompt(session.id, "second")
            with trio.fail_after(10):
                while sum(kind == "turn.finished" for _, kind in seen) < 2:
                    await trio.sleep(0.02)
            life.cancel_scope.cancel()
    durable = [seq for seq, _ in seen if seq is not None]
    assert durable == sorted(set(durable))
    assert stream.reconnects >= 1
    stored = [e.seq for e in _stored(config, session.id)]
    assert durable == [seq for seq in stored if seq <= durable[-1]]


def _stored(config: Config, session_id: str) -> list[Any]:
    from harness.storage.ledger import Ledger

    ledger = Ledger(config.ledger_path)
    try:
        return ledger.events_after(0, session_ids=[session_id], limit=10_000)
    finally:
        ledger.close()


def test_socket_path_falls_back_to_the_runtime_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from harness.config import SocketPathError, usable_socket_path

    long = tmp_path / ("x" * 120) / "harness.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert usable_socket_path(long) == Path(f"/run/user/1000/harness-{os.getuid()}.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    with pytest.raises(SocketPathError, match="HARNESS_SOCKET"):
        usable_socket_path(long)


@pytest.mark.parametrize(
    ("heartbeat", "silence", "reconnects"), [(5.0, 0.2, True), (0.05, 0.5, False)]
)
async def test_silence_means_reconnect_and_heartbeats_mean_life(
    daemon: Daemon,
    monkeypatch: pytest.MonkeyPatch,
    heartbeat: float,
    silence: float,
    reconnects: bool,
) -> None:
    monkeypatch.setattr(server, "HEARTBEAT", heartbeat)
    session_id = await daemon.session([{"text": "hello"}])
    after = daemon.h.ledger.last_seq()
    stream = EventStream(daemon.path, session_id=session_id, after=after, silence=silence)
    await trio.to_thread.run_sync(stream.open)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.to_thread.run_sync, lambda: got.append(next(iter(stream)))))
        await trio.sleep(1.0)  # nothing happens in the session for a while
        await daemon.call("prompt", session_id, "hi")
    stream.close()
    assert (got[0].seq, got[0].type) == (after + 1, "inbox.added"), "nothing lost or repeated"
    assert (stream.reconnects > 0) is reconnects


async def test_a_json_answer_goes_in_one_write(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head, body and end of an answer in one ``send_all``: the end went in a second,
    empty one, a checkpoint (a scheduler round on a busy daemon) per request (issue 18)."""
    session = await daemon.session([{"text": "hi"}])
    sends: list[bytes] = []
    send_all = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: Any) -> None:
        sends.append(bytes(data))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    await daemon.call("prompt", session, "go")
    assert len(sends) == 1 and sends[0].startswith(b"HTTP/1.1 202"), sends
    assert sends[0].endswith(b"}")


async def test_a_serving_daemon_collects_young_garbage_less_often(daemon: Daemon) -> None:
    """At Python's default (700 allocations) the collector ran ~250 times in 1,000
    one-step turns, 11% of the event loop's CPU (issue 18); the daemon raises it while it
    serves, and puts it back when it stops."""
    import gc

    assert gc.get_threshold()[0] >= collector.YOUNG_THRESHOLD


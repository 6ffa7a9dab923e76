"""One limiter per provider, shared by every session of a harness (issue 15 item 7).

Real sessions of one embedded harness against a local OpenAI-compatible wire server that
records when each request arrives and how many are in flight: a 429 with ``Retry-After``
seen by one session holds every session back, ``max_concurrent`` and
``requests_per_minute`` hold, and the limits are read from ``[providers.NAME]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from wire_server import Received, Reply, WireServer, chunk, wire_server

import harness
from harness.config import Config
from harness.messages.events import Event
from harness.providers.limiter import ProviderLimits
from harness.runtime import Harness, open_harness

USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def answer(text: str = "ok", delay: float = 0.0) -> Reply:
    return Reply(events=[chunk(text), chunk(finish="stop", usage=USAGE)], delay=delay)


def rate_limited_server(window: float) -> tuple[Callable[[Received], Reply], list[float]]:
    """A server that answers 429 ``Retry-After: window`` from its first request on, for
    ``window`` seconds (every request in that time is refused), then answers."""
    first: list[float] = []

    def respond(request: Received) -> Reply:
        now = trio.current_time()
        if not first:
            first.append(now)
        if now < first[0] + window:
            return Reply(
                status=429,
                headers=[("retry-after", f"{window:g}")],
                body={"error": {"message": "rate limited"}},
            )
        return answer()

    return respond, first


def _config(tmp_path: Path, server: WireServer, **values: Any) -> Config:
    settings: dict[str, Any] = {
        "home": tmp_path / "home",
        "model": "openai/m",
        "base_url": server.url,
        "interactive": False,
        "retry_initial_delay": 0.05,
        "log_file": tmp_path / "home" / "logs" / "test.jsonl",
    }
    settings.update(values)
    return Config(**settings)


async def _wait_status(h: Harness, session_id: str, status: str) -> None:
    with trio.fail_after(10):
        while h.session(session_id).status != status:
            await trio.sleep(0.005)


async def test_a_429_seen_by_one_session_holds_back_all_twenty(
    tmp_path: Path, project: Path
) -> None:
    respond, first = rate_limited_server(2.0)
    async with (
        wire_server(responder=respond) as server,
        open_harness(_config(tmp_path, server)) as h,
    ):
        sessions = [await h.create_session(project) for _ in range(20)]
        results: dict[str, str] = {}
        retries: list[Event] = []

        async def run(session_id: str) -> None:
            results[session_id] = (await h.run(session_id, "hi")).reason

        async def watch(events: trio.MemoryReceiveChannel[Event]) -> None:
            async for event in events:
                if event.type == "session.retry":
                    retries.append(event)

        async with h.subscribe() as events, trio.open_nursery() as nursery:
            nursery.start_soon(watch, events)
            nursery.start_soon(run, sessions[0].id)
            # The first session has its 429 and waits: now the other nineteen ask.
            await _wait_status(h, sessions[0].id, "retry")
            for session in sessions[1:]:
                nursery.start_soon(run, session.id)
            with trio.fail_after(20):
                while len(results) < 20:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert set(results.values()) == {"answered"}
    [t429] = first
    later = server.arrivals[1:]
    # Nothing reached the server while the hold lasted: one 429, then twenty answers.
    assert len(server.arrivals) == 21, [round(a - t429, 3) for a in server.arrivals]
    assert min(later) >= t429 + 2.0 - 1e-3, [round(a - t429, 3) for a in later]
    # Each waiting session showed the shared reason, with the wait's end.
    shared = [e for e in retries if e.data.get("shared")]
    assert {e.session_id for e in shared} == {s.id for s in sessions[1:]}
    assert all("429" in e.data["error"] for e in shared)
    assert all("every session waits" in e.data["error"] for e in shared)
    own = [e for e in retries if not e.data.get("shared")]
    assert [e.session_id for e in own] == [sessions[0].id]


async def test_a_hold_is_per_server_not_per_provider_name(tmp_path: Path, project: Path) -> None:
    respond, first = rate_limited_server(2.0)
    async with (
        wire_server(responder=respond) as limited,
        wire_server(answer("from the other server")) as other,
        open_harness(_config(tmp_path, limited)) as h,
    ):
        held = await h.create_session(project)
        free = await h.create_session(project, base_url=other.url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.run, held.id, "hi")
            await _wait_status(h, held.id, "retry")
            started = trio.current_time()
            result = await h.run(free.id, "hi")
            took = trio.current_time() - started
            nursery.cancel_scope.cancel()
    assert (result.reason, result.answer) == ("answered", "from the other server")
    assert took < 1.0 and first


async def test_max_concurrent_from_a_named_provider_in_the_config_file(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "xdg" / "harness" / "config.toml"
    config_file.parent.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    async with wire_server(responder=lambda request: answer(delay=0.3)) as server:
        config_file.write_text(
            'model = "lab/m"\n'
            f'[providers.lab]\nkind = "openai"\nbase_url = "{server.url}"\nmax_concurrent = 2\n'
        )
        config = harness.config_from_files(project, home=tmp_path / "home", interactive=False)
        assert config.provider_limits == {"lab": ProviderLimits(max_concurrent=2)}
        async with open_harness(config) as h:
            sessions = [await h.create_session(project) for _ in range(6)]
            reasons: list[str] = []

            async def run(session_id: str) -> None:
                reasons.append((await h.run(session_id, "hi")).reason)

            started = trio.current_time()
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    for session in sessions:
                        nursery.start_soon(run, session.id)
            took = trio.current_time() - started
    assert reasons == ["answered"] * 6
    assert server.max_in_flight == 2
    assert took >= 3 * 0.3 - 0.05  # three rounds of two


async def test_requests_per_minute_of_a_built_in_provider_paces_every_session(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "xdg" / "harness" / "config.toml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text("[providers.openai]\nrequests_per_minute = 300\n")  # 0.2 s apart
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    async with wire_server(responder=lambda request: answer()) as server:
        config = harness.config_from_files(
            project, home=tmp_path / "home", interactive=False, model="openai/m",
            base_url=server.url,
        )
        assert config.provider_limits == {"openai": ProviderLimits(requests_per_minute=300)}
        async with open_harness(config) as h:
            sessions = [await h.create_session(project) for _ in range(5)]
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    for session in sessions:
                        nursery.start_soon(h.run, session.id, "hi")
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:], strict=False)]
    assert len(server.arrivals) == 5
    # Measured where the requests arrive: a little transit jitter is allowed per gap.
    assert min(gaps) >= 0.2 - 0.05, gaps
    assert server.arrivals[-1] - server.arrivals[0] >= 4 * 0.2 - 0.02, gaps


def test_limits_in_the_config_file_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "xdg" / "harness" / "config.toml"
    config_file.parent.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cases = [
        ('[providers.openai]\nbase_url = "http://x"\n', "providers.openai.base_url: a built-in"),
        ("[providers.lab]\nmax_concurrent = 2\n", "providers.lab.kind: required"),
        ('[providers.lab]\nkind = "openai"\nmax_concurrent = 0\n', "max_concurrent"),
        ('[providers.lab]\nkind = "openai"\nrequests_per_minute = "x"\n', "requests_per_minute"),
        ("[providers.scripted]\nmax_concurrent = 1\n", "providers.scripted: the name is built in"),
    ]
    for text, message in cases:
        config_file.write_text(text)
        with pytest.raises(harness.ConfigFileError, match=message):
            harness.load_settings(tmp_path)
    config_file.write_text("[providers.mistral]\nmax_concurrent = 3\nrequests_per_minute = 60\n")
    settings = harness.load_settings(tmp_path)
    assert settings.sources["providers.mistral.max_concurrent"] == str(config_file.resolve())
    limits = harness.config_overrides(settings)["provider_limits"]
    assert limits == {"mistral": ProviderLimits(max_concurrent=3, requests_per_minute=60)}
    assert math.isclose(60 / limits["mistral"].requests_per_minute, 1.0)


async def test_the_daemon_shares_one_limiter_between_its_sessions(
    tmp_path: Path, project: Path, socket_dir: Path
) -> None:
    import os
    import sys

    from test_client import start_daemon, stop

    from harness.client import Client

    config_file = tmp_path / "xdg" / "harness" / "config.toml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text('model = "openai/m"\n[providers.openai]\nmax_concurrent = 1\n')
    async with wire_server(responder=lambda request: answer("served", delay=0.4)) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
        env.update(
            HARNESS_HOME=str(tmp_path / "home"),
            HARNESS_SOCKET=str(socket_dir / "h.sock"),
            HARNESS_BASE_URL=server.url,
            XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        )
        daemon = await trio.to_thread.run_sync(start_daemon, env, tmp_path / "daemon.log")
        try:
            done: list[Any] = []

            async def run() -> None:
                command = [sys.executable, "-m", "harness", "run", "--dir", str(project), "hi"]
                done.append(
                    await trio.run_process(
                        command, env=env, capture_stdout=True, capture_stderr=True, check=False
                    )
                )

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(run)
            sessions = Client(socket_dir / "h.sock").sessions()
        finally:
            assert await trio.to_thread.run_sync(stop, daemon) == 0
    assert [(p.returncode, p.stdout.decode().strip()) for p in done] == [(0, "served")] * 3, [
        p.stderr.decode() for p in done
    ]
    assert len(sessions) == 3, "all three ran in the daemon"
    assert len(server.arrivals) == 3
    assert server.max_in_flight == 1


def test_a_shared_wait_reads_as_one_on_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from harness.commands.display import Display

    display = Display("ses_x", json_mode=False)
    reason = "openai (http://x/v1): every session waits: openai: HTTP 429: slow down"
    now = time.time()
    shared_wait = {"attempt": 0, "next": now + 2.4, "error": reason, "shared": True}
    display.show(Event(None, now, "session.retry", "ses_x", shared_wait))
    own_retry = {"attempt": 1, "next": now + 2.4, "error": "x"}
    display.show(Event(None, now, "session.retry", "ses_x", own_retry))
    shared, own = capsys.readouterr().err.splitlines()
    assert shared == f"… waiting for the provider, next request in 2s: {reason}"
    assert own == "… provider error, retry 1 in 2s: x"


async def test_a_provider_without_limits_admits_without_queueing() -> None:
    # Nothing to wait for: the admission queue (a lock) is not even looked at, so an
    # unlimited provider's request costs no trip through the scheduler (issue 14).
    from harness.providers.limiter import ProviderLimiter

    async def hold(lock: trio.Lock, release: trio.Event, task_status: Any) -> None:
        async with lock:
            task_status.started()
            await release.wait()

    free = ProviderLimiter("free")
    paced = ProviderLimiter("paced", ProviderLimits(requests_per_minute=6000))
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        for limiter in (free, paced):  # another task holds each queue
            await nursery.start(hold, limiter._admission, release)
        with trio.fail_after(1):
            async with free.slot():
                assert free.in_flight == 1
        with trio.move_on_after(0.2) as waited:
            async with paced.slot():
                pass
        assert waited.cancelled_caught  # a paced provider still queues
        release.set()

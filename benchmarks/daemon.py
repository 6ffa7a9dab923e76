"""The daemon benchmark of issue 4: ack latency, SSE throughput, CLI start-up, 1,000 sessions.

Run from the repository root::

    python benchmarks/daemon.py            # everything (about a minute)
    python benchmarks/daemon.py --quick    # 200 sessions instead of 1,000
    python benchmarks/daemon.py --check    # exit 1 when a target is missed

Each part starts a real ``harness serve`` process on a fresh ``$HARNESS_HOME`` (its JSON
log goes to a file) and talks to it from this process over the Unix socket with the
standard-library client, as the CLI does. What each figure measures:

Prompt ack under load
    100 sessions stream a long scripted answer (200 deltas each, 10 ms apart: about
    10,000 events/s through the feed) while one subscriber follows every event. Meanwhile
    300 prompts are queued to those busy sessions, one at a time; each latency is the
    wall time of one ``POST /v1/sessions/{id}/prompt`` (a new connection, as the CLI makes)
    until its 202, which the daemon sends once the input is committed.

SSE events per second
    One session streams 20,000 deltas with no delay, faster than any stream can carry
    them; 1 or 10 subscribers read ``/v1/events`` (raw socket reads, counting frames).
    Rate = events delivered to all subscribers / the time from the first to the last
    delivered frame. A subscriber that falls 4,096 events behind is cut off (counted in
    ``cut_off``) while the session runs on at full speed: the design, measured.

CLI wall time
    Median of 10 whole processes: ``harness --help``; ``harness sessions`` against the live
    daemon (with the sessions of the run above in the ledger).

1,000 sessions at once
    1,000 sessions whose scripted model answers each call after 100 ms: three ``read``
    steps, then the answer (4 model calls per session). All prompts are posted at once
    from 32 threads. Total wall time: first prompt sent → the last ``turn.finished``.
    Per-step overhead: for each session, the gaps between consecutive ``step started``
    log lines (the runner logs it right before each provider request), minus the model's
    100 ms: what the harness spends between two model calls (commit, tool run, feed,
    history). Peak RSS is the daemon's VmHWM; RSS per live session is (VmRSS after the
    run, every session actor alive − VmRSS with the sessions created but no actor) / N.

Figures are written to ``benchmarks/results/daemon.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client import Client, EventStream  # noqa: E402  (after the path is set)

RESULTS = ROOT / "benchmarks" / "results" / "daemon.json"
TARGET_ACK_P99_MS = 10.0
TARGET_HELP_MS = 100.0
TARGET_SESSIONS_MS = 150.0
TARGET_STEP_OVERHEAD_P99_MS = 20.0
MODEL_LATENCY = 0.1
TARGET_IDLE_RSS_MB = 80.0
IDLE_WAIT_S = 15.0  # past the daemon's idle release of session actors (10 s)
IDLE_WAVE = 16


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Daemon:
    """A ``harness serve`` process on a fresh home, in a short temp directory."""

    def __init__(self, **env: str) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))
        self.home = self.base / "home"
        self.socket = self.base / "h.sock"
        self.log = self.base / "daemon.jsonl"
        self.project = self.base / "project"
        self.project.mkdir()
        for index in range(3):
            (self.project / f"f{index}.txt").write_text(f"file {index}\n" * 20)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
        self.env.update(HARNESS_HOME=str(self.home), HARNESS_SOCKET=str(self.socket), **env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve", "--log-file", str(self.log)],
            env=self.env,
            cwd=ROOT,
        )
        self.client = Client(self.socket)
        deadline = time.monotonic() + 20
        while not self.client.alive():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.02)

    def script(self, name: str, turns: list[dict[str, Any]]) -> str:
        path = self.base / f"{name}.json"
        path.write_text(json.dumps(turns))
        return f"scripted:{path}"

    def sessions(self, model: str, count: int) -> list[str]:
        with ThreadPoolExecutor(16) as pool:
            created = pool.map(
                lambda _: self.client.create_session(directory=str(self.project), model=model),
                range(count),
            )
            return [session["id"] for session in created]

    def memory(self, field: str) -> int:
        """VmRSS or VmHWM of the daemon, in kB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise LookupError(field)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        shutil.rmtree(self.base, ignore_errors=True)
        if code != 0:
            raise RuntimeError(f"the daemon exited with {code} on SIGTERM")


def wait_for_turns(stream: EventStream, count: int, timeout: float) -> float:
    """Follow until ``count`` turns finished; the time of the last one."""
    done = 0
    deadline = time.monotonic() + timeout
    for event in stream:
        if event.type == "turn.finished":
            done += 1
            if done >= count:
                return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {done} of {count} turns finished")
    raise RuntimeError("the stream ended")


# --- the parts ------------------------------------------------------------------------


def ack_under_load(sessions: int = 100, prompts: int = 300) -> dict[str, Any]:
    daemon = Daemon()
    try:
        stream_turn = {"text": "x" * 200, "chunks": 200, "chunk_delay": 0.01}
        model = daemon.script("stream", [stream_turn] + [{"text": "ok"}] * 10)
        ids = daemon.sessions(model, sessions)
        follower = daemon.client.events(after=daemon.client.health()["last_seq"])
        follower.open()
        seen = [0]

        def follow() -> None:
            for _ in follower:
                seen[0] += 1

        threading.Thread(target=follow, daemon=True).start()
        for session_id in ids:
            daemon.client.prompt(session_id, "stream")
        time.sleep(0.3)  # every session is streaming now
        latencies = []
        for index in range(prompts):
            started = time.perf_counter()
            daemon.client.prompt(ids[index % sessions], "and then this")
            latencies.append((time.perf_counter() - started) * 1000)
        during = seen[0]
        return {
            "sessions_streaming": sessions,
            "prompts": prompts,
            "ack_p50_ms": round(percentile(latencies, 0.5), 2),
            "ack_p99_ms": round(percentile(latencies, 0.99), 2),
            "ack_max_ms": round(max(latencies), 2),
            "events_seen_by_follower_meanwhile": during,
        }
    finally:
        daemon.stop()


def _count_frames(
    path: Path, query: str, expected: int, out: list[tuple[int, float, float]]
) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.sendall(f"GET /v1/events{query} HTTP/1.1\r\nhost: h\r\n\r\n".encode())
    sock.settimeout(20)
    count, first, last = 0, 0.0, 0.0
    tail = b""
    try:
        while count < expected:
            data = sock.recv(1 << 20)
            if not data:
                break
            now = time.perf_counter()
            frames = (tail + data).count(b"\ndata: ")
            tail = data[-8:]
            if frames and not first:
                first = now
            count += frames
            last = now
            if b"feed.overflow" in data or b'"turn.finished"' in data:
                break
    except TimeoutError:
        pass
    finally:
        sock.close()
    out.append((count, first, last))


def sse_rate(subscribers: int, calls: int = 600) -> dict[str, Any]:
    # Durable events as fast as the loop makes them: one step of many read calls (each a
    # handful of events). Live text deltas would not do: they are coalesced at the source.
    daemon = Daemon()
    deltas = calls * 8  # more than the frames the session can produce: read until the end
    try:
        reads = [
            {"name": "read", "arguments": {"path": "f0.txt", "offset": i % 20 + 1}}
            for i in range(calls)
        ]
        model = daemon.script("burst", [{"tool_calls": reads}, {"text": "done"}])
        (session_id,) = daemon.sessions(model, 1)
        results: list[tuple[int, float, float]] = []
        threads = [
            threading.Thread(
                target=_count_frames,
                args=(daemon.socket, f"?session={session_id}", deltas, results),
            )
            for _ in range(subscribers)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        daemon.client.prompt(session_id, "burst")
        for thread in threads:
            thread.join(timeout=60)
        delivered = sum(count for count, _, _ in results)
        span = max(last for _, _, last in results) - min(first for _, first, _ in results)
        log = daemon.log.read_text()
        return {
            "subscribers": subscribers,
            "events_delivered": delivered,
            "events_per_second": round(delivered / span) if span > 0 else None,
            "cut_off": log.count('"event stream cut off"'),
        }
    finally:
        daemon.stop()


def cli_wall_times() -> dict[str, Any]:
    daemon = Daemon()
    try:
        model = daemon.script("answer", [{"text": "hi"}])
        daemon.sessions(model, 100)

        def median_ms(*args: str) -> float:
            times = []
            for _ in range(10):
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "harness", *args],
                    env=daemon.env,
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
                times.append((time.perf_counter() - started) * 1000)
            return round(statistics.median(times), 1)

        return {
            "help_ms": median_ms("--help"),
            "sessions_ms_live_daemon_100_sessions": median_ms("sessions"),
        }
    finally:
        daemon.stop()


def _step_overheads(log: Path) -> list[float]:
    starts: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("event") == "step started" and "session_id" in entry:
            stamp = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
            starts.setdefault(entry["session_id"], []).append(stamp)
    gaps = []
    for stamps in starts.values():
        stamps.sort()
        gaps += [(b - a - MODEL_LATENCY) * 1000 for a, b in itertools.pairwise(stamps)]
    return gaps


def many_sessions(count: int) -> dict[str, Any]:
    daemon = Daemon()
    try:
        turns: list[dict[str, Any]] = [
            {
                "tool_calls": [{"name": "read", "arguments": {"path": f"f{i}.txt"}}],
                "delay": MODEL_LATENCY,
            }
            for i in range(3)
        ]
        turns.append({"text": "read all three", "delay": MODEL_LATENCY})
        model = daemon.script("steps", turns)
        ids = daemon.sessions(model, count)
        time.sleep(0.5)
        rss_before = daemon.memory("VmRSS")
        cpu_before = daemon.cpu_seconds()
        stream = daemon.client.events(after=daemon.client.health()["last_seq"])
        stream.open()
        finished: list[float] = []
        waiter = threading.Thread(
            target=lambda: finished.append(wait_for_turns(stream, count, 300)), daemon=True
        )
        waiter.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda sid: daemon.client.prompt(sid, "read the files"), ids))
        acked = time.perf_counter() - started
        waiter.join(timeout=300)
        if not finished:
            raise RuntimeError("the sessions did not finish")
        wall = finished[0] - started
        time.sleep(0.5)
        rss_after = daemon.memory("VmRSS")
        cpu = daemon.cpu_seconds() - cpu_before
        overheads = _step_overheads(daemon.log)
        return {
            "sessions": count,
            "model_calls_per_session": 4,
            "model_latency_s": MODEL_LATENCY,
            "all_prompts_acked_s": round(acked, 2),
            "total_wall_s": round(wall, 2),
            "ideal_wall_s": 4 * MODEL_LATENCY,
            "step_overhead_p50_ms": round(percentile(overheads, 0.5), 1),
            "step_overhead_p99_ms": round(percentile(overheads, 0.99), 1),
            "step_overhead_samples": len(overheads),
            "daemon_cpu_s": round(cpu, 2),
            "daemon_cpu_per_step_ms": round(cpu / (count * 4) * 1000, 2),
            "peak_rss_mb": round(daemon.memory("VmHWM") / 1024, 1),
            "rss_before_mb": round(rss_before / 1024, 1),
            "rss_after_mb": round(rss_after / 1024, 1),
            "rss_per_live_session_kb": round((rss_after - rss_before) / count, 1),
            "stream_reconnects": stream.reconnects,
        }
    finally:
        daemon.stop()


class ChatServer:
    """A minimal OpenAI-compatible chat-completions server on 127.0.0.1, in a thread.

    Every request gets the same one-line streamed answer. The sessions then use the real
    HTTP provider (its client, connection pool and TLS context), which is what a session
    holds in a real deployment, rather than the scripted one.
    """

    ANSWER = (
        b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        answer = self.ANSWER

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # the name http.server calls
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def idle_sessions(count: int, idle_wait: float = IDLE_WAIT_S) -> dict[str, Any]:
    """RSS once ``count`` sessions have each run one turn and gone idle (issue 12).

    Each session's model is ``openai/m`` on a local chat server, so each builds the real
    HTTP provider. The turns run in waves of ``IDLE_WAVE`` sessions at once (each wave
    prompted, then waited for), as a daemon serving a few users at a time sees them; after
    the last turn, the daemon is left alone
    for ``idle_wait`` seconds (past the idle release of session actors) before VmRSS is
    read. Also reported: VmRSS right after start and after the sessions were created.
    """
    chat = ChatServer()
    daemon = Daemon(HARNESS_BASE_URL=chat.url)
    try:
        started_rss = daemon.memory("VmRSS")
        ids = daemon.sessions("openai/m", count)
        created_rss = daemon.memory("VmRSS")
        stream = daemon.client.events(after=daemon.client.health()["last_seq"])
        stream.open()
        started = time.perf_counter()
        with ThreadPoolExecutor(IDLE_WAVE) as pool:
            for wave in range(0, count, IDLE_WAVE):
                batch = ids[wave : wave + IDLE_WAVE]
                list(pool.map(lambda sid: daemon.client.prompt(sid, "say ok"), batch))
                wait_for_turns(stream, len(batch), 120)
        wall = time.perf_counter() - started
        busy_rss = daemon.memory("VmRSS")
        time.sleep(idle_wait)
        idle_rss = daemon.memory("VmRSS")
        return {
            "sessions": count,
            "turns_wall_s": round(wall, 2),
            "rss_at_start_mb": round(started_rss / 1024, 1),
            "rss_sessions_created_mb": round(created_rss / 1024, 1),
            "rss_after_turns_mb": round(busy_rss / 1024, 1),
            "rss_idle_mb": round(idle_rss / 1024, 1),
            "idle_wait_s": idle_wait,
            "rss_per_idle_session_kb": round((idle_rss - created_rss) / count, 1),
            "peak_rss_mb": round(daemon.memory("VmHWM") / 1024, 1),
        }
    finally:
        daemon.stop()
        chat.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 sessions instead of 1,000")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--idle-only", action="store_true", help="only the idle sessions' RSS (issue 12)"
    )
    args = parser.parse_args()
    if args.idle_only:
        print(json.dumps(idle_sessions(200 if args.quick else 1000)), flush=True)
        return
    figures: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    figures["ack_under_load"] = ack_under_load()
    print(json.dumps(figures["ack_under_load"]), flush=True)
    figures["sse"] = [sse_rate(1), sse_rate(10)]
    print(json.dumps(figures["sse"]), flush=True)
    figures["cli"] = cli_wall_times()
    print(json.dumps(figures["cli"]), flush=True)
    figures["many_sessions"] = many_sessions(200 if args.quick else 1000)
    print(json.dumps(figures["many_sessions"]), flush=True)
    figures["idle_sessions"] = idle_sessions(200 if args.quick else 1000)
    print(json.dumps(figures["idle_sessions"]), flush=True)
    misses = []
    if figures["ack_under_load"]["ack_p99_ms"] > TARGET_ACK_P99_MS:
        misses.append("prompt ack p99")
    if figures["cli"]["help_ms"] > TARGET_HELP_MS:
        misses.append("harness --help")
    if figures["cli"]["sessions_ms_live_daemon_100_sessions"] > TARGET_SESSIONS_MS:
        misses.append("harness sessions")
    if figures["many_sessions"]["step_overhead_p99_ms"] > TARGET_STEP_OVERHEAD_P99_MS:
        misses.append("per-step overhead p99")
    if not args.quick and figures["idle_sessions"]["rss_idle_mb"] > TARGET_IDLE_RSS_MB:
        misses.append("RSS of 1,000 idle sessions")
    figures["targets_missed"] = misses
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written to {RESULTS}; targets missed: {misses or 'none'}")
    if args.check and misses:
        sys.exit(1)


if __name__ == "__main__":
    main()

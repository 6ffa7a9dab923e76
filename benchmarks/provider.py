"""The provider benchmark of issue 3: CPU per streamed chunk, first event, cancel latency.

Run from the repository root::

    python benchmarks/provider.py            # the full run (about half a minute)
    python benchmarks/provider.py --quick    # fewer repetitions
    python benchmarks/provider.py --check    # exit 1 when a target is missed
    python benchmarks/provider.py --profile mistral   # cProfile the chunk path, top functions

Both providers (``mistral/…`` and ``openai/…``) are driven through their real code
(``provider.stream(request)``: request encoding, httpx over TCP, SSE framing, chunk
parsing, events) against a local HTTP server on 127.0.0.1. The server runs in a separate
process (``--serve``, standard library only) so none of its CPU is counted. It answers
with ``transfer-encoding: chunked`` and writes each SSE event as its own HTTP chunk, the
way a real streaming API does; each chunk is a realistic ~220-byte
``chat.completion.chunk`` with one short text delta, the last one a finish with usage.

CPU per chunk
    ``time.process_time()`` of this process (all threads) around consuming one whole
    stream of N chunks, minus the same around a stream of 1 chunk (request building,
    connecting and set-up cancel out), divided by N − 1; each term the median of several
    runs. "paced": the server sleeps 200 µs after each chunk, so the client reads one
    chunk per receive as it would from a real model, which is the costly case and the
    figure held against the target. "burst": the server writes them back to back, so
    reads carry many chunks (shown for comparison). The same is measured for a bare
    ``httpx.AsyncClient`` reading the same body with ``aiter_raw()`` and no parsing: the
    floor that Trio and httpx alone cost per wakeup, under both providers (DESIGN §6
    prescribes httpx), and "above bare httpx" is the provider's own share.

Request → first event
    Wall time from just before ``provider.stream(request)`` to the first event out of
    it (a new connection each time; the server answers at once). Median of the runs.

Cancel → disconnect
    The server sends one chunk and then holds the response open. On the first event the
    client takes ``time.monotonic()`` and cancels the enclosing scope; the server takes
    ``time.monotonic()`` (CLOCK_MONOTONIC: the same clock in both processes) when its
    ``recv`` returns EOF and reports it on its stdout. Median and worst of the runs.

Figures are written to ``benchmarks/results/provider.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import socketserver
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "provider.json"

TARGET_CHUNK_US = 60.0
TARGET_CANCEL_MS = 10.0
PACE_S = 0.0002
WORDS = ("def", " parse", "(", "self", ",", " text", ")", " ->", " str", ":\n", "    return")


# --- the server (a separate process) ----------------------------------------------------


def _chunk(index: int, *, finish: bool = False) -> bytes:
    delta: dict[str, Any] = {} if finish else {"content": WORDS[index % len(WORDS)]}
    event: dict[str, Any] = {
        "id": "0c2d9e3a7f1b4c6e8a5d2f9b1e7c3a4d",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": "devstral-medium-latest",
        "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if finish else None}],
    }
    if finish:
        event["usage"] = {
            "prompt_tokens": 1200,
            "completion_tokens": index,
            "total_tokens": 1200 + index,
        }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                return
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        target = lines[0].split(b" ")[1].decode()
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            more = sock.recv(65536)
            if not more:
                return
            body += more
        # The mode rides in the base URL: /<mode>/<chunks>/v1/chat/completions.
        _, mode, count, *_ = target.split("/")
        sock.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        n = int(count)
        if mode == "hang":
            sock.sendall(_http_chunk(_chunk(0)))
            try:
                while sock.recv(65536):
                    pass
            except OSError:
                pass
            print(f"disconnect {time.monotonic()!r}", flush=True)
            return
        events = [_chunk(i) for i in range(n - 1)] + [_chunk(n, finish=True), b"data: [DONE]\n\n"]
        try:
            if mode == "burst":
                sock.sendall(b"".join(_http_chunk(e) for e in events) + b"0\r\n\r\n")
            else:
                for event in events:
                    sock.sendall(_http_chunk(event))
                    time.sleep(PACE_S)
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve() -> None:
    with _Server(("127.0.0.1", 0), _Handler) as server:
        print(f"port {server.server_address[1]}", flush=True)
        server.serve_forever()


# --- the client -------------------------------------------------------------------------


class Bench:
    def __init__(self, server: subprocess.Popen[str], port: int) -> None:
        self.server = server
        self.root = f"http://127.0.0.1:{port}"

    def provider(self, kind: str, mode: str, chunks: int) -> Any:
        base = f"{self.root}/{mode}/{chunks}"
        if kind == "mistral":
            from harness.providers.mistral import MistralProvider

            return MistralProvider("devstral-medium-latest", api_key="bench", base_url=base)
        from harness.providers.openai import OpenAIProvider

        return OpenAIProvider("devstral-medium-latest", base_url=base + "/v1")


def _request() -> Any:
    from harness.messages.provider import ProviderRequest, ToolSpec, UserTurn

    tools = tuple(
        ToolSpec(
            name,
            f"The {name} tool.",
            {"type": "object", "properties": {"path": {"type": "string"}}},
        )
        for name in ("read", "edit", "bash", "grep", "glob")
    )
    return ProviderRequest(
        "devstral-medium-latest",
        ("You are a coding agent.", "<environment>\nWorking directory: /tmp\n</environment>"),
        (UserTurn("explain the parser"),),
        tools,
    )


async def _consume(provider: Any, request: Any) -> tuple[int, float]:
    """Events seen and seconds from the call to the first event."""
    start = time.perf_counter()
    first = 0.0
    count = 0
    async with provider.stream(request) as events:
        async for _ in events:
            if count == 0:
                first = time.perf_counter() - start
            count += 1
    return count, first


async def cpu_of_stream(bench: Bench, kind: str, mode: str, chunks: int) -> tuple[float, float]:
    """(process CPU seconds, first-event seconds) for one whole stream of ``chunks``."""
    provider = bench.provider(kind, mode, chunks)
    request = _request()
    try:
        before = time.process_time()
        count, first = await _consume(provider, request)
        cpu = time.process_time() - before
    finally:
        await provider.aclose()
    assert count == chunks, (count, chunks)  # N-1 text deltas and a finish
    return cpu, first


async def cpu_of_bare_httpx(bench: Bench, mode: str, chunks: int) -> float:
    """The floor under both providers: httpx alone reading the same body, no parsing."""
    import httpx

    async with httpx.AsyncClient() as client:
        before = time.process_time()
        url = f"{bench.root}/{mode}/{chunks}/v1/chat/completions"
        async with client.stream("POST", url, content=b"{}") as response:
            async for _ in response.aiter_raw():
                pass
        return time.process_time() - before


async def cancel_latency(bench: Bench, kind: str) -> float:
    import trio

    provider = bench.provider(kind, "hang", 1)
    cancelled_at = 0.0
    try:
        with trio.CancelScope() as scope:
            async with provider.stream(_request()) as events:
                async for _ in events:
                    cancelled_at = time.monotonic()
                    scope.cancel()
                    await trio.sleep(10)
    finally:
        await provider.aclose()
    assert bench.server.stdout is not None
    line = bench.server.stdout.readline().split()
    assert line and line[0] == "disconnect", line
    return float(line[1]) - cancelled_at


async def measure(bench: Bench, quick: bool) -> dict[str, Any]:
    runs = 5 if quick else 9
    chunks = 1000 if quick else 2000
    out: dict[str, Any] = {"runs": runs, "chunks": chunks, "pace_us": PACE_S * 1e6}
    floor: dict[str, float] = {}
    for mode in ("paced", "burst"):
        base = [await cpu_of_bare_httpx(bench, mode, 1) for _ in range(runs)]
        full = [await cpu_of_bare_httpx(bench, mode, chunks) for _ in range(runs)]
        per_chunk = (statistics.median(full) - statistics.median(base)) / (chunks - 1)
        floor[f"cpu_per_chunk_us_{mode}"] = round(per_chunk * 1e6, 2)
    out["bare_httpx"] = floor
    for kind in ("mistral", "openai"):
        await cpu_of_stream(bench, kind, "burst", 50)  # warm up: imports, caches
        figures: dict[str, Any] = {}
        firsts: list[float] = []
        for mode in ("paced", "burst"):
            base = []
            full = []
            for _ in range(runs):
                cpu, first = await cpu_of_stream(bench, kind, mode, 1)
                base.append(cpu)
                firsts.append(first)
                full.append((await cpu_of_stream(bench, kind, mode, chunks))[0])
            per_chunk = (statistics.median(full) - statistics.median(base)) / (chunks - 1)
            figures[f"cpu_per_chunk_us_{mode}"] = round(per_chunk * 1e6, 2)
            figures[f"cpu_stream_s_{mode}"] = {
                "1": round(statistics.median(base), 5),
                str(chunks): round(statistics.median(full), 5),
            }
        figures["first_event_ms"] = round(statistics.median(firsts) * 1000, 3)
        cancels = [await cancel_latency(bench, kind) for _ in range(runs * 2)]
        figures["cancel_to_disconnect_ms"] = {
            "median": round(statistics.median(cancels) * 1000, 3),
            "max": round(max(cancels) * 1000, 3),
        }
        out[kind] = figures
    return out


def _rows(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    floor = results["bare_httpx"]
    rows = [
        (
            "httpx alone, no parsing: CPU per chunk (paced)",
            f"{floor['cpu_per_chunk_us_paced']:.1f} µs",
            "(floor)",
            True,
        ),
        (
            "httpx alone, no parsing: CPU per chunk (burst)",
            f"{floor['cpu_per_chunk_us_burst']:.1f} µs",
            "(floor)",
            True,
        ),
    ]
    for kind in ("mistral", "openai"):
        f = results[kind]
        paced = f["cpu_per_chunk_us_paced"]
        rows.append(
            (
                f"{kind}: CPU per chunk (paced)",
                f"{paced:.1f} µs",
                f"≤ {TARGET_CHUNK_US:.0f} µs",
                paced <= TARGET_CHUNK_US,
            )
        )
        above = paced - floor["cpu_per_chunk_us_paced"]
        f["cpu_per_chunk_us_paced_above_bare_httpx"] = round(above, 2)
        rows.append(
            (f"{kind}: of which above bare httpx (paced)", f"{above:.1f} µs", "(info)", True)
        )
        burst = f["cpu_per_chunk_us_burst"]
        rows.append((f"{kind}: CPU per chunk (burst)", f"{burst:.1f} µs", "(info)", True))
        rows.append(
            (f"{kind}: request → first event", f"{f['first_event_ms']:.2f} ms", "(info)", True)
        )
        cancel = f["cancel_to_disconnect_ms"]
        rows.append(
            (
                f"{kind}: cancel → server sees disconnect",
                f"{cancel['median']:.2f} ms (max {cancel['max']:.2f})",
                f"< {TARGET_CANCEL_MS:.0f} ms",
                cancel["max"] < TARGET_CANCEL_MS,
            )
        )
    return rows


def print_table(rows: list[tuple[str, str, str, bool]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'measured':>24}  {'target':>10}  result")
    for name, value, target, ok in rows:
        verdict = "" if target.startswith("(") else ("PASS" if ok else "FAIL")
        print(f"{name:<{width}}  {value:>24}  {target:>10}  {verdict}")


def _start_server() -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    line = server.stdout.readline().split()
    if not line or line[0] != "port":
        server.kill()
        raise RuntimeError("the benchmark server did not start")
    return server, int(line[1])


def _git_head() -> str:
    from harness.gitsafe import run_git_sync

    done = run_git_sync(ROOT, "describe", "--always", "--dirty")
    return done.stdout.strip() if done is not None else ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def profile(kind: str, top: int) -> None:
    import cProfile
    import pstats

    import trio

    server, port = _start_server()
    try:
        bench = Bench(server, port)
        trio.run(cpu_of_stream, bench, kind, "burst", 50)
        profiler = cProfile.Profile()
        profiler.enable()
        trio.run(cpu_of_stream, bench, kind, "paced", 5000)
        profiler.disable()
    finally:
        server.kill()
        server.wait()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def _use_project_venv() -> None:
    """``python benchmarks/provider.py`` with a Python outside the venv: re-run inside it."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    if sys.prefix == sys.base_prefix and venv_python.exists():
        os.execv(str(venv_python), [str(venv_python), *sys.argv])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer runs and chunks")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON file")
    parser.add_argument("--profile", choices=("mistral", "openai"), help="cProfile the chunk path")
    parser.add_argument("--top", type=int, default=30, help="rows in the profile")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    _use_project_venv()
    sys.path.insert(0, str(ROOT))
    if args.profile:
        profile(args.profile, args.top)
        return 0

    import trio

    print(f"harness provider benchmark ({sys.executable})", file=sys.stderr)
    server, port = _start_server()
    try:
        figures = trio.run(measure, Bench(server, port), args.quick)
    finally:
        server.kill()
        server.wait()
    rows = _rows(figures)
    print_table(rows)
    import harness

    results = {
        "date": datetime.now().strftime("%Y-%m-%d"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": _cpu_model(),
            "cpus": os.cpu_count(),
        },
        "quick": args.quick,
        "harness_source": str(Path(harness.__file__).parent),
        "git_head": _git_head(),
        "targets": {
            "cpu_per_chunk_us": TARGET_CHUNK_US,
            "cancel_to_disconnect_ms": TARGET_CANCEL_MS,
        },
        **figures,
        "pass": all(ok for _, _, target, ok in rows if not target.startswith("(")),
    }
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        print(f"\nwritten to {RESULTS.relative_to(ROOT)}")
    failed = [name for name, _, target, ok in rows if not ok and not target.startswith("(")]
    if failed:
        print(f"missed: {', '.join(failed)}")
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

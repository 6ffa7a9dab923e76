"""The ACP benchmark of issue 17: the model's first token → the first ``session/update``.

Run from the repository root::

    python benchmarks/acp.py            # 40 prompts
    python benchmarks/acp.py --quick    # 10 prompts
    python benchmarks/acp.py --check    # exit 1 when the target is missed

A real ``harness acp`` process (``openai/bench`` over httpx) is driven over its pipes, as
an editor drives it. The model is a local OpenAI-compatible wire server in a process of
its own (``--serve``, standard library only): for each request it sends the headers and
the role chunk, waits 30 ms (a model thinking), takes ``time.monotonic()`` and sends the
first text token, then the rest of the answer. This script takes ``time.monotonic()``
when the first ``agent_message_chunk`` of the prompt's ``session/update`` arrives on the
agent's stdout. CLOCK_MONOTONIC is the same clock in all three processes, so the
difference is the agent's whole path for the first token: SSE parsing, the runner, the
live delta, the feed, the event → update translation, pydantic validation of the
``acp.schema`` models, JSON and the pipe. Target: within 5 ms (median and p90).

Figures are written to ``benchmarks/results/acp.json``.
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
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 5.0
THINK_SECONDS = 0.03
WORDS = ["The", " answer", " is", " forty", "-two", "."]


# --- the wire server, in its own process ------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    event: dict[str, Any] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if finish is not None:
        event["usage"] = {"prompt_tokens": 100, "completion_tokens": 6, "total_tokens": 106}
    data = b"data: " + json.dumps(event).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server: _Server = self.server  # type: ignore[assignment]
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                more = sock.recv(65536)
                if not more:
                    return
                buffer += more
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            target = lines[0].split(b" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                more = sock.recv(65536)
                if not more:
                    return
                buffer += more
            buffer = buffer[length:]
            if target == b"/stamps":
                answer = json.dumps(server.stamps).encode()
                head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(answer)
                sock.sendall(head + answer)
                continue
            sock.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + _chunk({"role": "assistant", "content": ""})
            )
            time.sleep(THINK_SECONDS)
            server.stamps.append(time.monotonic())
            sock.sendall(_chunk({"content": WORDS[0]}))
            for word in WORDS[1:]:
                time.sleep(0.002)
                sock.sendall(_chunk({"content": word}))
            done = b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % 14
            sock.sendall(_chunk({"content": ""}, "stop") + done)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    stamps: list[float]


def serve() -> None:
    with _Server(("127.0.0.1", 0), _Handler) as server:
        server.stamps = []
        print(f"port {server.server_address[1]}", flush=True)
        server.serve_forever()


# --- the editor's side ------------------------------------------------------------------


class Agent:
    def __init__(self, root: str, home: Path) -> None:
        env = dict(os.environ)
        env.update(
            {
                "HARNESS_HOME": str(home),
                "HARNESS_SOCKET": str(home / "none.sock"),
                "OPENAI_API_KEY": "bench",
            }
        )
        command = [sys.executable, "-m", "harness", "acp", "--model", "openai/bench"]
        self.process = subprocess.Popen(
            [*command, "--base-url", f"{root}/v1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            cwd=ROOT,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in: TextIO = self.process.stdin
        self._out: TextIO = self.process.stdout
        self._id = 0

    def send(self, method: str, params: dict[str, Any]) -> int:
        self._id += 1
        message = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}
        self._in.write(json.dumps(message) + "\n")
        self._in.flush()
        return self._id

    def call(self, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
        """The response, and when the first agent_message_chunk before it arrived."""
        request_id = self.send(method, params)
        first: float | None = None
        while True:
            line = self._out.readline()
            if not line:
                raise SystemExit("harness acp exited")
            if first is None and '"agent_message_chunk"' in line:
                first = time.monotonic()
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message, first

    def close(self) -> None:
        self._in.close()
        self.process.wait(timeout=30)


def measure(prompts: int) -> dict[str, Any]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    port = server.stdout.readline().split()[1]
    root = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="acp-bench") as base:
            agent = Agent(root, Path(base) / "home")
            try:
                agent.call("initialize", {"protocolVersion": 1})
                new, _ = agent.call("session/new", {"cwd": base, "mcpServers": []})
                session_id = new["result"]["sessionId"]
                arrivals: list[float] = []
                for n in range(prompts + 1):
                    text = {"type": "text", "text": f"question {n}"}
                    answer, first = agent.call(
                        "session/prompt", {"sessionId": session_id, "prompt": [text]}
                    )
                    assert answer["result"]["stopReason"] == "end_turn", answer
                    assert first is not None
                    arrivals.append(first)
            finally:
                agent.close()
        with urlopen(f"{root}/stamps", timeout=10) as reply:
            stamps: list[float] = json.loads(reply.read())
    finally:
        server.terminate()
        server.wait()
    # The first prompt warms the process up (imports, the first connection): not counted.
    latencies = sorted((a - s) * 1000 for a, s in zip(arrivals[1:], stamps[1:], strict=True))
    return {
        "prompts": prompts,
        "median_ms": round(statistics.median(latencies), 3),
        "p90_ms": round(latencies[int(0.9 * (len(latencies) - 1))], 3),
        "max_ms": round(latencies[-1], 3),
        "min_ms": round(latencies[0], 3),
        "first_prompt_ms": round((arrivals[0] - stamps[0]) * 1000, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="10 prompts instead of 40")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    figures = measure(10 if args.quick else 40)
    print("first token → first session/update (ms), harness acp over its pipes")
    for key in ("median_ms", "p90_ms", "max_ms", "min_ms", "first_prompt_ms"):
        print(f"  {key:<16} {figures[key]:>8.3f}")
    met = figures["median_ms"] <= TARGET_MS and figures["p90_ms"] <= TARGET_MS
    print(f"target ≤ {TARGET_MS} ms (median and p90): {'met' if met else 'MISSED'}")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    record = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "load": os.getloadavg()[0],
        "target_ms": TARGET_MS,
        **figures,
    }
    (results / "acp.json").write_text(json.dumps(record, indent=2) + "\n")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())

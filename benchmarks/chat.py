"""Chat benchmark (issue 17): keypress-to-screen while an answer streams, and start-up.

Run from the repository root::

    python benchmarks/chat.py                  # both figures, embedded and daemon
    python benchmarks/chat.py --keys 200 --starts 20

Real processes in a real pseudo-terminal (``ptyprocess``, what pexpect runs on):

- **keypress → screen**: ``harness chat`` streams a scripted answer at 100 tokens/s
  (``chunk_delay`` 0.01 s, one word a chunk; the harness batches deltas every 50 ms as it
  does for any provider). Meanwhile a key (a capital letter, which the answer never
  holds, a different one each time) is written to the terminal, and the time until that
  byte comes back in what the chat draws is measured; then a backspace clears the line.
  The same is measured with nothing streaming, as the floor. Target: under one frame,
  16 ms.
- **start → prompt ready**, with a daemon running: from the spawn of ``harness chat``
  (Python start-up and imports included) until the screen shows both the welcome line
  (printed once the session is created and its event stream subscribed) and the input
  line's status ``ready``. Target: 0.3 s.

Figures go to ``benchmarks/results/chat.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ptyprocess import PtyProcess

ROOT = Path(__file__).resolve().parent.parent
HARNESS = [sys.executable, "-m", "harness"]
KEYS = "QWERYUIPASDFGHJLZXCVBNM"  # capitals: the streamed answer is lowercase


def _env(home: Path, socket: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.pop("NO_COLOR", None)
    env.update(
        HARNESS_HOME=str(home),
        HARNESS_SOCKET=str(socket),
        HARNESS_SANDBOX="off",
        TERM="xterm-256color",
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    return env


def _read_until(process: PtyProcess, wanted: list[bytes], timeout: float) -> tuple[float, bytes]:
    """Read the terminal until every one of ``wanted`` was seen; the time of the last."""
    seen = b""
    deadline = time.perf_counter() + timeout
    while not all(w in seen for w in wanted):
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"never saw {wanted!r}; last output: {seen[-300:]!r}")
        ready, _, _ = select.select([process.fd], [], [], left)
        if ready:
            seen += os.read(process.fd, 65536)
    return time.perf_counter(), seen


def _drain(process: PtyProcess) -> None:
    while select.select([process.fd], [], [], 0)[0]:
        os.read(process.fd, 65536)


def _spawn(args: list[str], env: dict[str, str], cwd: Path) -> PtyProcess:
    return PtyProcess.spawn([*HARNESS, "chat", *args], env=env, cwd=str(cwd), dimensions=(40, 120))


def keypresses(work: Path, socket: Path, keys: int, *, stream: bool = True) -> dict[str, Any]:
    words = max(1500, keys * 6)
    script = work / "stream.json"
    text = " ".join(f"tok{n % 97}" for n in range(words))
    script.write_text(json.dumps([{"text": text, "chunks": words, "chunk_delay": 0.01}]))
    project = work / "project"
    project.mkdir(exist_ok=True)
    env = _env(work / "home", socket)
    process = _spawn(["--model", f"scripted:{script}", "--dir", str(project)], env, project)
    try:
        _read_until(process, [b"/help for commands"], 20)
        if stream:
            process.write(b"stream please\r")
            _read_until(process, [b"tok20 "], 20)  # streaming has begun
        times: list[float] = []
        for n in range(keys):
            # Keys the answer never holds, a different one each time: a redraw that
            # merged a backspace with the next key can then never hide it.
            key = KEYS[n % len(KEYS)].encode()
            _drain(process)
            start = time.perf_counter()
            process.write(key)
            end, _ = _read_until(process, [key], 5)
            times.append((end - start) * 1000)
            process.write(b"\x7f")
            time.sleep(0.03)
        process.write(b"\x03")
        time.sleep(0.3)
        process.write(b"\x03")
    finally:
        _close(process)
    return _stats(times, "ms")


def starts(work: Path, socket: Path, count: int) -> dict[str, Any]:
    # A model string as a user gives one (no file to resolve here); nothing is sent to it.
    project = work / "project"
    project.mkdir(exist_ok=True)
    env = _env(work / "home", socket)
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        process = _spawn(["--model", "openai/bench-model", "--dir", str(project)], env, project)
        try:
            end, _ = _read_until(process, [b"/help for commands", b"ready"], 20)
            times.append(end - start)
            cpu.append(_cpu_seconds(process.pid))
            process.write(b"/quit\r")
            process.wait()
        finally:
            _close(process)
    return {**_stats(times, "s"), "cpu_p50": round(statistics.median(cpu), 3)}


def _cpu_seconds(pid: int) -> float:
    """CPU time the process used so far (user + system): what start-up costs, whatever
    else the machine runs (wall time under load waits for a core)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _close(process: PtyProcess) -> None:
    if process.isalive():
        process.kill(signal.SIGKILL)
    process.close(force=True)


def _stats(values: list[float], unit: str) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "unit": unit,
        "count": len(values),
        "p50": round(statistics.median(ordered), 4),
        "p95": round(ordered[int(len(ordered) * 0.95) - 1 if len(ordered) > 1 else 0], 4),
        "p99": round(ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0], 4),
        "max": round(ordered[-1], 4),
    }


def _daemon(work: Path, socket: Path) -> subprocess.Popen[bytes]:
    log = (work / "serve.log").open("wb")
    process = subprocess.Popen(
        [*HARNESS, "serve"], env=_env(work / "home", socket), stdout=log, stderr=log
    )
    sys.path.insert(0, str(ROOT))
    from harness.client import Client

    client = Client(socket)
    deadline = time.monotonic() + 20
    while not client.alive():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((work / "serve.log").read_text())
        time.sleep(0.05)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--starts", type=int, default=10)
    options = parser.parse_args()
    results: dict[str, Any] = {}
    for mode in ("embedded", "daemon"):
        with tempfile.TemporaryDirectory(prefix="hc", dir="/tmp") as tmp:
            work = Path(tmp)
            socket = work / "h.sock"
            daemon = _daemon(work, socket) if mode == "daemon" else None
            try:
                results[f"keypress_{mode}"] = keypresses(work, socket, options.keys)
                if mode == "embedded":  # the same keys with nothing streaming: the floor
                    results["keypress_idle"] = keypresses(
                        work, socket, options.keys, stream=False
                    )
                if daemon is not None:
                    results["start_daemon"] = starts(work, socket, options.starts)
            finally:
                if daemon is not None:
                    daemon.send_signal(signal.SIGTERM)
                    daemon.wait(timeout=20)
    width = max(len(name) for name in results)
    for name, figures in results.items():
        unit = figures["unit"]
        print(
            f"{name:<{width}}  p50 {figures['p50']} {unit}  p95 {figures['p95']} {unit}  "
            f"p99 {figures['p99']} {unit}  "
            f"max {figures['max']} {unit}  (n={figures['count']})"
            + (f"  cpu p50 {figures['cpu_p50']} s" if "cpu_p50" in figures else "")
        )
    out = ROOT / "benchmarks" / "results" / "chat.json"
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

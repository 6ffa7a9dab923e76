"""What one rendered log line costs (issue 14): a hot caller's ``log.info`` to the file.

Run from the repository root::

    python benchmarks/log_line.py            # 20,000 lines, 7 rounds
    python benchmarks/log_line.py --quick

The line is a tool step's "tool completed", with the context a step has bound (session,
turn, step, message), logged from a Trio task (whose context holds Trio's own variables
too) by a ``harness.logs.get_logger`` logger to a log file. Also timed: a debug line
below the level, and the info line with one known secret (one more substring search).
Figures are the median over rounds of the process's CPU time per line, in µs (CPU time,
not wall time: on a shared machine another process's turn is not counted, though its
effect on caches is). Still noisy there: compare rows of one run, or runs made together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from structlog.contextvars import bind_contextvars

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import secrets  # noqa: E402
from harness.logs import configure_logging, get_logger  # noqa: E402

log = get_logger("harness.tools")


def _per_line(call: Callable[[], None], lines: int, rounds: int) -> float:
    figures = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(lines):
            call()
        figures.append((time.process_time() - start) / lines * 1e6)
    return statistics.median(figures)


def _info() -> None:
    log.info("tool completed", call_id="cal_0123456789", tool="read")


def _debug() -> None:
    log.debug("tool input", call_id="cal_0123456789", size=120)


async def _measure(lines: int, rounds: int) -> dict[str, float]:
    bind_contextvars(
        session_id="ses_1a2b3c4d5e6f7a8b9c0d1e2f3a",
        turn="msg_0a1b2c3d4e5f6a7b8c9d0e1f2a",
        step=3,
        message_id="msg_1a2b3c4d5e6f7a8b9c0d1e2f3a",
    )
    figures = {}
    secrets.refresh_secrets(environ={})
    figures["info line, no secret known"] = _per_line(_info, lines, rounds)
    figures["debug line below the level"] = _per_line(_debug, lines, rounds)
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"})
    figures["info line, one secret known"] = _per_line(_info, lines, rounds)
    secrets.refresh_secrets()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lines, rounds = (5_000, 3) if args.quick else (20_000, 7)
    with tempfile.TemporaryDirectory() as directory:
        configure_logging(level="info", file=Path(directory) / "bench.jsonl")
        figures = trio.run(_measure, lines, rounds)
    for name, value in figures.items():
        print(f"{name:32} {value:6.2f} µs")


if __name__ == "__main__":
    main()

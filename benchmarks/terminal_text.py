"""What showing, never obeying, the control characters of model text costs per streamed
delta (``harness.printable``, harness/terminal_text.py).

Run from the repository root::

    python benchmarks/terminal_text.py           # about five seconds
    python benchmarks/terminal_text.py --quick

Per call, in nanoseconds, the median of several rounds of many calls:

- ``printable`` on a typical 24-character delta of prose (the common case: one regex
  scan, no copy), on one holding an escape sequence (the substitution), on a 2 KB tool
  output, and on a title in one-line mode;
- ``printable_data`` on a ``part.delta`` event's payload (what the chat cleans per event).

Figures go to ``benchmarks/results/terminal_text.json``. On a shared machine they are
noisy; compare the rows of one run, not runs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import printable, printable_data  # noqa: E402

DELTA = "The function returns a "
HOSTILE_DELTA = "done \x1b]0;pwned\x07 ok"
OUTPUT = ("src/app.py:12: def main() -> None:\n" * 60)[:2048]
TITLE = "bash git status --short"
EVENT = {"message_id": "msg_1", "part_id": "prt_1", "field": "text", "delta": DELTA}


def _per_call_ns(work: Callable[[], object], calls: int, rounds: int) -> float:
    figures = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            work()
        figures.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(figures)


def main() -> None:
    quick = "--quick" in sys.argv
    calls, rounds = (20_000, 3) if quick else (200_000, 5)
    cases: dict[str, Callable[[], object]] = {
        "delta, plain prose (24 chars)": lambda: printable(DELTA),
        "delta with an OSC title sequence": lambda: printable(HOSTILE_DELTA),
        "2 KB tool output, plain": lambda: printable(OUTPUT),
        "tool title, one-line mode": lambda: printable(TITLE, one_line=True),
        "part.delta payload (printable_data)": lambda: printable_data(EVENT),
        "baseline: a no-op call": lambda: None,
    }
    results = {name: round(_per_call_ns(work, calls, rounds)) for name, work in cases.items()}
    for name, ns in results.items():
        print(f"{name:40} {ns:>7} ns")
    out = ROOT / "benchmarks" / "results" / "terminal_text.json"
    out.write_text(json.dumps({"ns_per_call": results, "calls": calls, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()

"""What redacting known secrets costs a ledger write (issue 11, item 4).

Run from the repository root::

    python benchmarks/redaction.py           # about ten seconds
    python benchmarks/redaction.py --quick

Two figures, each with no secret known (redaction is skipped), with two secrets known
and absent from the text (the usual case: one substring search per secret over the
serialized event), and with a secret present (replace, then parse the JSON again):

- per event, in memory: ``json.dumps`` of a ``part.updated`` tool event and the
  redaction step of ``Ledger._commit``, for outputs of 200 B, 2 KB and 50 KB;
- per event, end to end: a real ledger in a temporary directory, 3000 events written
  through ``Ledger.write`` in batches of 10 (the writer thread, SQLite, WAL);
- per log line: ``redact_log_text`` (known values, then credential shapes) on a typical
  350-byte JSON line.

Figures are medians of several runs, written to ``benchmarks/results/redaction.json``.
On a shared machine they are noisy; compare the rows of one run, not runs.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import secrets  # noqa: E402
from harness.messages.events import NewEvent  # noqa: E402
from harness.storage.ledger import Ledger, _dumps  # noqa: E402

KEY = "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"
SECRETS = {"MISTRAL_API_KEY": KEY, "OPENAI_API_KEY": "sk-other-0123456789abcdef"}


def _event(size: int, with_key: bool) -> dict[str, Any]:
    line = "drwxr-xr-x  2 user user 4096 Dec  1 10:00 some-directory-name\n"
    output = (line * (size // len(line) + 1))[:size]
    if with_key:
        output = output[: size // 2] + KEY + output[size // 2 :]
    return {
        "id": "prt_1a2b3c4d5e6f7a8b9c0d1e2f3a",
        "session_id": "ses_1a2b3c4d5e6f7a8b9c0d1e2f3a",
        "message_id": "msg_1a2b3c4d5e6f7a8b9c0d1e2f3a",
        "type": "tool",
        "call_id": "AbC123xYz",
        "tool": "bash",
        "state": {
            "status": "completed",
            "input": {"command": "ls -la"},
            "output": output,
            "title": "ls -la",
            "metadata": {"exit": 0},
            "start": 1.0,
            "end": 2.0,
        },
    }


def _commit_step(data: dict[str, Any]) -> Any:
    # The same steps as Ledger._commit, without SQLite.
    text = _dumps(data)
    stored = data
    if secrets.has_secrets():
        clean = secrets.redact(text)
        if clean != text:
            text, stored = clean, json.loads(clean)
    return text, stored


def _per_event_us(data: dict[str, Any], repeat: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            _commit_step(data)
        runs.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(runs)


_LOG_LINE = json.dumps(
    {
        "event": "tool completed",
        "call_id": "AbC123xYz",
        "tool": "bash",
        "session_id": "ses_1a22ca29090000pGNsdKmREoMjly",
        "message_id": "msg_1a22ca29090000pGNsdKmREoMjly",
        "span_id": "AbC123xYz",
        "parent_span_id": "msg_1a22ca29090000pGNsdKmREoMjly",
        "trace_id": "ses_1a22ca29090000pGNsdKmREoMjly",
        "level": "info",
        "timestamp": "2026-12-01T10:00:00.000000Z",
    }
)


def _log_line_us(repeat: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            secrets.redact_log_text(_LOG_LINE)
        runs.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(runs)


async def _ledger_run(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "ledger.db")
        events = [
            NewEvent("part.updated", "ses_x", {**_event(2048, False), "id": f"prt_{i}"})
            for i in range(count)
        ]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run_writer, None)
            start = time.perf_counter()
            for i in range(0, count, 10):
                await ledger.write(events[i : i + 10])
            elapsed = time.perf_counter() - start
            ledger.close_writer()
        ledger.close()
    return elapsed / count * 1e6


def main() -> None:
    quick = "--quick" in sys.argv
    repeat = 200 if quick else 2000
    rows: dict[str, dict[str, float]] = {}
    for size in (200, 2048, 50 * 1024):
        plain, leaky = _event(size, False), _event(size, True)
        secrets.refresh_secrets(environ={})
        none = _per_event_us(plain, repeat)
        secrets.refresh_secrets(environ=SECRETS)
        absent = _per_event_us(plain, repeat)
        present = _per_event_us(leaky, repeat)
        rows[f"{size} B output"] = {"none known": none, "known, absent": absent, "present": present}
    logs: dict[str, float] = {}
    for label, env in (("none known", {}), ("known, absent", SECRETS)):
        secrets.refresh_secrets(environ=env)
        logs[label] = _log_line_us(repeat * 5)
    count = 1000 if quick else 3000
    ledger: dict[str, float] = {}
    for label, env in (("none known", {}), ("known, absent", SECRETS)):
        secrets.refresh_secrets(environ=env)
        ledger[label] = statistics.median(trio.run(_ledger_run, count) for _ in range(3))
    print(f"{'per event (µs)':22} {'none known':>11} {'known, absent':>14} {'present':>9}")
    for name, row in rows.items():
        print(
            f"{name:22} {row['none known']:11.2f} {row['known, absent']:14.2f} "
            f"{row['present']:9.2f}"
        )
    print(
        f"{'ledger write, 2 KB':22} {ledger['none known']:11.1f} "
        f"{ledger['known, absent']:14.1f} {'':>9}"
    )
    print(f"{'log line, 354 B':22} {logs['none known']:11.2f} {logs['known, absent']:14.2f}")
    out = ROOT / "benchmarks" / "results" / "redaction.json"
    out.parent.mkdir(exist_ok=True)
    figures = {"in_memory_us": rows, "ledger_us": ledger, "log_line_us": logs}
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

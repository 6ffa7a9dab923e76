"""Crash points (issue 5): SIGKILL a real daemon at random moments, restart it, check recovery.

Run from the repository root::

    python benchmarks/crashpoints.py              # 50 runs, seed 5
    python benchmarks/crashpoints.py --runs 200 --seed 7

Each run starts ``harness serve`` on a fresh ``$HARNESS_HOME``, creates one session whose
scripted model (small delays, streamed in chunks) makes four ``bash`` calls over two
prompts — each call appends its own line to a counter file, one also sleeps 300 ms, each
reply comes after 80 ms — and queues both prompts at once. After a random delay (uniform
over ``--window``: about the time an uninterrupted run takes) the daemon gets SIGKILL; a
new daemon starts on the same home and the run waits (deadline 20 s) for the ledger to
show both turns finished. Then it checks:

* the session finished: both prompts have a ``turn.finished``, no claimed turn, no queued
  input, the session is ``idle``;
* each completed bash call ran exactly once: its line is in the counter exactly once, and
  the counter has no line twice; a call cut by the kill (``interrupted``) may have run 0
  or 1 times, never 2 — how many of those ran is reported;
* no user message lost or duplicated: exactly one non-synthetic user message per prompt;
* event seqs strictly increasing across the restart: the ledger's event log read in
  insertion order has strictly increasing seqs, and every event the second daemon wrote
  has a seq above the last one the killed daemon committed.

It prints ``N/N recovered``, the wall time, and how the kills fell (before the first
step, mid-stream, mid-tool, after the end).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import apsw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client import Client  # noqa: E402

DELAY = 0.08  # seconds before each model reply
PROMPTS = ("count the first three", "count one more")


def script(counter: Path) -> list[dict[str, Any]]:
    def bash(line: str, extra: str = "") -> dict[str, Any]:
        command = f"echo {line} >> {counter}{extra}"
        return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}], "delay": DELAY}

    return [
        bash("call-1"),
        bash("call-2", " && sleep 0.3"),
        {**bash("call-3"), "text": "third call", "chunks": 4, "chunk_delay": 0.03},
        {"text": "three lines written", "chunks": 5, "chunk_delay": 0.03, "delay": DELAY},
        bash("call-4"),
        {"text": "four lines written", "delay": DELAY},
    ]


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve"], stderr=out, env=env, cwd=ROOT
        )
    client = Client(Path(env["HARNESS_SOCKET"]))
    deadline = time.monotonic() + 15
    while not client.alive():
        if process.poll() is not None or time.monotonic() > deadline:
            raise Failure(f"the daemon did not start: {log.read_text()[-2000:]}")
        time.sleep(0.01)
    return process


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(5000)
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def where_killed(db: Path) -> str:
    """What the killed daemon was doing, read from the ledger it left."""
    if not db.exists() or not query(db, "SELECT 1 FROM turns"):
        done = db.exists() and not query(db, "SELECT 1 FROM inbox")
        return "after the end" if done else "before a turn"
    if query(db, "SELECT 1 FROM parts WHERE type = 'tool' AND status = 'running'"):
        return "mid-tool"
    unfinished = "SELECT 1 FROM messages WHERE role = 'assistant'"
    if query(db, unfinished + " AND json_extract(data, '$.completed') IS NULL"):
        return "mid-stream"
    return "between steps"


class Failure(Exception):
    pass


def one_run(base: Path, run: int, kill_at: float) -> dict[str, Any]:
    home = base / f"run-{run}"
    project = home / "project"
    project.mkdir(parents=True)
    counter = home / "counter"
    model_file = home / "script.json"
    model_file.write_text(json.dumps(script(counter)))
    socket_dir = Path(tempfile.mkdtemp(prefix="hcp", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["HARNESS_HOME"] = str(home)
    env["HARNESS_SOCKET"] = str(socket_dir / "h.sock")
    db = home / "ledger.db"
    log = home / "daemon.log"
    try:
        daemon = start(env, log)
        try:
            client = Client(Path(env["HARNESS_SOCKET"]))
            session = client.create_session(
                directory=str(project),
                model=f"scripted:{model_file}",
                permission=[{"permission": "bash", "pattern": "*", "action": "allow"}],
            )["id"]
            prompts = [client.prompt(session, text) for text in PROMPTS]
            time.sleep(kill_at)
        finally:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait()
        phase = where_killed(db)
        last_seq = query(db, "SELECT max(seq) FROM events")[0][0]
        daemon = start(env, log)
        try:
            deadline = time.monotonic() + 20
            while True:
                finished = {
                    json.loads(data)["message_id"]: json.loads(data)
                    for (data,) in query(db, "SELECT data FROM events WHERE type = 'turn.finished'")
                }
                busy = query(db, "SELECT 1 FROM turns UNION ALL SELECT 1 FROM inbox")
                status = query(db, "SELECT status FROM sessions WHERE id = ?", session)
                if all(p in finished for p in prompts) and not busy and status == [("idle",)]:
                    break
                if time.monotonic() > deadline:
                    raise Failure(f"not finished after 20 s (killed {phase}): {status}")
                time.sleep(0.02)
        finally:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait()
        return check(db, counter, session, prompts, finished, last_seq, phase)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def check(
    db: Path,
    counter: Path,
    session: str,
    prompts: list[str],
    finished: dict[str, Any],
    last_seq: int | None,
    phase: str,
) -> dict[str, Any]:
    answers = [finished[p]["reason"] for p in prompts]
    if answers != ["answered", "answered"]:
        raise Failure(f"turns ended {answers} (killed {phase}): {finished}")
    written = counter.read_text().splitlines() if counter.exists() else []
    repeated = [line for line, n in Counter(written).items() if n > 1]
    if repeated:
        raise Failure(f"a call ran twice: {repeated} (killed {phase})")
    completed, interrupted = [], []
    for (data,) in query(
        db, "SELECT data FROM parts WHERE session_id = ? AND type = 'tool' ORDER BY id", session
    ):
        part = json.loads(data)
        line = part["state"]["input"]["command"].split()[1]
        status = part["state"]["status"]
        if status == "completed":
            completed.append(line)
        elif status == "error" and "interrupted" in part["state"]["error"]:
            interrupted.append(line)
        else:
            raise Failure(f"a tool part left {status}: {part['state']} (killed {phase})")
    missing = [line for line in completed if line not in written]
    if missing:
        raise Failure(f"completed calls with no line: {missing} (killed {phase})")
    unexplained = set(written) - set(completed) - set(interrupted)
    if unexplained:
        raise Failure(f"lines from no recorded call: {unexplained} (killed {phase})")
    users = [
        json.loads(data)
        for (data,) in query(
            db,
            "SELECT p.data FROM messages m JOIN parts p ON p.message_id = m.id"
            " WHERE m.session_id = ? AND m.role = 'user' AND p.type = 'text'"
            " AND json_extract(m.data, '$.synthetic') = 0 ORDER BY m.created_seq",
            session,
        )
    ]
    if [u["text"] for u in users] != list(PROMPTS):
        raise Failure(f"user messages {[u['text'] for u in users]} (killed {phase})")
    seqs = [row[0] for row in query(db, "SELECT seq FROM events ORDER BY rowid")]
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        raise Failure("event seqs not strictly increasing")
    after = [s for s in seqs if last_seq is not None and s > last_seq]
    if last_seq is not None and not after and phase != "after the end":
        raise Failure("the restarted daemon wrote no event")
    return {
        "phase": phase,
        "completed": len(completed),
        "interrupted": len(interrupted),
        "interrupted_ran": sum(1 for line in interrupted if line in written),
        "notes": len(
            query(db, "SELECT 1 FROM messages WHERE json_extract(data, '$.synthetic') = 1")
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="how many kills (default 50)")
    parser.add_argument("--seed", type=int, default=5, help="the random seed (default 5)")
    parser.add_argument("--window", type=float, default=1.2, help="kill within this many s")
    parser.add_argument("--keep", action="store_true", help="keep the homes of failed runs")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="crashpoints-"))
    started = time.monotonic()
    recovered = 0
    phases: Counter[str] = Counter()
    interrupted = interrupted_ran = notes = 0
    failures: list[str] = []
    try:
        for run in range(args.runs):
            kill_at = rng.uniform(0.0, args.window)
            try:
                result = one_run(base, run, kill_at)
            except Failure as failure:
                failures.append(f"run {run} (kill at {kill_at:.3f} s): {failure}")
                print(f"  FAIL {failures[-1]}", flush=True)
                continue
            recovered += 1
            phases[result["phase"]] += 1
            interrupted += result["interrupted"]
            interrupted_ran += result["interrupted_ran"]
            notes += result["notes"]
            if not args.keep:
                shutil.rmtree(base / f"run-{run}", ignore_errors=True)
    finally:
        if not args.keep or not failures:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"{recovered}/{args.runs} recovered in {elapsed:.1f} s (seed {args.seed})")
    print("killed: " + ", ".join(f"{n} {phase}" for phase, n in phases.most_common()))
    print(
        f"interrupted bash calls: {interrupted} (of which {interrupted_ran} had run before "
        f"the kill, {interrupted - interrupted_ran} had not); restart notes: {notes}"
    )
    results = ROOT / "benchmarks" / "results" / "crashpoints.json"
    results.write_text(
        json.dumps(
            {
                "runs": args.runs,
                "seed": args.seed,
                "recovered": recovered,
                "seconds": round(elapsed, 1),
                "killed": dict(phases),
                "interrupted_bash_calls": interrupted,
                "interrupted_that_had_run": interrupted_ran,
                "restart_notes": notes,
                "failures": failures,
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if recovered == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

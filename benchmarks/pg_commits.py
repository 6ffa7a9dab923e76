"""The writer's commit on the PostgreSQL ledger, alone, before/after (issue 18).

One fresh child process per round and tree: a ``PostgresLedger`` (no HTTP, no model) on
a fresh schema, ``--writers`` tasks each writing ``--commits`` fenced writes in a row,
each awaited (a session's title, as a step's writes are fenced upserts); with several
writers, their writes share commits (group commit), as a loaded daemon's steps do.
Reported: the writes' latency (p50/p99), the process's CPU per commit (``getrusage``:
every thread), the writer's own PostgreSQL backend's CPU per commit (its /proc entry:
no other cluster or connection counts), and the round trips a commit made (the
writer connection's libpq trace). Trees take turns (``--base``: the Python of another
checkout); the best (least) of the rounds is reported besides each round::

    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/pg_commits.py \\
        --base ../base/.venv/bin/python --rounds 3 --writers 1 --commits 500

Run from a directory with no ``harness/`` in it when ``--base`` is given, so each
Python imports its own checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from proc_cpu import cpu_seconds

_BEGINS = '\tQuery\t "BEGIN'


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def child(url: str, writers: int, commits: int, shared: str | None) -> None:
    """In this process: the run; its figures printed as one JSON line."""
    import psycopg
    import trio
    from psycopg.pq import Trace

    from harness.messages.events import NewEvent
    from harness.messages.model import Session
    from harness.storage.postgres import PostgresLedger

    schema = shared or f"bench_{uuid.uuid4().hex[:10]}"
    if shared is None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in url else "?"
    dsn = f"{url}{separator}options=-csearch_path%3D{schema}"

    def titled(session_id: str, title: str) -> NewEvent:
        now = time.time()
        session = Session(id=session_id, directory="/tmp", model="scripted:x", created=now,
                          updated=now, title=title)  # fmt: skip
        return NewEvent.of("session.updated" if title else "session.created", session_id, session)

    figures: dict[str, float] = {}

    async def run() -> None:
        ledger = PostgresLedger(dsn, post_delay=0.002)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(ledger.run_writer, None)
                ids = [f"ses_{os.getpid()}_{index}" for index in range(writers)]
                await ledger.write([titled(session_id, "") for session_id in ids])
                epochs = {session_id: await ledger.claim(session_id) for session_id in ids}
                latencies: list[float] = []

                async def writer(session_id: str) -> None:
                    fence = (session_id, epochs[session_id])
                    for index in range(commits):
                        started = time.perf_counter()
                        await ledger.write([titled(session_id, f"t{index}")], fence=fence)  # type: ignore[arg-type]
                        latencies.append(time.perf_counter() - started)

                backend = ledger._write.pgconn.backend_pid
                ledger._write.pgconn.trace(trace.fileno())
                ledger._write.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
                before = psycopg.connect(dsn, autocommit=True)
                seq_before = before.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
                cpu0, pg0, wall0 = cpu_self(), cpu_seconds(backend), time.perf_counter()
                async with trio.open_nursery() as inner:
                    for session_id in ids:
                        inner.start_soon(writer, session_id)
                wall = time.perf_counter() - wall0
                cpu, pg = cpu_self() - cpu0, cpu_seconds(backend) - pg0
                ledger._write.pgconn.untrace()
                trace.seek(0)
                lines = trace.readlines()
                trips = sum(1 for line in lines if line.startswith("B") and "ReadyForQuery" in line)
                # Each commit's first (or only) query begins its transaction.
                made = sum(1 for line in lines if line.startswith("F") and _BEGINS in line)
                seq_after = before.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
                before.close()
                writes = writers * commits
                events = int(seq_after[0]) - int(seq_before[0])  # type: ignore[index]
                figures.update(
                    writes=writes,
                    events=events,
                    wall_s=round(wall, 3),
                    latency_ms_p50=round(percentile(latencies, 0.5) * 1000, 3),
                    latency_ms_p99=round(percentile(latencies, 0.99) * 1000, 3),
                    commits=made,
                    round_trips_per_commit=round(trips / max(made, 1), 3),
                    cpu_ms_per_commit=round(cpu / max(made, 1) * 1000, 4),
                    pg_backend_cpu_ms_per_commit=round(pg / max(made, 1) * 1000, 4),
                    cpu_ms_per_write=round(cpu / writes * 1000, 4),
                    pg_backend_cpu_ms_per_write=round(pg / writes * 1000, 4),
                )
                ledger.close_writer()
        finally:
            ledger.close()

    try:
        with tempfile.TemporaryFile("w+") as trace:
            trio.run(run)
    finally:
        if shared is None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(json.dumps(figures), flush=True)


def run_round(python: str, args: argparse.Namespace) -> dict[str, float]:
    """One round of one tree: its children, at once on one schema if several (the
    schema made first, so that they migrate it once); their figures' mean."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}" if args.processes > 1 else None
    if schema is not None:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    command = [python, str(Path(__file__).resolve()), "--child", "--url", args.url,
               "--writers", str(args.writers), "--commits", str(args.commits)]  # fmt: skip
    if schema is not None:
        command += ["--schema", schema]
    env = dict(os.environ, HARNESS_LOG_LEVEL="warning")
    env.pop("PYTHONPATH", None)
    try:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        children = [
            subprocess.Popen(command, env=env, text=True, **pipes)  # type: ignore[call-overload]
            for _ in range(args.processes)
        ]
        results = []
        for process in children:
            out, err = process.communicate()
            printed = [line for line in out.splitlines() if line.startswith("{")]
            if not printed:
                sys.exit(f"{python}: {err[-2000:]}")
            results.append(json.loads(printed[-1]))
    finally:
        if schema is not None:
            with psycopg.connect(args.url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return {key: round(sum(r[key] for r in results) / len(results), 4) for key in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("HARNESS_TEST_POSTGRES"))
    parser.add_argument("--writers", type=int, default=1, help="tasks writing at once")
    parser.add_argument("--commits", type=int, default=500, help="awaited writes per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--processes", type=int, default=1,
        help="daemons writing at once on one schema (their append lock shared): the mean",
    )
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--base", help="the Python of another checkout, run interleaved")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.url:
        sys.exit("give --url or HARNESS_TEST_POSTGRES")
    if args.child:
        child(args.url, args.writers, args.commits, args.schema)
        return
    trees = {"this": sys.executable}
    if args.base:
        trees["base"] = args.base
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, python in trees.items():
            figures = run_round(python, args)
            print(json.dumps({"tree": name, "load": os.getloadavg()[0], **figures}), flush=True)
            kept = best.setdefault(name, dict(figures))
            for key, value in figures.items():
                kept[key] = min(kept[key], value)
    for name, figures in best.items():
        print(json.dumps({"tree": name, "best": figures}))


if __name__ == "__main__":
    main()

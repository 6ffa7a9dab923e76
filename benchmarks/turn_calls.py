"""A turn's fixed work, counted rather than timed (issue 18, turn start).

CPU time on a shared machine moves by more than a turn's start costs; these counts do
not. One session at a time, ``--turns`` turns of ``--steps`` steps of a scripted model
after a warm one, each in a new session (as a daemon's turns mostly are: its actors let go when
idle): Python calls on the event loop's thread (cProfile's count), jobs handed to worker
threads (commits, reads, discovery), and the ledger's transactions, per turn::

    python benchmarks/turn_calls.py                       # SQLite
    python benchmarks/turn_calls.py --url postgresql://…  # a fresh schema there
    /other/checkout/.venv/bin/python benchmarks/turn_calls.py   # another tree's harness

Run from a directory with no ``harness/`` in it to count another checkout's code. A
turn's fixed work is the one-step figure less a step's (the difference to ``--steps 3``,
halved); the counts move a little with how the writer groups commits.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="a PostgreSQL database (a schema is made and dropped)")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--steps", type=int, default=1, help="steps a turn: reads of a small file, then a text"
    )
    args = parser.parse_args()
    schema = f"turn_calls_{uuid.uuid4().hex[:10]}"
    dsn: str | None = None
    if args.url:
        import psycopg

        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        joiner = "&" if "?" in args.url else "?"
        dsn = f"{args.url}{joiner}options=-csearch_path%3D{schema}"
    try:
        print(json.dumps(count(dsn, args.turns, args.steps)))
    finally:
        if args.url:
            with psycopg.connect(args.url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def count(dsn: str | None, turns: int, steps: int) -> dict[str, float]:
    import trio

    from harness.config import Config
    from harness.runtime import open_harness

    base = Path(tempfile.mkdtemp(prefix="harness-turn-calls-"))
    project = base / "project"
    project.mkdir()
    (project / "f.txt").write_text("a small file\n")
    reads = [{"tool_calls": [{"name": "read", "arguments": {"path": "f.txt"}}]}] * (steps - 1)
    (base / "model.json").write_text(json.dumps([*reads, {"text": "done"}]))
    config = Config(
        home=base / "home",
        model=f"scripted:{base / 'model.json'}",
        ledger=dsn,
        interactive=False,
        sandbox="off",
    )
    time.sleep(2.1)  # the folders and the script older than what a look trusts (2 s)
    figures: dict[str, float] = {}

    async def run() -> None:
        async with open_harness(config) as h:
            ids = [(await h.create_session(project)).id for _ in range(turns + 1)]
            await h.run(ids[0], "warm")
            jobs, commits = [0], [0]
            real_start = trio.lowlevel.start_thread_soon

            def started(*job: Any, **options: Any) -> None:
                jobs[0] += 1
                real_start(*job, **options)

            # Both names: the ledger's hops call it through trio.lowlevel, to_thread its own.
            import trio._threads as threads

            trio.lowlevel.start_thread_soon = threads.start_thread_soon = started  # type: ignore[attr-defined]
            ledger: Any = h.ledger
            real_commit = ledger._commit

            def committed(batch: Any) -> Any:
                commits[0] += 1
                return real_commit(batch)

            ledger._commit = committed
            profile = cProfile.Profile()
            profile.enable()
            try:
                for session_id in ids[1:]:
                    await h.run(session_id, "go")
            finally:
                profile.disable()
                trio.lowlevel.start_thread_soon = threads.start_thread_soon = real_start  # type: ignore[attr-defined]
            calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
            figures.update(
                python_calls_per_turn=round(calls / turns),
                worker_jobs_per_turn=round(jobs[0] / turns, 2),
                transactions_per_turn=round(commits[0] / turns, 2),
            )

    trio.run(run)
    return figures


if __name__ == "__main__":
    main()

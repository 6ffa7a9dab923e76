"""A turn's CPU on the PostgreSQL ledger, before/after on a shared machine (issue 18).

``cluster.py`` measures whole daemons behind HTTP, with the prompting client on the
same two cores, and its CPU figures swing with the load. This runs the harness in one
fresh child process per round (no HTTP, no client): ``--sessions`` sessions on a fresh
schema, all prompted at once, each turn ``--steps`` steps of a scripted model (``read``
of a small file, then a text), waiting ``--latency`` seconds a step; and reports the
process's CPU (``getrusage``: every thread, the ledger's writer and tail included) per
turn and per step, the event loop thread's share, and PostgreSQL's own (every
``postgres`` process on the machine, so other clusters count too), from the first prompt
to the last ``turn.finished``; and the ledger's reads and commits per turn, counted. Trees
take turns (``--base`` names the Python of another checkout), and the best (least) of
the rounds is reported besides each round, since interference only ever adds CPU::

    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/pg_turns.py \\
        --base ../base/.venv/bin/python --rounds 3 --sessions 200 --steps 1
    python benchmarks/pg_turns.py --tree old=.venv/bin/python:/tmp/checkout-of-old ...

Turn CPU, from the same rounds: ``--steps 1`` is almost all fixed cost (prompt, claim,
turn start and end, release); the difference to ``--steps N`` over N − 1 is a step's.
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
from typing import Any

from proc_cpu import postgres_cpu


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(url: str, sessions: int, steps: int, latency: float) -> None:
    """In this process: the run; its figures printed as one JSON line."""
    import psycopg
    import trio

    from harness.config import Config
    from harness.runtime import open_harness

    base = Path(tempfile.mkdtemp(prefix="harness-pgturns-"))
    project = base / "project"
    project.mkdir()
    for index in range(3):
        (project / f"f{index}.txt").write_text(f"file {index}\n")
    script = [
        {"tool_calls": [{"name": "read", "arguments": {"path": f"f{i % 3}.txt"}}],
         "delay": latency}
        for i in range(steps - 1)
    ]  # fmt: skip
    script.append({"text": "done", "delay": latency})
    (base / "model.json").write_text(json.dumps(script))
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    dsn: str | None = None  # --url sqlite: the SQLite ledger, the same run beside it
    if url != "sqlite":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        joiner = "&" if "?" in url else "?"
        dsn = f"{url}{joiner}options=-csearch_path%3D{schema}"
    config = Config(
        home=base / "home",
        model=f"scripted:{base / 'model.json'}",
        ledger=dsn,
        sandbox="off",
        interactive=False,
    )
    figures: dict[str, Any] = {}

    async def run() -> None:
        async with open_harness(config) as h:
            ids = [(await h.create_session(project)).id for _ in range(sessions)]
            counts = {"reads": 0, "commits": 0}
            ledger: Any = h.ledger

            def counted(name: str, key: str) -> None:
                # Wrapped on the instance, if this tree has the method (a base may not).
                method = getattr(ledger, name, None)
                if method is None:
                    return
                if name.endswith("_async"):

                    async def wrapper_async(*args: Any) -> Any:
                        counts[key] += 1
                        return await method(*args)

                    setattr(ledger, name, wrapper_async)
                else:

                    def wrapper(*args: Any) -> Any:
                        counts[key] += 1
                        return method(*args)

                    setattr(ledger, name, wrapper)

            counted("_rows", "reads")
            if getattr(ledger, "driven_reads", False):
                counted("_rows_async", "reads")  # else they go through ``_rows``
            counted("_commit", "commits")
            async with h.subscribe() as events:
                cpu, pg, wall = cpu_self(), postgres_cpu(), time.perf_counter()
                loop_cpu = time.thread_time()
                for index, session_id in enumerate(ids):
                    await h.prompt(session_id, f"go {index}")
                finished = 0
                async for event in events:
                    if event.type == "turn.finished":
                        finished += 1
                        if finished == sessions:
                            break
                loop_cpu = time.thread_time() - loop_cpu
                cpu, pg = cpu_self() - cpu, postgres_cpu() - pg
                wall = time.perf_counter() - wall
            figures.update(
                cpu_ms_per_turn=round(cpu * 1000 / sessions, 2),
                cpu_ms_per_step=round(cpu * 1000 / (sessions * steps), 2),
                loop_thread_ms_per_turn=round(loop_cpu * 1000 / sessions, 2),
                # The ledger's reads (PostgreSQL's async ones do not go through
                # ``_rows``) and the writer's transactions.
                reads_per_turn=round(counts["reads"] / sessions, 2),
                commits_per_turn=round(counts["commits"] / sessions, 2),
                postgres_ms_per_turn=round(pg * 1000 / sessions, 2),
                wall_s=round(wall, 2),
            )
            print(json.dumps(figures), flush=True)  # before closing, which may fail

    try:
        trio.run(run)
    finally:
        if dsn is not None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--url",
        default=os.environ.get("HARNESS_TEST_POSTGRES"),
        help="the database; 'sqlite' for the SQLite ledger, to compare",
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", help="the Python of another checkout, run interleaved")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PYTHON[:PYTHONPATH]",
        help="another tree to run interleaved: its Python, and a source tree put first",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.url:
        sys.exit("give --url or HARNESS_TEST_POSTGRES")
    if args.child:
        child(args.url, args.sessions, args.steps, args.latency)
        return
    trees: dict[str, tuple[str, str | None]] = {"this": (sys.executable, None)}
    if args.base:
        trees["base"] = (args.base, None)
    for spec in args.tree:
        name, _, rest = spec.partition("=")
        python, _, path = rest.partition(":")
        trees[name] = (python, path or None)
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, (python, path) in trees.items():
            command = [python, str(Path(__file__).resolve()), "--child", "--url", args.url,
                       "--sessions", str(args.sessions), "--steps", str(args.steps),
                       "--latency", str(args.latency)]  # fmt: skip
            env = dict(os.environ, HARNESS_LOG_LEVEL="warning")
            env.pop("PYTHONPATH", None)
            if path:
                env["PYTHONPATH"] = path
            out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            printed = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if not printed:
                sys.exit(f"{name}: {out.stderr[-2000:]}")
            if out.returncode != 0:  # measured, then failed while closing: say so
                print(f"{name}: exit {out.returncode}: {out.stderr.strip().splitlines()[-1]}")
            figures = json.loads(printed[-1])
            print(json.dumps({"tree": name, "load": os.getloadavg()[0], **figures}), flush=True)
            kept = best.setdefault(name, dict(figures))
            for key, value in figures.items():
                kept[key] = min(kept[key], value)
    for name, figures in best.items():
        print(json.dumps({"tree": name, "best": figures}))


if __name__ == "__main__":
    main()

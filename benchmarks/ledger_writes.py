"""The ledger's writes alone: a real step's batches, replayed into a fresh SQLite ledger.

A scripted 20-step `read` turn is run once (``loop.py``'s fixtures) with the writer's
commits recorded; their batches are then committed again, many times over, through the
writer's own ``_run_commit`` in a Trio loop (its worker-thread round trip included where
the tree makes one), the ids made new each time so that every upsert inserts as in a
run. Per step of the turn: the CPU of the whole process (the checkpoints' threads
included), the SQL statements run and the pages each commit appends to the WAL (counted
in a pass of their own, untimed)::

    python benchmarks/ledger_writes.py
    python benchmarks/ledger_writes.py --base ../base/.venv/bin/python --rounds 6

``--base`` names the Python of another checkout, run alternately with this one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loop  # noqa: E402  (the fixtures of the loop benchmark)

STEPS = 20
# One recorded batch: its requests, each a list of (type, session_id, data).
Batch = list[list[tuple[str, str, dict[str, Any]]]]


def record_turn(base: Path) -> list[Batch]:
    """The batches the writer commits during the second of two scripted turns."""
    import trio

    from harness.config import Config
    from harness.runtime import open_harness
    from harness.storage.ledger import Ledger

    os.environ["HARNESS_HOME"] = str(base / "home")
    project = loop.make_project(base)
    script = loop.make_script(base, STEPS)
    recorded: list[Batch] = []
    recording = [False]
    commit = Ledger._commit

    def record(self: Ledger, batch: list[Any]) -> Any:
        if recording[0]:
            # As JSON: the data are never changed later, but a copy is what is replayed.
            recorded.append(
                [[(e.type, e.session_id, json.loads(json.dumps(e.data))) for e in r.events]
                 for r in batch]
            )  # fmt: skip
        return commit(self, batch)

    Ledger._commit = record  # type: ignore[method-assign]
    config = Config(
        home=base / "home",
        model=f"scripted:{script}",
        interactive=False,
        model_limits={"scripted": (10_000_000, 4_096)},
    )

    async def main() -> None:
        async with open_harness(config) as h:
            for turn in range(2):
                recording[0] = turn == 1
                session = await h.create_session(project)
                await h.run(session.id, "read the files, then answer")

    trio.run(main)
    Ledger._commit = commit  # type: ignore[method-assign]
    return recorded


def _fresh(batches: list[Batch], rep: int) -> list[list[Any]]:
    """The batches as writes, with the message and part ids of repetition ``rep``."""
    from harness.messages.events import NewEvent
    from harness.messages.mailbox import WriteEvents

    out = []
    for batch in batches:
        requests = []
        for request in batch:
            events = []
            for kind, session_id, data in request:
                if kind.startswith(("message.", "part.")):
                    data = {**data, "id": f"{data['id']}{rep}"}
                events.append(NewEvent(kind, session_id, data))  # type: ignore[arg-type]
            requests.append(WriteEvents(events))
        out.append(requests)
    return out


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def replay_child(reps: int) -> None:
    """In this process: record a turn, then replay it; print the figures as JSON."""
    import apsw
    import trio

    from harness.storage.ledger import Ledger

    base = Path(tempfile.mkdtemp(prefix="harness-writes-"))
    batches = record_turn(base)
    events = sum(len(request) for batch in batches for request in batch)

    # Counted, untimed: statements, and WAL pages a commit (from an empty WAL).
    counted = Ledger(base / "counted.db")
    statements = [0]

    def trace(cursor: Any, sql: str, bindings: Any) -> bool:
        statements[0] += 1
        return True

    for writes in _fresh(batches, 0):
        counted._commit(writes)
    counted._write.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
    counted._write.exec_trace = trace
    for writes in _fresh(batches, 1):
        counted._commit(writes)
    counted._write.exec_trace = None
    wal = Path(f"{base / 'counted.db'}-wal").stat().st_size
    frames = (wal - 32) / (4096 + 24)
    counted.close()

    rows: list[float] = []

    async def main() -> None:
        for round_ in range(3):
            ledger = Ledger(base / f"timed{round_}.db")
            writes = [w for rep in range(reps) for w in _fresh(batches, rep)]
            start = _cpu()
            for batch in writes:
                await ledger._run_commit(batch)
            rows.append((_cpu() - start) / (reps * STEPS))
            ledger.close()

    trio.run(main)
    print(json.dumps({
        "cpu": rows,
        "statements": statements[0] / STEPS,
        "frames": frames / len(batches),
        "commits": len(batches) / STEPS,
        "events": events / STEPS,
    }))  # fmt: skip


def run_tree(python: str, reps: int) -> dict[str, Any]:
    done = subprocess.run(
        [python, __file__, "--child", str(reps)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env={k: v for k, v in os.environ.items() if k != "HARNESS_MODEL"},
    )
    if done.returncode != 0:
        raise SystemExit(f"{python}: the replay failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree")
    parser.add_argument("--reps", type=int, default=40, help="replays of the turn per timing")
    parser.add_argument("--base", help="the Python of another checkout, run alternately")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        replay_child(args.child)
        return 0
    trees = {"this tree": sys.executable}
    if args.base:
        trees = {"base": args.base, **trees}
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name, python in trees.items():
            results.setdefault(name, []).append(run_tree(python, args.reps))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"The ledger's writes of a 20-step read turn, per step (load {load}); CPU best / "
          f"median of {args.rounds} x 3 replays of {args.reps} turns, in µs")
    for name, runs in results.items():
        cpu = [value * 1e6 for run in runs for value in run["cpu"]]
        first = runs[0]
        print(
            f"  {name:10} CPU {min(cpu):.0f} / {statistics.median(cpu):.0f}   "
            f"statements {first['statements']:.1f}   WAL pages a commit {first['frames']:.1f}   "
            f"commits {first['commits']:.2f}   events {first['events']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a read of the event loop costs on the PostgreSQL ledger (issue 18).

Run from the repository root, with a PostgreSQL to use::

    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/pg_reads.py [--reads 3000]

A real ``PostgresLedger`` on a fresh schema, one session with an empty inbox; the same
indexed read (``inbox``, as a step's steering check made it) is made ``--reads`` times
from one Trio task, in four ways:

``sync``
    ``ledger.inbox``: psycopg's blocking execute on the loop's thread (the loop waits).
``async``
    ``ledger.inbox_async`` with no spin: the query is sent, then the task waits for
    ``trio.lowlevel.wait_readable`` on the socket (the loop runs other tasks).
``async+spin``
    the same, but an answer that comes within ``READ_SPIN_SECONDS`` is taken at once.

Each mode is run idle (nothing else on the loop: CPU per read, ``time.process_time``,
every thread) and busy (``--busy`` tasks on the loop, each doing 50 µs of work, then a
checkpoint, forever): the read's latency p50/p99, and the work the other tasks got done
per second meanwhile. Rounds are interleaved (``--repeat``). The machine is shared: the
load average is printed with each line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import trio  # noqa: E402

from harness.messages.events import NewEvent  # noqa: E402
from harness.messages.model import Session  # noqa: E402
from harness.storage.postgres import READ_SPIN_SECONDS, PostgresLedger  # noqa: E402


def with_schema(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{schema}"


async def measure(ledger: PostgresLedger, mode: str, reads: int, busy: int) -> dict[str, object]:
    ledger.read_spin = READ_SPIN_SECONDS if mode == "async+spin" else 0.0
    done = 0

    async def work() -> None:
        nonlocal done
        while True:
            end = time.perf_counter() + 50e-6
            while time.perf_counter() < end:
                pass
            done += 1
            await trio.lowlevel.checkpoint()

    latencies: list[float] = []
    async with trio.open_nursery() as nursery:
        for _ in range(busy):
            nursery.start_soon(work)
        await trio.sleep(0.05)
        done = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(reads):
            start = time.perf_counter()
            if mode == "sync":
                ledger.inbox("ses_bench")
            else:
                await ledger.inbox_async("ses_bench")
            latencies.append((time.perf_counter() - start) * 1e6)
            await trio.lowlevel.checkpoint()  # a step does other work between its reads
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        nursery.cancel_scope.cancel()
    latencies.sort()
    result: dict[str, object] = {
        "mode": mode,
        "busy": busy,
        "read_us_p50": round(latencies[len(latencies) // 2], 1),
        "read_us_p99": round(latencies[int(len(latencies) * 0.99)], 1),
        "load": os.getloadavg()[0],
    }
    if busy:
        result["other_work_per_s"] = round(done / wall)
    else:
        result["cpu_us_per_read"] = round(cpu / reads * 1e6, 1)
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("HARNESS_TEST_POSTGRES"))
    parser.add_argument("--reads", type=int, default=3000)
    parser.add_argument("--busy", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if not args.url:
        sys.exit("give --url or HARNESS_TEST_POSTGRES")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        ledger = PostgresLedger(with_schema(args.url, schema), post_delay=0)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run_writer, None)
            now = time.time()
            session = Session(id="ses_bench", directory="/tmp", model="scripted:x",
                              created=now, updated=now)  # fmt: skip
            await ledger.write([NewEvent.of("session.created", session.id, session)])
            for _ in range(args.repeat):
                for busy in (0, args.busy):
                    for mode in ("sync", "async", "async+spin"):
                        print(json.dumps(await measure(ledger, mode, args.reads, busy)))
            ledger.close_writer()
        ledger.close()
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    trio.run(main)

"""What acting on a session through a daemon that does not run it costs (issue 18).

Run from the repository root::

    python benchmarks/cluster_live.py feed [--deltas 200000]          # no database needed
    HARNESS_TREE=../other-checkout python benchmarks/cluster_live.py feed     # the base tree's feed
    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/cluster_live.py relay
    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/cluster_live.py cancel [--rounds 5]

feed
    CPU (``time.process_time``: every thread of the process) per delta through a real
    ``EventFeed`` with one local subscriber, as a turn's recorder publishes them (one
    ``Publish`` per delta). ``none``: no relay (SQLite, or a tree without this change);
    ``idle``: a shared ledger's relay that nobody watches; ``elsewhere``: another daemon
    watches some other session. The difference ``idle − none`` is what the relay costs
    a delta when no other daemon has a subscriber. This mode also runs on a tree without
    pg_live.py (it then measures ``none`` only), for a before/after comparison.
relay
    Two real ``PostgresLedger`` objects on a fresh schema play two daemons: B watches the
    session, A's feed publishes deltas (``--rate`` per second, 40 characters each). CPU of
    the process per delta relayed (both ends and PostgreSQL round trips from this side),
    notifications sent, and the delay from A's publish to B's subscriber (p50/p99).
cancel
    Two real ``harness serve --ledger`` daemons; a turn runs a long ``bash``; it is
    cancelled through the daemon that runs it and through the other one, ``--rounds``
    times each, interleaved. Latency: the cancel call → ``turn.finished`` heard on the
    SSE stream of the daemon the call went to.

The machine is shared: say the load average with each figure (printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

# HARNESS_TREE: measure another checkout's harness (the base tree, for before/after).
ROOT = Path(os.environ.get("HARNESS_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import trio  # noqa: E402

from harness.actors.event_feed import EventFeed, subscription  # noqa: E402
from harness.messages.events import Event  # noqa: E402
from harness.messages.mailbox import Publish  # noqa: E402


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _delta(session_id: str, index: int) -> Event:
    text = f"word{index % 97:02d} " * 5  # 40 characters, about a 50 ms gathering
    return Event(
        None, time.time(), "part.delta", session_id,
        {"part_id": "prt_bench", "field": "text", "delta": text},
    )  # fmt: skip


class _Others:
    """A relay as the feed sees it (its ``others`` and ``offer``), without a database."""

    def __init__(self, others: dict[str, set[str]]) -> None:
        self.others = others
        self.offered = 0

    def offer(self, event: Event, lineage: Any) -> None:
        channels = set(self.others.get("*", ()))
        for session_id in lineage:
            channels.update(self.others.get(session_id, ()))
        if channels:
            self.offered += 1


async def _feed_run(mode: str, deltas: int) -> float:
    feed = EventFeed()
    if mode != "none":
        others = {} if mode == "idle" else {"ses_someone_else": {"harness_live_x"}}
        feed.relay = _Others(others)  # type: ignore[attr-defined]
    events = [_delta("ses_bench", index) for index in range(1000)]
    async with trio.open_nursery() as nursery:
        await nursery.start(feed.run)
        async with subscription(feed.mailbox, "ses_bench", buffer=deltas + 10) as heard:
            start = time.process_time()
            for index in range(deltas):
                await feed.mailbox.send(Publish((events[index % 1000],)))
                if index % 500 == 499:
                    while True:  # drain, as a reader would
                        try:
                            heard.receive_nowait()
                        except trio.WouldBlock:
                            break
            await trio.lowlevel.checkpoint()
            spent = time.process_time() - start
        feed.mailbox.close()
    return spent / deltas


def feed_benchmark(args: argparse.Namespace) -> None:
    has_relay = hasattr(EventFeed(), "relay")
    modes = ["none", "idle", "elsewhere"] if has_relay else ["none"]
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(args.repeat):  # interleaved: the load changes under us
        for mode in modes:
            results[mode].append(trio.run(_feed_run, mode, args.deltas))
    print(f"feed: {args.deltas} deltas x {args.repeat}, load {_load()}, tree {ROOT}")
    for mode, values in results.items():
        best, median = min(values), statistics.median(values)
        print(f"  {mode:9} CPU per delta: best {best * 1e6:.2f} µs, median {median * 1e6:.2f} µs")


async def _relay_run(url: str, count: int, rate: float, watch: bool) -> dict[str, float]:
    from test_pg_live import _until, daemon

    delays: list[float] = []
    async with daemon(url) as (a, feed_a), daemon(url) as (b, feed_b):
        assert a.live is not None and b.live is not None
        async with (
            subscription(feed_b.mailbox, "ses_bench", buffer=count + 10) as heard,
            b.live.watching("ses_bench") if watch else contextlib.nullcontext(),
        ):
            # The subscriber listens, and A knows it (or, for the baseline, nobody does).
            await _until(lambda: ("ses_bench" in a.live.others) == watch, "the watch")  # type: ignore[union-attr]

            async def reader() -> None:
                for _ in range(count if watch else 0):
                    event = await heard.receive()
                    delays.append(time.time() - event.ts)

            start_cpu, start = time.process_time(), time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                for index in range(count):
                    await feed_a.mailbox.send(Publish((_delta("ses_bench", index),)))
                    await trio.sleep(1 / rate)
            cpu, wall = time.process_time() - start_cpu, time.monotonic() - start
            sent = a.live.sent
    delays.sort()
    if not delays:
        delays = [0.0]
    return {
        "cpu_per_delta_us": cpu / count * 1e6,
        "notifications": sent,
        "p50_ms": delays[len(delays) // 2] * 1e3,
        "p99_ms": delays[int(len(delays) * 0.99)] * 1e3,
        "wall_s": wall,
    }


def _schema(url: str) -> tuple[str, str]:
    import psycopg
    from conftest import with_schema

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema, with_schema(url, schema)


def _drop(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def relay_benchmark(args: argparse.Namespace) -> None:
    schema, url = _schema(args.url)
    try:
        runs = [
            (watch, trio.run(_relay_run, url, args.deltas, args.rate, watch))
            for _ in range(args.repeat)
            for watch in (False, True)
        ]  # interleaved
    finally:
        _drop(args.url, schema)
    print(f"relay: {args.deltas} deltas at {args.rate}/s x {args.repeat}, load {_load()}")
    for watch in (False, True):
        found = [r for w, r in runs if w == watch]
        cpu = statistics.median(r["cpu_per_delta_us"] for r in found)
        what = "B watches: relayed" if watch else "nobody watches (baseline)"
        print(
            f"  {what:26} CPU per delta, both daemons in this process: {cpu:.0f} µs;"
            f" notifications {statistics.median(r['notifications'] for r in found):.0f}"
            + (
                f"; publish on A → B's subscriber p50 "
                f"{statistics.median(r['p50_ms'] for r in found):.2f} ms, p99 "
                f"{statistics.median(r['p99_ms'] for r in found):.2f} ms"
                if watch else ""
            )
        )


def cancel_benchmark(args: argparse.Namespace) -> None:
    from daemons import wait_for_daemon

    from harness.client import Client

    schema, url = _schema(args.url)
    root = Path(tempfile.mkdtemp(prefix="cancel-bench-"))
    project = root / "project"
    project.mkdir()
    config = root / "config.toml"
    config.write_text("lease_seconds = 3\n")
    model = root / "model.json"
    model.write_text(json.dumps([
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 59.5959"}}]},
        {"text": "never"},
    ]))  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    clients: list[Client] = []
    try:
        for index in range(2):
            env = dict(os.environ, HARNESS_CONFIG=str(config), HARNESS_SANDBOX="off")
            env["HARNESS_HOME"] = str(root / f"home-{index}")
            env["HARNESS_SOCKET"] = str(root / f"d{index}.sock")
            log = root / f"daemon-{index}.log"
            with log.open("ab") as out:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "harness", "serve", "--ledger", url],
                    stderr=out, env=env,
                ))  # fmt: skip
            wait_for_daemon(processes[-1], Path(env["HARNESS_SOCKET"]), log, 30)
            clients.append(Client(Path(env["HARNESS_SOCKET"])))
        allow = [{"permission": "bash", "pattern": "*", "action": "allow"}]
        timings: dict[str, list[float]] = {"holder": [], "other": []}
        for _ in range(args.rounds):
            for via in ("holder", "other"):
                session = clients[0].create_session(
                    directory=str(project), model=f"scripted:{model}", permission=allow
                )["id"]
                clients[0].prompt(session, "sleep")
                holder = _wait_holder(url, session, processes)
                client = clients[holder if via == "holder" else 1 - holder]
                stream = client.events(session)
                stream.open()
                _wait_running(client, session)
                finished = threading.Event()

                def follow(events: Any = stream, done: threading.Event = finished) -> None:
                    for event in events:
                        if event.type == "turn.finished":
                            done.set()
                            return

                reader = threading.Thread(target=follow, daemon=True)
                reader.start()
                start = time.monotonic()
                assert client.cancel(session)
                assert finished.wait(30), "the turn did not end"
                timings[via].append(time.monotonic() - start)
                stream.close()
        print(f"cancel: {args.rounds} rounds, 2 daemons, load {_load()}")
        for via, values in timings.items():
            values.sort()
            print(
                f"  through the {via:6}: cancel → turn.finished heard there: median "
                f"{statistics.median(values) * 1e3:.0f} ms, max {values[-1] * 1e3:.0f} ms"
            )
    finally:
        for process in processes:
            process.kill()
            process.wait()
        _drop(args.url, schema)


def _wait_holder(url: str, session: str, processes: list[subprocess.Popen[bytes]]) -> int:
    import psycopg

    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT owner FROM leases WHERE session_id = %s"
                " AND expires > extract(epoch FROM clock_timestamp())",
                (session,),
            ).fetchone()
            if row is not None:
                pid = int(str(row[0]).split(":")[1])
                return next(i for i, p in enumerate(processes) if p.pid == pid)
            time.sleep(0.01)
    raise RuntimeError("no daemon claimed the session")


def _wait_running(client: Any, session: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        messages = client.messages(session)
        states = [p["state"]["status"] for m in messages for p in m["parts"] if p["type"] == "tool"]
        if "running" in states:
            return
        time.sleep(0.02)
    raise RuntimeError("the bash never ran")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["feed", "relay", "cancel"])
    parser.add_argument("--url", default=os.environ.get("HARNESS_TEST_POSTGRES"))
    parser.add_argument("--deltas", type=int, default=0, help="feed: 200000; relay: 2000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.what == "feed":
        args.deltas = args.deltas or 200_000
        feed_benchmark(args)
        return
    if not args.url:
        parser.error("relay and cancel need a PostgreSQL: --url or HARNESS_TEST_POSTGRES")
    with contextlib.suppress(KeyboardInterrupt):
        if args.what == "relay":
            args.deltas = args.deltas or 2000
            relay_benchmark(args)
        else:
            cancel_benchmark(args)


if __name__ == "__main__":
    main()

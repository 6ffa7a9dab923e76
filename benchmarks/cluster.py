"""The cluster benchmark of issue 18: N daemons on one PostgreSQL ledger (DESIGN §14).

Run from the repository root, with a PostgreSQL to use (.ci/run's, or your own)::

    HARNESS_TEST_POSTGRES=postgresql://... python benchmarks/cluster.py
    python benchmarks/cluster.py --url postgresql://... --daemons 1 2 4 --sessions 1000 \\
        --latency 2 --steps 5

For each daemon count: a fresh schema, N ``harness serve --ledger`` processes, S sessions
created and prompted round-robin over the daemons; every turn is ``--steps`` steps of a
scripted model that waits ``--latency`` seconds before answering, each step a ``read`` of
a small file (three in rotation), then a final text. The prompts are sent from
``--prompters`` threads (8), round-robin over the daemons. What is measured:

steps/s
    Assistant steps committed per second of wall time, from the first prompt to the last
    turn finished; and *steady*, the same while every session is at work (from the last
    prompt answered to the first session's last step: no ramp up or down), the throughput
    that saturation means. Steady needs turns long enough to have such a window (at a
    0.02 s latency, ``--steps 100``).
step overhead
    Per step: (start of the next step − start of this one) − latency, from the steps'
    ``created`` times in the ledger: context, tool, ledger writes and scheduling.
CPU per step
    user+sys of each daemon process (/proc) over the run, divided by the steps it ran
    (each step's daemon: the lease owner when its turn ran, from ``session.leased`` and the
    leases table), and PostgreSQL's own: every ``postgres`` process's CPU over the run,
    divided by all steps.
claim latency
    ``inbox.added`` → ``turn.started`` of each prompt (durable at once, then claimed and
    taken by some daemon).
failover (with ``--failover``, for N ≥ 2)
    kill -9 of the daemon holding the most sessions mid-run → the next step start of each
    session it held, against lease_seconds + 1 s.

The machine is shared and has 2 cores: the figures are noisy; say so when quoting them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from proc_cpu import cpu_seconds, postgres_cpu  # noqa: E402

from harness.client import Client  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady_rate(
    by_session: dict[str, list[float]], prompts_done: float, killed_at: float | None
) -> float | None:
    """Steps a second while every session is at work: from the last prompt answered to
    the first session's last step, so neither the prompting's ramp (where a busy daemon
    also takes in prompts, turn starts and claims) nor the tail (sessions done, the others
    no longer contending) is in the figure. None when that window is under a second (too
    few steps a session to have one) or a daemon was killed in it.
    """
    end = min((starts[-1] for starts in by_session.values() if starts), default=0.0)
    if end - prompts_done < 1.0 or (killed_at is not None and killed_at < end):
        return None
    inside = sum(
        1 for starts in by_session.values() for at in starts if prompts_done <= at < end
    )
    return round(inside / (end - prompts_done), 1)


def with_schema(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{schema}"


def compile_daemons_harness() -> None:
    """Write the bytecode of the harness the daemons import, as an install does.

    An editable install writes it at first import, unless ``PYTHONDONTWRITEBYTECODE`` is
    set (as on these machines): then each daemon compiled, mid-run, every module it
    imports lazily (at its first prompt, tool call, answer), stalling its event loop for
    the steps in flight. Measured at 1,000 sessions over 2 daemons: step p99 29–30 ms
    uncompiled against 17–18 compiled, the same tree.
    """
    subprocess.run(
        [sys.executable, "-c", "import compileall, harness, pathlib;"
         " compileall.compile_dir(pathlib.Path(harness.__file__).parent, quiet=1)"],
        check=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip


def run(url: str, daemons: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = with_schema(url, schema)
    project = work / "project"
    project.mkdir(exist_ok=True)
    for index in range(3):
        (project / f"f{index}.txt").write_text(f"file {index}\n")
    steps = [
        {
            "tool_calls": [{"name": "read", "arguments": {"path": f"f{index % 3}.txt"}}],
            "delay": args.latency,
        }
        for index in range(args.steps - 1)
    ]
    steps.append({"text": "done", "delay": args.latency})
    model_file = work / "model.json"
    model_file.write_text(json.dumps(steps))
    config = work / "config.toml"
    admission = "" if args.admission is None else f"admission_seconds = {args.admission}\n"
    config.write_text(f"lease_seconds = {args.lease}\n{admission}")
    processes: list[subprocess.Popen[bytes]] = []
    clients: list[Client] = []
    sockets = Path(tempfile.mkdtemp(prefix="hc", dir="/tmp"))
    try:
        for index in range(daemons):
            env = dict(os.environ)
            env.update(
                HARNESS_HOME=str(work / f"home-{daemons}-{index}"),
                HARNESS_SOCKET=str(sockets / f"{index}.sock"),
                HARNESS_CONFIG=str(config),
                HARNESS_SANDBOX="off",
                HARNESS_LOG_LEVEL=args.log_level,
            )
            log = (work / f"daemon-{daemons}-{index}.log").open("ab")
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "harness", "serve", "--ledger", dsn],
                    stderr=log,
                    env=env,
                )
            )
            clients.append(Client(sockets / f"{index}.sock", timeout=120))
        for process, client in zip(processes, clients, strict=True):
            deadline = time.monotonic() + 30
            while not client.alive():
                assert process.poll() is None, "a daemon died at start"
                assert time.monotonic() < deadline, "a daemon never answered"
                time.sleep(0.05)
        model = f"scripted:{model_file}"
        sessions = [
            clients[i % daemons].create_session(directory=str(project), model=model)["id"]
            for i in range(args.sessions)
        ]
        cpu_before = {p.pid: cpu_seconds(p.pid) for p in processes}
        pg_before = postgres_cpu()
        start = time.time()
        # Prompted from several threads: one by one, the prompts' own round trips (each
        # durable before it is answered) paced the run, not the daemons.
        with ThreadPoolExecutor(args.prompters) as pool:
            list(
                pool.map(
                    lambda pair: clients[pair[0] % daemons].prompt(pair[1], f"go {pair[0]}"),
                    enumerate(sessions),
                )
            )
        prompted = time.time() - start
        killed_at: float | None = None
        victim_cpu = 0.0
        victim_sessions: set[str] = set()
        done, seen = 0, 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                # Only the events since the last look (seqs are committed in order): a
                # count over the whole log, five times a second, was 0.13-0.16 ms of
                # PostgreSQL's CPU a step at saturation, charged to the daemons' steps.
                finished, last = conn.execute(
                    "SELECT count(*) FILTER (WHERE type = 'turn.finished'), max(seq)"
                    " FROM events WHERE seq > %s",
                    (seen,),
                ).fetchone()  # type: ignore[misc]
                done, seen = done + finished, last or seen
                if done >= args.sessions:
                    break
                if args.failover and daemons >= 2 and killed_at is None and done >= 1:
                    rows = conn.execute(
                        "SELECT owner, session_id FROM leases"
                        " WHERE expires > extract(epoch FROM clock_timestamp())"
                    ).fetchall()
                    by_owner: dict[int, set[str]] = {}
                    for owner, session_id in rows:
                        by_owner.setdefault(int(owner.split(":")[1]), set()).add(session_id)
                    if by_owner and time.time() - start > 3 * args.latency:
                        pid, victim_sessions = max(by_owner.items(), key=lambda kv: len(kv[1]))
                        victim = next(p for p in processes if p.pid == pid)
                        victim_cpu = cpu_seconds(pid) - cpu_before.pop(pid)
                        victim.send_signal(signal.SIGKILL)
                        killed_at = time.time()
                if time.time() - start > args.timeout:
                    stuck = conn.execute(
                        "SELECT s.id, l.owner, l.epoch, l.expires -"
                        " extract(epoch FROM clock_timestamp()), i.seq FROM sessions s"
                        " LEFT JOIN leases l ON l.session_id = s.id"
                        " LEFT JOIN inbox i ON i.session_id = s.id WHERE s.id NOT IN"
                        " (SELECT session_id FROM events WHERE type = 'turn.finished')"
                    ).fetchall()
                    logs = sorted(str(path) for path in work.glob(f"daemon-{daemons}-*.log"))
                    shutil.copytree(work, Path(tempfile.mkdtemp(prefix="cluster-failed-")),
                                    dirs_exist_ok=True)  # fmt: skip
                    raise AssertionError(f"only {done} turns finished; unfinished: {stuck}; {logs}")
                time.sleep(0.2)
            wall = time.time() - start
            cpu_after = {pid: cpu_seconds(pid) for pid in cpu_before}
            pg_cpu = postgres_cpu() - pg_before
            messages = conn.execute(
                "SELECT session_id, data FROM messages WHERE role = 'assistant'"
                " ORDER BY session_id, created_seq"
            ).fetchall()
            claims = conn.execute(
                "SELECT a.ts, t.data FROM events a JOIN events t ON t.type = 'turn.started'"
                " AND t.session_id = a.session_id WHERE a.type = 'inbox.added'"
            ).fetchall()
            owners = conn.execute("SELECT owner FROM leases").fetchall()
        by_session: dict[str, list[float]] = {}
        for session_id, data in messages:
            by_session.setdefault(session_id, []).append(json.loads(data)["created"])
        overhead = [
            (later - earlier - args.latency) * 1000
            for starts in by_session.values()
            for earlier, later in itertools.pairwise(starts)
            if killed_at is None or not (earlier < killed_at < later)
        ]
        prompts_done = start + prompted
        # Split by phase: while the prompts still go in, each daemon also carries their
        # writes, claims and turn starts; after, only the steps of the turns going.
        overhead_prompting = [
            (later - earlier - args.latency) * 1000
            for starts in by_session.values()
            for earlier, later in itertools.pairwise(starts)
            if earlier < prompts_done and (killed_at is None or not (earlier < killed_at < later))
        ]
        overhead_after = [
            (later - earlier - args.latency) * 1000
            for starts in by_session.values()
            for earlier, later in itertools.pairwise(starts)
            if earlier >= prompts_done and (killed_at is None or not (earlier < killed_at < later))
        ]
        total_steps = len(messages)
        steady = steady_rate(by_session, prompts_done, killed_at)
        claim_ms = [(json.loads(data)["started"] - ts) * 1000 for ts, data in claims]
        result: dict[str, Any] = {
            "daemons": daemons,
            "sessions": args.sessions,
            "steps": total_steps,
            "wall_s": round(wall, 2),
            "prompting_s": round(prompted, 2),
            "steps_per_s": round(total_steps / wall, 1),
            "steady_steps_per_s": steady,
            "step_overhead_ms_p50": round(percentile(overhead, 0.5), 1),
            "step_overhead_ms_p99": round(percentile(overhead, 0.99), 1),
            "step_overhead_ms_p50_p99_while_prompting": [
                round(percentile(overhead_prompting, 0.5), 1),
                round(percentile(overhead_prompting, 0.99), 1),
                len(overhead_prompting),
            ],
            "step_overhead_ms_p50_p99_after_prompting": [
                round(percentile(overhead_after, 0.5), 1),
                round(percentile(overhead_after, 0.99), 1),
                len(overhead_after),
            ],
            "daemon_cpu_s": [round(cpu_after[pid] - cpu_before[pid], 2) for pid in cpu_before],
            "cpu_ms_per_step_all_daemons": round(
                (sum(cpu_after[pid] - cpu_before[pid] for pid in cpu_before) + victim_cpu)
                * 1000
                / max(total_steps, 1),
                2,
            ),
            "postgres_cpu_ms_per_step": round(pg_cpu * 1000 / max(total_steps, 1), 2),
            "claim_ms_p50": round(percentile(claim_ms, 0.5), 1),
            "claim_ms_p99": round(percentile(claim_ms, 0.99), 1),
            "lease_owners": len({row[0] for row in owners}),
        }
        if killed_at is not None:
            next_steps = []
            for session_id in victim_sessions:
                later = [t for t in by_session.get(session_id, []) if t > killed_at]
                if later:
                    next_steps.append(min(later) - killed_at)
            result["failover_s_p50"] = round(percentile(next_steps, 0.5), 2)
            result["failover_s_max"] = round(max(next_steps), 2) if next_steps else None
            result["failover_target_s"] = args.lease + 1
        return result
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("HARNESS_TEST_POSTGRES"))
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5, help="steps per turn, the text included")
    parser.add_argument("--latency", type=float, default=2.0, help="model latency per step, s")
    parser.add_argument("--lease", type=float, default=10.0, help="lease_seconds")
    parser.add_argument(
        "--prompters", type=int, default=8, help="threads sending the prompts (1: one by one)"
    )
    parser.add_argument("--failover", action="store_true", help="kill -9 one daemon mid-run")
    parser.add_argument(
        "--admission",
        type=float,
        help="admission_seconds: the longest a new turn waits for a busy daemon (default: "
        "the config's; not passed at all when omitted, so older trees run too)",
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--log-level", default="warning", help="the daemons' (kept when a run fails)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not args.url:
        parser.error("no database: pass --url or set HARNESS_TEST_POSTGRES")
    compile_daemons_harness()
    results = []
    with tempfile.TemporaryDirectory(prefix="harness-cluster-") as work:
        for count in args.daemons:
            result = run(args.url, count, args, Path(work))
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
